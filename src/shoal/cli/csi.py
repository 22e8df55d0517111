"""``shoal csi node``: the CSI node plugin that publishes a dataset's directory of the
node's shoal mount as a pod volume (same flags as ``python -m shoal.csi node``)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    from shoal.csi.__main__ import add_node_arguments

    p = sub.add_parser("csi", help="the Kubernetes CSI node plugin (a volume per dataset)")
    csub = p.add_subparsers(dest="csi_command", metavar="COMMAND", required=True)
    node = csub.add_parser("node", help="serve the CSI Identity and Node services on a socket")
    add_node_arguments(node)
    node.set_defaults(handler=cmd_node)


def cmd_node(args: argparse.Namespace) -> int:
    from shoal.csi.__main__ import run_node

    return run_node(args)

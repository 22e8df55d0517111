"""``python -m shoal.csi node``: the CSI node plugin (same flags as ``shoal csi node``)."""

from __future__ import annotations

import argparse
import logging
import sys

from shoal.config import node_name
from shoal.csi.node import DEFAULT_TARGET_ROOTS, DRIVER_NAME, NodeSettings


def add_node_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--endpoint",
        required=True,
        help="the gRPC socket, unix:///PATH (the kubelet's plugin directory)",
    )
    p.add_argument(
        "--mount-root",
        required=True,
        help="the node's shoal FUSE mount; a dataset's volume is DIR/<dataset>",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="where published volumes are recorded (default: the socket's directory)",
    )
    p.add_argument(
        "--node-id",
        default=None,
        help="this node's name, as NodeGetInfo reports it (default: SHOAL_NODE, else hostname)",
    )
    p.add_argument(
        "--allowed-target-root",
        action="append",
        default=None,
        metavar="DIR",
        help=f"target paths must lie under DIR (repeatable; default {DEFAULT_TARGET_ROOTS[0]})",
    )
    p.add_argument(
        "--driver-name", default=DRIVER_NAME, help="the CSIDriver name (default %(default)s)"
    )
    p.add_argument(
        "--topology",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a segment of NodeGetInfo's accessible topology (repeatable)",
    )
    p.add_argument(
        "--repair-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how often bind mounts are checked against the FUSE mount (default %(default)s)",
    )
    p.add_argument(
        "--fuse-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a stat in the FUSE mount slower than this: not answering (default %(default)s)",
    )
    p.add_argument("--log-level", default="info", help="debug, info, warning or error")


def run_node(args: argparse.Namespace) -> int:
    import os

    from shoal.csi.server import serve, socket_path
    from shoal.errors import InvalidArgument

    socket = socket_path(args.endpoint)
    topology = {}
    for kv in args.topology:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"--topology must be KEY=VALUE, got {kv!r}")
        topology[key] = value
    if not args.repair_interval > 0:
        raise InvalidArgument("--repair-interval must be positive")
    settings = NodeSettings(
        mount_root=args.mount_root,
        state_dir=args.state_dir or os.path.dirname(socket),
        node_id=args.node_id or node_name(),
        allowed_target_roots=tuple(args.allowed_target_root or DEFAULT_TARGET_ROOTS),
        driver_name=args.driver_name,
        topology=topology,
        fuse_timeout=args.fuse_timeout,
    )
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return serve(settings, socket, args.repair_interval)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="csi_command", metavar="COMMAND", required=True)
    node = sub.add_parser("node", help="the CSI node plugin (NodePublishVolume: a bind mount)")
    add_node_arguments(node)


def main(argv: list[str] | None = None) -> int:
    from shoal.errors import ShoalError

    p = argparse.ArgumentParser(prog="python -m shoal.csi", description="shoal's CSI plugin")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run_node(args)
    except ShoalError as exc:
        print(f"shoal csi: error: {exc.message}", file=sys.stderr)
        return 2 if exc.user_fault else 1


if __name__ == "__main__":
    sys.exit(main())

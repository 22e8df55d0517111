"""``shoal operator``: the Kubernetes operator and admission webhook (same flags as
``python -m shoal.operator``)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    from shoal.operator.__main__ import add_arguments

    p = sub.add_parser(
        "operator", help="run the Kubernetes operator (Datasets, Runtimes, DataLoads, webhook)"
    )
    add_arguments(p)
    p.set_defaults(handler=cmd_operator)


def cmd_operator(args: argparse.Namespace) -> int:
    from shoal.operator.__main__ import run

    return run(args)

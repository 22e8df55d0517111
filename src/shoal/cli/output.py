"""Printing for the CLI: JSON for machines (--json), rich tables for people."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=None, separators=(",", ":"), default=str)
    sys.stdout.write("\n")


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_edge=False, header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    Console(soft_wrap=True).print(t)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def add_master(p: Any) -> None:
    p.add_argument(
        "--master",
        metavar="URL",
        help="master URL (default: $SHOAL_MASTER, else the local cluster started by `shoal up`)",
    )


def add_json(p: Any) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")

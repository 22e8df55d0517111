"""``shoal bench``: runs the benchmark suite (``python -m shoal.bench``), which sits
above the CLI in the layer order (it starts clusters with ``shoal.cli.local``), so the
CLI hands over to it instead of importing it."""

from __future__ import annotations

import os
import sys
from typing import Any


def register(sub: Any) -> None:
    # only for the command list: `shoal bench ...` is handed over before parsing
    p = sub.add_parser(
        "bench", help="benchmark shoal against its peers and the local disk (see --help)"
    )
    p.set_defaults(handler=lambda args: run_bench([]))


def run_bench(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, "-m", "shoal.bench", *argv])

"""``shoal gateway webhdfs``: options and entry point of the webhdfs gateway."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    sub.add_parser("webhdfs", help="(not built yet)")

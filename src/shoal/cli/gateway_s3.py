"""``shoal gateway s3``: options and entry point of the s3 gateway."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    sub.add_parser("s3", help="(not built yet)")

"""``shoal gateway s3|webhdfs``: HTTP endpoints over the cache.

Each gateway's options and entry live beside it (shoal.cli.gateway_s3,
shoal.cli.gateway_webhdfs); this module only groups them under one command.
"""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    from shoal.cli import gateway_s3, gateway_webhdfs

    p = sub.add_parser("gateway", help="serve the cache over S3 or WebHDFS")
    gsub = p.add_subparsers(dest="gateway", metavar="KIND", required=True)
    gateway_s3.register(gsub)
    gateway_webhdfs.register(gsub)

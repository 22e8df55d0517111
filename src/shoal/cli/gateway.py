"""``shoal gateway s3|webhdfs``: HTTP endpoints over the cache.

Each gateway's own options and entry live beside it (shoal.cli.gateway_s3,
shoal.cli.gateway_webhdfs); this module groups them under one command and holds what
both take the same way: where to listen, TLS, who may call, where to write bodies.
"""

from __future__ import annotations

import argparse
from typing import Any

from shoal.cli.output import add_master
from shoal.errors import InvalidArgument


def register(sub: Any) -> None:
    from shoal.cli import gateway_s3, gateway_webhdfs

    p = sub.add_parser("gateway", help="serve the cache over S3 or WebHDFS")
    gsub = p.add_subparsers(dest="gateway", metavar="KIND", required=True)
    gateway_s3.register(gsub)
    gateway_webhdfs.register(gsub)


def add_serving_args(p: Any, port: int, who: str) -> None:
    """The options every gateway takes: the master, where it listens (``port`` by
    default), TLS, the credentials file (``who`` says what it holds for this gateway),
    anonymous access, writable datasets, the body spool, the URL file and logging."""
    add_master(p)
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1)")
    p.add_argument("--port", type=int, default=port, help=f"port ({port}; 0: any free port)")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate chain")
    p.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert")
    p.add_argument("--credentials", metavar="FILE", help=who)
    p.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="run without --credentials: every dataset is readable without authentication",
    )
    p.add_argument(
        "--writable",
        action="append",
        default=[],
        metavar="DATASET",
        help="accept writes to DATASET from identities that may write it "
        "(repeatable; default: every dataset is read-only)",
    )
    p.add_argument("--spool-dir", metavar="DIR", help="where write bodies are spooled ($TMPDIR)")
    p.add_argument("--url-file", metavar="FILE", help="write the URL here once listening")
    p.add_argument("--log-level", default="info", help="log level (info)")


def load_credentials(args: argparse.Namespace, kind: str) -> Any:
    """The gateway's Credentials from --credentials or --allow-anonymous (exactly one)."""
    from shoal.gateway.auth import Credentials

    if args.credentials and args.allow_anonymous:
        raise InvalidArgument(
            "--allow-anonymous is for running without --credentials; "
            "mark datasets public in the credentials file instead"
        )
    if args.credentials:
        return Credentials.load(args.credentials)
    if args.allow_anonymous:
        return Credentials.open_access()
    raise InvalidArgument(
        f"the {kind} gateway needs --credentials FILE (or --allow-anonymous to serve "
        "every dataset without authentication)"
    )

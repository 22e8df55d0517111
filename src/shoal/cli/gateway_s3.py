"""``shoal gateway s3``: options and entry point of the s3 gateway.

Prints "shoal s3 gateway listening on URL" as its first line of output once bound
(``--port 0`` picks a free port), then serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
from typing import Any

from shoal.cli.output import add_master
from shoal.errors import InvalidArgument

BANNER = "shoal s3 gateway listening on {url}"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "s3",
        help="serve datasets over an S3-compatible endpoint (bucket = dataset)",
        description="An S3-compatible endpoint over the cache: bucket = dataset, "
        "key = <mount>/<path>. Reads by default; writes (checkpoints) pass through to "
        "under storage for the datasets named with --writable.",
    )
    add_master(p)
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1)")
    p.add_argument("--port", type=int, default=9000, help="port (9000; 0: any free port)")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate chain")
    p.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert")
    p.add_argument(
        "--credentials",
        metavar="FILE",
        help="access keys, their roles and datasets, and public datasets (see docs/gateways.md)",
    )
    p.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="run without --credentials: every dataset is readable without a signature",
    )
    p.add_argument(
        "--writable",
        action="append",
        default=[],
        metavar="DATASET",
        help="accept writes (PutObject, multipart, DeleteObject) to DATASET from "
        "identities that may write it (repeatable; default: every dataset is read-only)",
    )
    p.add_argument("--region", default="us-east-1", help="region the gateway reports")
    p.add_argument(
        "--domain",
        metavar="NAME",
        help="also accept virtual-host style requests to BUCKET.NAME",
    )
    p.add_argument("--spool-dir", metavar="DIR", help="where write bodies are spooled ($TMPDIR)")
    p.add_argument("--url-file", metavar="FILE", help="write the URL here once listening")
    p.add_argument("--log-level", default="info", help="log level (info)")
    p.set_defaults(handler=cmd_gateway_s3)


def load_credentials(args: argparse.Namespace) -> Any:
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
        "the s3 gateway needs --credentials FILE (or --allow-anonymous to serve every "
        "dataset without authentication)"
    )


def cmd_gateway_s3(args: argparse.Namespace) -> int:
    import uvloop

    from shoal.cli.common import master_url
    from shoal.cli.main import setup_server_logging
    from shoal.client.aio import AsyncClient
    from shoal.config import ClientSettings
    from shoal.gateway.s3 import S3Gateway
    from shoal.gateway.server import run_http, tls_context, write_url

    if not 0 <= args.port <= 65535:
        raise InvalidArgument(f"invalid --port {args.port}")
    credentials = load_credentials(args)
    tls_context(args.tls_cert, args.tls_key)  # a bad certificate fails before binding
    settings = ClientSettings(master=master_url(args))
    setup_server_logging(args.log_level)

    async def main() -> None:
        gw = S3Gateway(
            AsyncClient(settings),
            credentials,
            writable=frozenset(args.writable),
            spool_dir=args.spool_dir,
            region=args.region,
            domain=args.domain,
        )
        ready = (lambda url: write_url(args.url_file, url)) if args.url_file else None
        await run_http(
            gw.app(), args.host, args.port, args.tls_cert, args.tls_key, BANNER, ready=ready
        )

    uvloop.run(main())
    return 0

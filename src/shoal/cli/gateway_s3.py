"""``shoal gateway s3``: options and entry point of the s3 gateway.

Prints "shoal s3 gateway listening on URL" as its first line of output once bound
(``--port 0`` picks a free port), then serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
from typing import Any

from shoal.cli.gateway import add_serving_args, load_credentials
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
    add_serving_args(
        p, 9000, "access keys, their roles and datasets, and public datasets (docs/gateways.md)"
    )
    p.add_argument("--region", default="us-east-1", help="region the gateway reports")
    p.add_argument(
        "--uploads-dir",
        metavar="DIR",
        help="where multipart uploads in flight live; replicas behind one address share "
        "it (Kubernetes: a ReadWriteMany volume) ($TMPDIR or --spool-dir/shoal-s3-uploads-UID)",
    )
    p.add_argument(
        "--upload-max-age",
        type=float,
        default=86_400.0,
        metavar="SECONDS",
        help="remove multipart uploads idle this long (86400)",
    )
    p.add_argument(
        "--domain",
        metavar="NAME",
        help="also accept virtual-host style requests to BUCKET.NAME",
    )
    p.set_defaults(handler=cmd_gateway_s3)


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
    if not args.upload_max_age > 0:
        raise InvalidArgument(f"invalid --upload-max-age {args.upload_max_age}: must be > 0")
    credentials = load_credentials(args, "s3")
    tls_context(args.tls_cert, args.tls_key)  # a bad certificate fails before binding
    # a gateway has many requests in flight: connections per worker to match them
    settings = ClientSettings(master=master_url(args), pool_size=32)
    setup_server_logging(args.log_level)

    async def main() -> None:
        gw = S3Gateway(
            AsyncClient(settings),
            credentials,
            writable=frozenset(args.writable),
            spool_dir=args.spool_dir,
            uploads_dir=args.uploads_dir,
            upload_max_age=args.upload_max_age,
            region=args.region,
            domain=args.domain,
        )
        ready = (lambda url: write_url(args.url_file, url)) if args.url_file else None
        await run_http(
            gw.app(), args.host, args.port, args.tls_cert, args.tls_key, BANNER, ready=ready
        )

    uvloop.run(main())
    return 0

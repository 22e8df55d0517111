"""``shoal gateway webhdfs``: options and entry point of the WebHDFS gateway.

Prints "shoal webhdfs gateway listening on URL" as its first line of output once bound
(``--port 0`` picks a free port), then serves until SIGTERM or SIGINT. With
``--make-token ACCESS_KEY`` it prints a delegation token for that key instead.
"""

from __future__ import annotations

import argparse
from typing import Any

from shoal.cli.gateway import add_serving_args, load_credentials
from shoal.errors import InvalidArgument

BANNER = "shoal webhdfs gateway listening on {url}"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "webhdfs",
        help="serve datasets over a WebHDFS-compatible endpoint (hadoop fs, Spark)",
        description="A WebHDFS-compatible endpoint over the cache: /webhdfs/v1/<dataset>/"
        "<mount>/<path>. Reads by default; CREATE/APPEND/DELETE pass through to under "
        "storage for the datasets named with --writable. See docs/gateway-webhdfs.md.",
    )
    add_serving_args(
        p, 9870, "users, access keys, their datasets and public datasets (docs/gateways.md)"
    )
    p.add_argument(
        "--trust-user-name",
        action="store_true",
        help="honour user.name= (Hadoop's simple authentication, an unverified "
        "assertion) for the credentials file's users; only on a trusted network",
    )
    p.add_argument(
        "--block-size",
        default="128MiB",
        metavar="SIZE",
        help="block size reported to Hadoop (128MiB; a multiple of 512): the unit "
        "of input splits and of the file checksum",
    )
    p.add_argument(
        "--list-limit", type=int, default=1000, help="entries per LISTSTATUS_BATCH page (1000)"
    )
    p.add_argument(
        "--make-token",
        metavar="ACCESS_KEY",
        help="print a delegation token for ACCESS_KEY of --credentials and exit",
    )
    p.add_argument(
        "--token-ttl", type=float, default=86400.0, help="seconds a made token lives (86400)"
    )
    p.set_defaults(handler=cmd_gateway_webhdfs)


def _make_token(args: argparse.Namespace) -> int:
    from shoal.gateway.auth import Credentials
    from shoal.gateway.webhdfs_auth import make_token

    if not args.credentials:
        raise InvalidArgument("--make-token needs --credentials FILE")
    secret = Credentials.load(args.credentials).secret_for(args.make_token)
    if secret is None:
        raise InvalidArgument(f"no access key {args.make_token!r} in {args.credentials}")
    print(make_token(args.make_token, secret, args.token_ttl))
    return 0


def cmd_gateway_webhdfs(args: argparse.Namespace) -> int:
    import uvloop

    from shoal.cli.common import master_url
    from shoal.cli.main import setup_server_logging
    from shoal.client.aio import AsyncClient
    from shoal.config import ClientSettings
    from shoal.core.types import parse_size
    from shoal.gateway.server import run_http, tls_context, write_url
    from shoal.gateway.webhdfs import WebHdfsGateway
    from shoal.gateway.webhdfs_auth import Access
    from shoal.gateway.webhdfs_write import Writes

    if args.make_token:
        return _make_token(args)
    if not 0 <= args.port <= 65535:
        raise InvalidArgument(f"invalid --port {args.port}")
    credentials = load_credentials(args, "webhdfs")
    tls_context(args.tls_cert, args.tls_key)  # a bad certificate fails before binding
    # a gateway has many requests in flight: connections per worker to match them
    settings = ClientSettings(master=master_url(args), pool_size=32)
    block_size = parse_size(args.block_size)
    setup_server_logging(args.log_level)
    access = Access(
        credentials,
        allow_anonymous=args.allow_anonymous,
        trust_user_name=args.trust_user_name,
        writable=frozenset(args.writable),
    )

    async def main() -> None:
        client = AsyncClient(settings)
        writes = Writes(client, spool_dir=args.spool_dir) if args.writable else None
        gw = WebHdfsGateway(
            client, access, block_size=block_size, list_limit=args.list_limit, writes=writes
        )
        try:
            await run_http(
                gw.app(),
                args.host,
                args.port,
                args.tls_cert,
                args.tls_key,
                BANNER,
                ready=(lambda url: write_url(args.url_file, url)) if args.url_file else None,
            )
        finally:
            if writes is not None:
                await writes.close()
            await client.close()

    uvloop.run(main())
    return 0

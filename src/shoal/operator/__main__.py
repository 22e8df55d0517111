"""``python -m shoal.operator --master URL [--webhook-port P --tls-cert F --tls-key F]``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from shoal.errors import ShoalError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", required=True, help="the shoal master's URL, http://HOST:PORT")
    p.add_argument(
        "--interval",
        type=float,
        default=10.0,
        help="seconds between status refreshes and node label passes (default 10)",
    )
    p.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch only this namespace (repeatable; default: the whole cluster)",
    )
    p.add_argument(
        "--secrets-root",
        default="/etc/shoal/secrets",
        help="where shoal's pods mount the Secrets that Dataset mounts reference",
    )
    p.add_argument(
        "--free-timeout",
        type=float,
        default=300.0,
        help="seconds a deleted Dataset waits for its cache to be freed (default 300)",
    )
    p.add_argument(
        "--webhook-port",
        type=int,
        default=None,
        help="serve the admission webhook on this HTTPS port",
    )
    p.add_argument("--webhook-host", default="0.0.0.0", help="address the webhook binds")
    p.add_argument("--tls-cert", default=None, help="the webhook's certificate (PEM)")
    p.add_argument("--tls-key", default=None, help="the webhook's private key (PEM)")
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")


def run(args: argparse.Namespace) -> int:
    from shoal.operator.app import run as run_operator
    from shoal.operator.context import OperatorSettings

    settings = OperatorSettings(
        master=args.master,
        interval=args.interval,
        free_timeout=args.free_timeout,
        secrets_root=args.secrets_root,
        namespaces=tuple(args.namespace),
        webhook_port=args.webhook_port,
        webhook_host=args.webhook_host,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )
    import kopf

    try:
        asyncio.run(run_operator(settings))
    except KeyboardInterrupt:
        return 0
    except kopf.LoginError as exc:
        print(f"shoal operator: cannot log in to the Kubernetes API: {exc}", file=sys.stderr)
        return 2
    return 1  # the operator only returns when kopf stopped by itself


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shoal.operator", description=__doc__)
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return run(args)
    except ShoalError as exc:
        print(f"shoal operator: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

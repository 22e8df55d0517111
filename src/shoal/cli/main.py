"""``shoal``: start any role, run a local cluster, manage datasets, read files, report.

Errors a user can cause end in one line on stderr and exit status 2; failures of the
system in one line and status 1. Never a traceback (set SHOAL_DEBUG=1 to see one).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from shoal import __version__
from shoal.errors import NotFound, PermissionDenied, ShoalError, UserError

Handler = Callable[[argparse.Namespace], int | None]


def _parser() -> argparse.ArgumentParser:
    from shoal.cli import bench, cluster, dataset, fs, jobs, mount, report

    p = argparse.ArgumentParser(
        prog="shoal", description="A distributed dataset cache for AI training."
    )
    p.add_argument("--version", action="version", version=f"shoal {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    cluster.register(sub)
    dataset.register(sub)
    fs.register(sub)
    mount.register(sub)
    jobs.register(sub)
    report.register(sub)
    bench.register(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from shoal.cli.bench import run_bench

        run_bench(argv[1:])  # hands the process over to the suite
    parser = _parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        code = handler(args) or 0
    except (UserError, NotFound, PermissionDenied) as exc:
        print(
            f"shoal: error: {exc.message if isinstance(exc, ShoalError) else exc}", file=sys.stderr
        )
        code = 2
    except ShoalError as exc:
        print(f"shoal: error: {exc.message}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        code = 0
    except Exception as exc:
        if os.environ.get("SHOAL_DEBUG"):
            raise
        print(f"shoal: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.exit(code)


def setup_server_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

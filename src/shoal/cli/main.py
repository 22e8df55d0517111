"""``shoal``: start any role, run a local cluster, manage datasets, read files, report.

Errors a user can cause end in one line on stderr and exit status 2; failures of the
system in one line and status 1. Never a traceback (set SHOAL_DEBUG=1 to see one).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
from collections.abc import Callable

from shoal import __version__
from shoal.cli.output import set_plain
from shoal.errors import ShoalError

Handler = Callable[[argparse.Namespace], int | None]


def exit_status(exc: ShoalError) -> int:
    """2 for an error the user caused, 1 for a failure of the system (the error table's
    ``user_fault``, see shoal.errors)."""
    return 2 if exc.user_fault else 1


def _parser() -> argparse.ArgumentParser:
    from shoal.cli import (
        bench,
        cluster,
        csi,
        dataset,
        fluid,
        fs,
        gateway,
        jobs,
        mount,
        report,
        tokens,
        top,
    )
    from shoal.cli import operator as operator_cmd

    p = argparse.ArgumentParser(
        prog="shoal", description="A distributed dataset cache for AI training."
    )
    p.add_argument("--version", action="version", version=f"shoal {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    cluster.register(sub)
    tokens.register(sub)
    dataset.register(sub)
    fs.register(sub)
    mount.register(sub)
    jobs.register(sub)
    report.register(sub)
    top.register(sub)
    gateway.register(sub)
    csi.register(sub)
    fluid.register(sub)
    operator_cmd.register(sub)
    bench.register(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from shoal.cli.bench import run_bench

        run_bench(argv[1:])  # hands the process over to the suite
    _buffered_stdout()
    parser = _parser()
    args = parser.parse_args(argv)
    set_plain(bool(getattr(args, "plain", False)))
    handler: Handler = args.handler
    try:
        code = handler(args) or 0
        sys.stdout.flush()
    except ShoalError as exc:
        print(f"shoal: error: {exc.message}", file=sys.stderr)
        code = exit_status(exc)
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        # printed output (tables, listings) whose reader went away, e.g. `| head`
        print("shoal: error: output closed early (broken pipe)", file=sys.stderr)
        code = 1
    except Exception as exc:
        if os.environ.get("SHOAL_DEBUG"):
            raise
        print(f"shoal: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    try:
        sys.stdout.flush()  # what a failing command printed before it failed still goes out
    except OSError as exc:
        if not code:
            print(f"shoal: error: writing output: {exc.strerror or exc}", file=sys.stderr)
            code = 1
        _drop_stdout()
    sys.exit(code)


def _buffered_stdout() -> None:
    """Put a buffer under stdout when PYTHONUNBUFFERED/-u took it away: the raw layer
    does one write(2) per call and drops what a short write left (65,536 of 108 MB
    bytes reached a slow pipe reader); a BufferedWriter writes everything or raises."""
    if isinstance(getattr(sys.stdout, "buffer", None), io.RawIOBase):
        tty = sys.stdout.isatty()
        sys.stdout = io.TextIOWrapper(
            io.BufferedWriter(sys.stdout.buffer),
            encoding=sys.stdout.encoding,
            errors=sys.stdout.errors,
            line_buffering=tty,
        )


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's flush at exit cannot add a second
    error line ("Exception ignored ... BrokenPipeError") after ours."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def setup_server_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

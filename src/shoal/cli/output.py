"""Printing for the CLI: JSON for machines (--json), rich tables for people, and
tab-separated lines for scripts (--plain, or whenever stdout is not a terminal).

Also the one place bytes leave the CLI (:func:`write_all`): every byte is written or
the command fails, never a silent short write.
"""

from __future__ import annotations

import errno
import json
import math
import os
import select
import sys
from collections.abc import Sequence
from typing import Any

from shoal.errors import ShoalError

#: largest single write(2); a pipe takes 64 KiB at a time anyway
_CHUNK = 1 << 20


class OutputError(ShoalError):
    """Writing the command's output failed (closed pipe, full disk, I/O error)."""


_plain_forced = False


def set_plain(on: bool) -> None:
    global _plain_forced
    _plain_forced = on


def plain() -> bool:
    """Tab-separated output: asked for, or stdout is a pipe or file (rich would wrap
    mid-word at 80 columns there)."""
    return _plain_forced or not sys.stdout.isatty()


def emit_json(obj: Any) -> None:
    # allow_nan=False: strict parsers reject NaN/Infinity, so they never leave the CLI
    json.dump(_finite(obj), sys.stdout, indent=None, separators=(",", ":"), default=str)
    sys.stdout.write("\n")


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _cell(x: Any) -> str:
    # a tab or newline inside a cell would shift every column after it
    return str(x).replace("\t", " ").replace("\n", " ")


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    if plain():
        if title:
            print(f"# {title}")
        print("\t".join(columns))
        for r in rows:
            print("\t".join(_cell(x) for x in r))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_edge=False, header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    Console(soft_wrap=True).print(t)


def human_bytes(n: float) -> str:
    """Binary units (KiB, MiB, ...) everywhere the CLI prints sizes and rates."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_staleness(s: float) -> str:
    """A staleness bound for people, as ``ls`` and ``show`` both print it."""
    if s < 0 or not math.isfinite(s):
        return "never"
    return "always" if s == 0 else f"{s:g}s"


def fmt_ttl(s: float) -> str:
    """A TTL for people: 0 means cached data never expires."""
    return "never" if s <= 0 or not math.isfinite(s) else f"{s:g}s"


def add_master(p: Any) -> None:
    p.add_argument(
        "--master",
        metavar="URL",
        help="master URL (default: $SHOAL_MASTER, else the local cluster started by `shoal up`)",
    )


def add_json(p: Any) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--plain",
        action="store_true",
        help="print tab-separated lines (the default when stdout is not a terminal)",
    )


def write_all(fd: int, data: bytes | bytearray | memoryview, what: str) -> int:
    """Write every byte of ``data`` to ``fd`` or raise OutputError naming ``what``.

    Loops on short writes and waits when the descriptor is non-blocking (the event
    loop of the client may have made stdout so): a single ``write`` to a pipe with a
    slow reader writes only what the pipe holds.
    """
    view = memoryview(data).cast("B")
    total, done = len(view), 0
    while done < total:
        try:
            n = os.write(fd, view[done : done + _CHUNK])
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        except BrokenPipeError:
            raise OutputError(
                f"{what}: the reader closed the pipe after {done:,} of {total:,} bytes"
            ) from None
        except OSError as exc:
            raise OutputError(
                f"{what}: {os.strerror(exc.errno or errno.EIO)} after {done:,} of {total:,} bytes"
            ) from None
        if n <= 0:
            raise OutputError(f"{what}: short write after {done:,} of {total:,} bytes")
        done += n
    return done

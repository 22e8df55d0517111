"""Small HTML helpers for the console: escaping, number formats, tagged values.

Everything that comes from state (names, paths, reasons, URIs) goes through
:func:`esc`; a value shown on a page is wrapped by :func:`val`, which also carries the
raw number in ``data-value`` so that a test (or a script) reads it exactly.
"""

from __future__ import annotations

import html
import json
import time
from typing import Any
from urllib.parse import quote

UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def url_part(s: str) -> str:
    return quote(s, safe="")


def nbytes(n: float | None) -> str:
    if n is None:
        return "-"
    v = float(n)
    for unit in UNITS:
        if abs(v) < 1024 or unit == UNITS[-1]:
            return f"{int(v)} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} {UNITS[-1]}"  # pragma: no cover - the loop always returns


def rate(n: float | None) -> str:
    return "-" if n is None else nbytes(n) + "/s"


def pct(frac: float | None) -> str:
    return "-" if frac is None else f"{100 * frac:.1f}%"


def count(n: float | None) -> str:
    return "-" if n is None else f"{int(n):,}"


def duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = max(0.0, float(s))
    if s < 60:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m:02d} min"
    return f"{h // 24} d {h % 24} h"


def when(t: float | None) -> str:
    """A wall-clock time as UTC ``YYYY-MM-DD HH:MM:SS``."""
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


FORMATS = {
    "bytes": nbytes,
    "rate": rate,
    "pct": pct,
    "ratio": pct,
    "pct100": lambda v: "-" if v is None else f"{v:.1f}%",
    "count": count,
    "duration": duration,
    "when": when,
    "text": lambda v: "-" if v is None else str(v),
}


def val(value: Any, fmt: str, field: str = "", cls: str = "") -> str:
    """``<span data-field=.. data-value=..>formatted</span>``."""
    shown = FORMATS[fmt](value)
    raw = "" if value is None else (json.dumps(value) if not isinstance(value, str) else value)
    attrs = f' data-field="{esc(field)}"' if field else ""
    klass = f' class="{esc(cls)}"' if cls else ""
    return f'<span{klass}{attrs} data-value="{esc(raw)}">{esc(shown)}</span>'


def bar(frac: float, label: str, **data: str) -> str:
    """A ``<progress>`` from 0 to 1 with data-* attributes (no inline style: the CSP)."""
    attrs = "".join(f' data-{esc(k)}="{esc(v)}"' for k, v in data.items())
    f = min(1.0, max(0.0, frac))
    return f'<progress max="1" value="{f:.4f}"{attrs} title="{esc(label)}">{esc(pct(f))}</progress>'


def table(head: list[str], rows: list[str], empty: str, cls: str = "") -> str:
    klass = f' class="{esc(cls)}"' if cls else ""
    if not rows:
        return f'<p class="empty">{esc(empty)}</p>'
    ths = "".join(f"<th>{esc(h)}</th>" for h in head)
    return f"<table{klass}><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table>"

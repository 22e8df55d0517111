"""``shoal top``: a live terminal view of the cluster, refreshed every second.

The same overview as the Grafana dashboard for people on a shell: workers up and
down, per-tier use against quota, cached bytes and hit ratio per dataset, read
throughput by source (rates from successive ``report`` snapshots), running jobs with
progress bars, and per-worker health. On a terminal it redraws in place (rich
``Live``); with ``--plain`` or when stdout is not a terminal it prints one block of
tab-separated tables per refresh (``--iterations N`` / ``--once`` for scripts).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shoal.cli.common import client
from shoal.cli.output import add_master, human_bytes, plain, table
from shoal.errors import InvalidArgument

SOURCES = ("local", "remote", "ufs")
#: finished jobs shown below the active ones
FINISHED_SHOWN = 3
_ACTIVE = ("pending", "listing", "running")


def register(sub: Any) -> None:
    p = sub.add_parser("top", help="live view: tiers, hit ratios, throughput, workers, jobs")
    add_master(p)
    p.add_argument(
        "--interval", type=float, default=1.0, metavar="SECONDS", help="refresh period (1)"
    )
    p.add_argument("--iterations", type=int, metavar="N", help="stop after N refreshes")
    p.add_argument("--once", action="store_true", help="print one refresh and stop")
    p.add_argument(
        "--plain",
        action="store_true",
        help="tab-separated blocks, one per refresh (the default when stdout is not a terminal)",
    )
    p.set_defaults(handler=cmd_top)


# -- the model: what one refresh shows ----------------------------------------------------


@dataclass
class Section:
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    #: per row, a fraction 0..1 drawn as a bar in the last column (rich only)
    bars: list[float | None] = field(default_factory=list)


@dataclass
class Sample:
    at: float
    report: dict[str, Any]
    jobs: list[dict[str, Any]]


def _ratio(hits: int, misses: int) -> str:
    reads = hits + misses
    return f"{hits / reads:.1%}" if reads else "-"


def _rate(now: dict[str, int], before: dict[str, int] | None, dt: float, key: str) -> str:
    if before is None or dt <= 0:
        return "-"
    return human_bytes(max(0, now.get(key, 0) - before.get(key, 0)) / dt) + "/s"


def frame(cur: Sample, prev: Sample | None) -> list[Section]:
    """The sections of one refresh; rates need the previous sample."""
    r = cur.report
    dt = cur.at - prev.at if prev is not None else 0.0
    tot = r.get("totals", {})
    workers = r.get("workers", [])
    live = sum(1 for w in workers if w.get("state") == "live")
    head = Section(
        "cluster",
        [
            "workers up",
            "workers down",
            "epoch",
            "cached",
            "hits",
            "misses",
            "hit ratio",
            *(f"{s} read/s" for s in SOURCES),
        ],
    )
    before_tot = prev.report.get("totals", {}).get("bytes_by_source") if prev else None
    by_src = tot.get("bytes_by_source", {})
    head.rows.append(
        [
            live,
            len(workers) - live,
            tot.get("epoch", 0),
            human_bytes(tot.get("cached_bytes", 0)),
            tot.get("hits", 0),
            tot.get("misses", 0),
            _ratio(tot.get("hits", 0), tot.get("misses", 0)),
            *(_rate(by_src, before_tot, dt, s) for s in SOURCES),
        ]
    )
    tiers = Section("tiers", ["tier", "workers", "used", "quota", "use"])
    agg: dict[str, list[int]] = {}
    for w in workers:
        if w.get("state") != "live":
            continue
        for t in w.get("tiers", []):
            a = agg.setdefault(t["name"], [0, 0, 0])
            a[0] += 1
            a[1] += int(t.get("used", 0))
            a[2] += int(t.get("capacity", 0))
    for name, (n, used, cap) in agg.items():
        tiers.rows.append([name, n, human_bytes(used), human_bytes(cap), _pct(used, cap)])
        tiers.bars.append(used / cap if cap else None)
    ds = Section(
        "datasets",
        [
            "dataset",
            "cached files",
            "cached",
            "of store",
            "hits",
            "misses",
            "hit ratio",
            *(f"{s} read/s" for s in SOURCES),
        ],
    )
    before_ds = (
        {d["name"]: d.get("bytes_by_source", {}) for d in prev.report.get("datasets", [])}
        if prev
        else {}
    )
    for d in r.get("datasets", []):
        pct = d.get("cached_pct")
        src = d.get("bytes_by_source", {})
        ds.rows.append(
            [
                d["name"],
                d.get("cached_files", 0),
                human_bytes(d.get("cached_bytes", 0)),
                "-" if pct is None else f"{pct:.1f}%",
                d.get("hits", 0),
                d.get("misses", 0),
                _ratio(d.get("hits", 0), d.get("misses", 0)),
                *(_rate(src, before_ds.get(d["name"]) if prev else None, dt, s) for s in SOURCES),
            ]
        )
    return [head, tiers, ds, _jobs(cur.jobs), _workers(workers)]


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _jobs(jobs: list[dict[str, Any]]) -> Section:
    s = Section("jobs", ["id", "kind", "dataset", "state", "files", "bytes", "rate", "progress"])
    active = [j for j in jobs if j.get("state") in _ACTIVE]
    ended = [j for j in jobs if j.get("state") not in _ACTIVE][-FINISHED_SHOWN:]
    for j in active + ended:
        ftot, btot = int(j.get("files_total", 0)), int(j.get("bytes_total", 0))
        fdone = int(j.get("files_done", 0)) + int(j.get("files_skipped", 0))
        bdone = int(j.get("bytes_done", 0))
        frac = (bdone / btot) if btot else (fdone / ftot if ftot else None)
        s.rows.append(
            [
                j.get("id", ""),
                j.get("kind", ""),
                j.get("dataset", ""),
                j.get("state", ""),
                f"{fdone}/{ftot}",
                f"{human_bytes(bdone)}/{human_bytes(btot)}",
                human_bytes(float(j.get("bytes_per_s", 0))) + "/s",
                "-" if frac is None else f"{min(1.0, frac):.0%}",
            ]
        )
        s.bars.append(None if frac is None else min(1.0, frac))
    return s


def _workers(workers: list[dict[str, Any]]) -> Section:
    s = Section("workers", ["id", "address", "state", "heartbeat", "used", "capacity", "use"])
    for w in workers:
        used, cap = int(w.get("used", 0)), int(w.get("capacity", 0))
        s.rows.append(
            [
                w.get("id", ""),
                f"{w.get('host', '')}:{w.get('port', '')}",
                w.get("state", ""),
                f"{float(w.get('last_heartbeat_age_s', 0)):.1f}s ago",
                human_bytes(used),
                human_bytes(cap),
                _pct(used, cap),
            ]
        )
        s.bars.append(used / cap if cap else None)
    return s


# -- rendering ------------------------------------------------------------------------


def print_plain(sections: Sequence[Section], stamp: str) -> None:
    print(f"# shoal top {stamp}")
    for sec in sections:
        table(sec.title, sec.columns, sec.rows)
    print(flush=True)


def rich_view(sections: Sequence[Section], stamp: str) -> Any:
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(f"shoal top  {stamp}  (Ctrl-C to quit)", style="bold")]
    for sec in sections:
        t = Table(title=sec.title, title_justify="left", show_edge=False, header_style="bold")
        for c in sec.columns:
            t.add_column(c, overflow="fold")
        for i, row in enumerate(sec.rows):
            cells: list[Any] = [str(x) for x in row]
            bar = sec.bars[i] if i < len(sec.bars) else None
            if bar is not None:
                cells[-1] = Group(
                    ProgressBar(total=1.0, completed=bar, width=20), Text(str(row[-1]))
                )
            t.add_row(*cells)
        parts.append(t)
    return Group(*parts)


# -- the loop -------------------------------------------------------------------------


def run(
    fetch: Callable[[], Sample],
    show: Callable[[list[Section], str], None],
    interval: float,
    iterations: int | None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Fetch and show every ``interval`` seconds, ``iterations`` times (None: forever)."""
    prev: Sample | None = None
    n = 0
    while iterations is None or n < iterations:
        if n:
            assert prev is not None
            sleep(max(0.0, prev.at + interval - time.monotonic()))
        cur = fetch()
        show(frame(cur, prev), time.strftime("%H:%M:%S"))
        prev = cur
        n += 1
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise InvalidArgument(f"--interval must be > 0 seconds, got {args.interval}")
    iterations = 1 if args.once else args.iterations
    if iterations is not None and iterations < 1:
        raise InvalidArgument(f"--iterations must be >= 1, got {iterations}")
    with client(args) as c:

        def fetch() -> Sample:
            rep = c.report()
            return Sample(time.monotonic(), dict(rep), list(c.jobs().get("jobs", [])))

        if plain():
            return run(fetch, print_plain, args.interval, iterations)
        from rich.live import Live

        with Live(auto_refresh=False, screen=False, transient=False) as live:

            def show(sections: list[Section], stamp: str) -> None:
                live.update(rich_view(sections, stamp), refresh=True)

            return run(fetch, show, args.interval, iterations)

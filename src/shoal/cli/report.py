"""``shoal report``: what is cached, per dataset and per worker, and how well it works.

``--watch [SECONDS]`` repeats it every SECONDS (2) until Ctrl-C or ``--count N``
reports: on a terminal each report replaces the last; otherwise (and with ``--json``,
one JSON object per line) they follow one another.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from shoal.cli.common import client
from shoal.cli.output import add_json, add_master, emit_json, human_bytes, plain, table
from shoal.client import Client
from shoal.errors import InvalidArgument

#: seconds between reports of ``--watch`` without a value
WATCH_DEFAULT = 2.0


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="cached files and bytes, hit ratios, worker health")
    add_master(p)
    add_json(p)
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=WATCH_DEFAULT,
        metavar="SECONDS",
        help=f"repeat every SECONDS ({WATCH_DEFAULT:g}) until Ctrl-C",
    )
    p.add_argument("--count", type=int, metavar="N", help="with --watch: stop after N reports")
    p.set_defaults(handler=cmd_report)


def _ratio(hits: int, misses: int) -> str:
    """Hits over reads, from the two counts printed beside it (so they always agree).

    The master's ``hit_ratio`` is byte-weighted: a read that fetched some pages from
    the store is one miss, but its pages that were already cached (or arriving for a
    concurrent read) count as cache bytes, so "0 hits, 20 misses" could show 18.4%.
    That figure is printed as "bytes from cache".
    """
    reads = hits + misses
    return f"{hits / reads:.1%}" if reads else "-"


def _byte_share(by_source: dict[str, int]) -> str:
    total = sum(by_source.get(s, 0) for s in ("local", "remote", "ufs"))
    if not total:
        return "-"
    return f"{(by_source.get('local', 0) + by_source.get('remote', 0)) / total:.1%}"


def _moved(m: dict[str, int], way: str) -> str:
    """Files (bytes) a worker got from previous owners (in) or handed over (out)."""
    files = m.get(f"files_{way}", 0)
    return f"{files} ({human_bytes(m.get(f'bytes_{way}', 0))})" if files else "-"


def cmd_report(args: argparse.Namespace) -> int:
    if args.watch is None:
        if args.count is not None:
            raise InvalidArgument("--count is for --watch")
        with client(args) as c:
            _once(c, args.json)
        return 0
    if not args.watch > 0:
        raise InvalidArgument(f"--watch must be > 0 seconds, got {args.watch:g}")
    if args.count is not None and args.count < 1:
        raise InvalidArgument(f"--count must be >= 1, got {args.count}")
    redraw = not args.json and not plain()
    n, started = 0, time.monotonic()
    with client(args) as c:
        while args.count is None or n < args.count:
            if n:
                time.sleep(max(0.0, started + args.watch - time.monotonic()))
                started = time.monotonic()
            if redraw:
                sys.stdout.write("\033[H\033[J")  # cursor home, clear the screen
            elif n and not args.json:
                print()
            if not args.json:
                print(f"# shoal report {time.strftime('%Y-%m-%d %H:%M:%S')}")
            _once(c, args.json)
            sys.stdout.flush()
            n += 1
    return 0


def _once(c: Client, as_json: bool) -> None:
    r = c.report()
    if as_json:
        emit_json(r)
        return
    policies = {d.name: d.policy for d in c.datasets()}
    table(
        "datasets",
        [
            "name",
            "cached files",
            "cached",
            "hits",
            "misses",
            "hit ratio",
            "bytes from cache",
            "local",
            "remote",
            "store",
        ],
        [
            (
                d["name"],
                d.get("cached_files", 0),
                human_bytes(d.get("cached_bytes", 0)),
                d.get("hits", 0),
                d.get("misses", 0),
                _ratio(d.get("hits", 0), d.get("misses", 0)),
                _byte_share(d.get("bytes_by_source", {})),
                *(
                    human_bytes(d.get("bytes_by_source", {}).get(s, 0))
                    for s in ("local", "remote", "ufs")
                ),
            )
            for d in r.get("datasets", [])
        ],
    )
    table(
        "workers",
        ["id", "address", "node", "state", "used", "capacity", "tiers", "moved in", "moved out"],
        [
            (
                w["id"],
                f"{w['host']}:{w['port']}",
                w.get("node", ""),
                w.get("state", ""),
                human_bytes(w.get("used", 0)),
                human_bytes(w.get("capacity", 0)),
                " ".join(
                    f"{t['name']}:{human_bytes(t.get('used', 0))}/{human_bytes(t.get('capacity', 0))}"
                    for t in w.get("tiers", [])
                ),
                _moved(w.get("moved", {}), "in"),
                _moved(w.get("moved", {}), "out"),
            )
            for w in r.get("workers", [])
        ],
    )
    t = r.get("totals", {})
    if t.get("moved_files") or t.get("handed_over_files"):
        print(
            f"moved between workers: {t.get('moved_files', 0)} files "
            f"({human_bytes(t.get('moved_bytes', 0))}) from previous owners, "
            f"{t.get('handed_over_files', 0)} files "
            f"({human_bytes(t.get('handed_over_bytes', 0))}) handed over by drains"
        )
    live = sum(1 for w in r.get("workers", []) if w.get("state") == "live")
    for name, policy in sorted(policies.items()):
        if policy.replicas > live:
            print(
                f"under-replicated: dataset {name} asks for replicas={policy.replicas}, "
                f"the cluster has {live} live worker(s)"
            )

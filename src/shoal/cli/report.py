"""``shoal report``: what is cached, per dataset and per worker, and how well it works."""

from __future__ import annotations

import argparse
from typing import Any

from shoal.cli.common import client
from shoal.cli.output import add_json, add_master, emit_json, human_bytes, table


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="cached files and bytes, hit ratios, worker health")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    with client(args) as c:
        r = c.report()
    if args.json:
        emit_json(r)
        return 0
    table(
        "datasets",
        [
            "name",
            "cached files",
            "cached",
            "hits",
            "misses",
            "hit ratio",
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
                f"{d.get('hit_ratio', 0.0):.1%}",
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
        ["id", "address", "node", "state", "used", "capacity", "tiers"],
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
            )
            for w in r.get("workers", [])
        ],
    )
    return 0

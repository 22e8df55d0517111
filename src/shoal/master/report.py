"""Cluster report: per-dataset and per-worker figures summed from worker heartbeats.

Workers send their latest stats in every heartbeat; the master keeps only the latest
per worker and sums them when asked (the report route and the /metrics scrape), so
nothing here accumulates state. Stats are read tolerantly: a missing or malformed key
counts as zero.

What is summed over which workers:

- cached files and bytes, tier usage: live workers only -- an expired worker's cache
  is not reachable, so it is not cached data the cluster can serve;
- hits, misses and bytes read by source: every known worker, live or expired -- they
  count traffic that happened, and dropping a worker must not make them go backwards;
- files and bytes moved between workers when the ring moved (``moved``: ``files_in``
  and ``bytes_in`` a new owner got from a previous one instead of under storage,
  ``files_out`` and ``bytes_out`` a draining worker handed over): every known worker.

``hit_ratio`` is byte-weighted when workers report bytes by source (bytes served from
a cache, local or remote, over all bytes read), otherwise hits / (hits + misses), and
0 when nothing was read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal.core.membership import WorkerRecord
from shoal.proto.control import (
    BytesBySource,
    ReportDataset,
    ReportResponse,
    ReportTier,
    ReportTotals,
    ReportWorker,
    ReportWorkerDataset,
)

SOURCES = ("local", "remote", "ufs")
#: the counters of a worker's ``moved`` stats (shoal.worker.drain)
MOVED = ("files_in", "bytes_in", "files_out", "bytes_out")


def moved(rec: WorkerRecord) -> dict[str, int]:
    """The worker's moved files and bytes (zeros when it reports none)."""
    m = rec.stats.get("moved") if isinstance(rec.stats, Mapping) else None
    return {k: _n(m, k) for k in MOVED}


def _n(d: Any, key: str) -> int:
    """``d[key]`` as a non-negative int; 0 when missing or not a number."""
    if not isinstance(d, Mapping):
        return 0
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return 0
    return max(0, int(v))


@dataclass
class DatasetTotals:
    """Sums for one dataset across workers."""

    cached_files: int = 0
    cached_bytes: int = 0
    hits: int = 0
    misses: int = 0
    by_source: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))

    def add_traffic(self, st: Mapping[str, Any]) -> None:
        self.hits += _n(st, "hits")
        self.misses += _n(st, "misses")
        src = st.get("bytes_by_source")
        for s in SOURCES:
            self.by_source[s] += _n(src, s)

    def add_cache(self, st: Mapping[str, Any]) -> None:
        self.cached_files += _n(st, "cached_files")
        self.cached_bytes += _n(st, "cached_bytes")

    def merge(self, other: DatasetTotals) -> None:
        self.cached_files += other.cached_files
        self.cached_bytes += other.cached_bytes
        self.hits += other.hits
        self.misses += other.misses
        for s in SOURCES:
            self.by_source[s] += other.by_source[s]

    @property
    def hit_ratio(self) -> float:
        total = sum(self.by_source.values())
        if total > 0:
            return (self.by_source["local"] + self.by_source["remote"]) / total
        reads = self.hits + self.misses
        return self.hits / reads if reads else 0.0

    def bytes_by_source(self) -> BytesBySource:
        return {
            "local": self.by_source["local"],
            "remote": self.by_source["remote"],
            "ufs": self.by_source["ufs"],
        }


def dataset_totals(
    records: Iterable[WorkerRecord], dataset_names: Iterable[str]
) -> dict[str, DatasetTotals]:
    """Per-dataset sums; defined datasets always appear, and so do datasets that are
    no longer defined but still have cached data or traffic on some worker."""
    out = {name: DatasetTotals() for name in dataset_names}
    for rec in records:
        per_ds = rec.stats.get("datasets")
        if not isinstance(per_ds, Mapping):
            continue
        for name, st in per_ds.items():
            if not isinstance(name, str) or not isinstance(st, Mapping):
                continue
            tot = out.setdefault(name, DatasetTotals())
            tot.add_traffic(st)
            if rec.live:
                tot.add_cache(st)
    return dict(sorted(out.items()))


def worker_tiers(rec: WorkerRecord) -> list[ReportTier]:
    """Tier usage from the latest stats, else the registered tiers with nothing used."""
    tiers = rec.stats.get("tiers")
    if isinstance(tiers, list) and tiers:
        return [
            {
                "name": str(t.get("name", "")),
                "capacity": _n(t, "capacity"),
                "used": _n(t, "used"),
                "pages": _n(t, "pages"),
            }
            for t in tiers
            if isinstance(t, Mapping)
        ]
    return [{"name": t.name, "capacity": t.capacity, "used": 0, "pages": 0} for t in rec.info.tiers]


def _worker_datasets(rec: WorkerRecord, names: list[str]) -> dict[str, ReportWorkerDataset]:
    """What this worker caches of each dataset (the node labels follow it)."""
    stats = rec.stats.get("datasets")
    if not isinstance(stats, Mapping):
        return {}
    known = set(names)
    out: dict[str, ReportWorkerDataset] = {}
    for name, st in stats.items():
        if name in known and isinstance(st, Mapping):
            out[name] = {
                "cached_files": _n(st, "cached_files"),
                "cached_bytes": _n(st, "cached_bytes"),
            }
    return dict(sorted(out.items()))


def build_report(
    records: list[WorkerRecord], dataset_names: list[str], now: float, epoch: int
) -> ReportResponse:
    """The ``GET /api/v1/report`` body; ``now`` is on the same clock as the records."""
    per_ds = dataset_totals(records, dataset_names)
    datasets: list[ReportDataset] = [
        {
            "name": name,
            "cached_files": t.cached_files,
            "cached_bytes": t.cached_bytes,
            "hits": t.hits,
            "misses": t.misses,
            "hit_ratio": t.hit_ratio,
            "bytes_by_source": t.bytes_by_source(),
        }
        for name, t in per_ds.items()
    ]
    workers: list[ReportWorker] = []
    capacity = used = corrupt = 0
    for rec in records:
        tiers = worker_tiers(rec)
        w_cap = sum(t["capacity"] for t in tiers)
        w_used = sum(t["used"] for t in tiers)
        workers.append(
            {
                "id": rec.info.id,
                "host": rec.info.host,
                "port": rec.info.port,
                "node": rec.info.node,
                "state": rec.state,
                "last_heartbeat_age_s": round(max(0.0, now - rec.last_heartbeat), 3),
                "capacity": w_cap,
                "used": w_used,
                "tiers": tiers,
                "datasets": _worker_datasets(rec, dataset_names),
                "moved": moved(rec),
            }
        )
        if rec.live:
            capacity += w_cap
            used += w_used
            corrupt += _n(rec.stats, "corrupt_pages")
    all_moved = dict.fromkeys(MOVED, 0)
    for rec in records:
        for k, v in moved(rec).items():
            all_moved[k] += v
    all_ds = DatasetTotals()
    for t in per_ds.values():
        all_ds.merge(t)
    live = sum(1 for r in records if r.live)
    totals: ReportTotals = {
        "epoch": epoch,
        "datasets": len(dataset_names),
        "workers_live": live,
        "workers_expired": len(records) - live,
        "capacity": capacity,
        "used": used,
        "cached_files": all_ds.cached_files,
        "cached_bytes": all_ds.cached_bytes,
        "hits": all_ds.hits,
        "misses": all_ds.misses,
        "hit_ratio": all_ds.hit_ratio,
        "bytes_by_source": all_ds.bytes_by_source(),
        "corrupt_pages": corrupt,
        "moved_files": all_moved["files_in"],
        "moved_bytes": all_moved["bytes_in"],
        "handed_over_files": all_moved["files_out"],
        "handed_over_bytes": all_moved["bytes_out"],
    }
    return {"datasets": datasets, "workers": workers, "totals": totals}

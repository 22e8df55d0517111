"""The master's short in-memory history of cluster figures, for the web console's charts.

Every ``interval`` seconds (5 by default) :meth:`History.sample` reads what the report
aggregates -- the latest stats of every worker -- and appends one :class:`Point` to a
bounded ring (720 points: one hour at 5 s). Nothing is persisted: a restarted master
starts an empty history, and the console works without Prometheus.

Counters (bytes read by source, hits, misses, evictions) are kept per worker and
turned into cluster-wide cumulative sums that never go backwards: a worker whose
counter went down restarted, so its new value counts as the increase (Prometheus'
``rate()`` rule). Rates are differences between points over their time apart.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal.core.membership import WorkerRecord
from shoal.master.report import SOURCES, worker_tiers

#: default sampling period (seconds) and ring size: one hour at 5 s
INTERVAL = 5.0
CAPACITY = 720
#: counters per dataset in a point: bytes by source, then hits and misses
_COUNTERS = (*SOURCES, "hits", "misses")


def _num(d: Any, key: str) -> int:
    """``d[key]`` as a non-negative int; 0 when missing or not a number."""
    if type(d) is not dict and not isinstance(d, Mapping):  # the cheap check first
        return 0
    v = d.get(key)
    if type(v) is int:
        return v if v > 0 else 0
    if isinstance(v, bool) or not isinstance(v, int | float):
        return 0
    return max(0, int(v))


@dataclass(frozen=True, slots=True)
class DatasetPoint:
    cached_bytes: int
    #: cumulative, reset-corrected: local, remote, ufs bytes, hits, misses
    counters: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Point:
    """The cluster at one moment; ``t`` is wall-clock seconds."""

    t: float
    workers_live: int
    workers_down: int
    #: tier name -> (used, capacity) summed over live workers
    tiers: dict[str, tuple[int, int]]
    cached_bytes: int
    counters: tuple[int, ...]
    datasets: dict[str, DatasetPoint]
    #: worker id -> cumulative evicted bytes over its tiers (reset-corrected)
    evicted: dict[str, int] = field(default_factory=dict)


class History:
    """A bounded ring of :class:`Point`; not thread-safe (the master's loop owns it)."""

    def __init__(self, interval: float = INTERVAL, capacity: int = CAPACITY) -> None:
        if interval <= 0 or capacity < 2:
            raise ValueError("history needs interval > 0 and capacity >= 2")
        self.interval = interval
        self.points: collections.deque[Point] = collections.deque(maxlen=capacity)
        # (worker, dataset) -> the worker's last counter values; the running sums per
        # dataset grow by each increase (kept incrementally: a sample costs what the
        # workers report, not what they ever reported)
        self._last: dict[tuple[str, str], list[int]] = {}
        self._sums: dict[str, list[int]] = {}
        self._evict_last: dict[str, int] = {}
        self._evict_sum: dict[str, int] = {}

    def sample(self, records: Iterable[WorkerRecord], dataset_names: list[str], t: float) -> Point:
        """Append the figures of ``records`` at wall time ``t`` and return the point."""
        tiers: dict[str, tuple[int, int]] = {}
        live = down = 0
        n = len(_COUNTERS)
        cached: dict[str, int] = dict.fromkeys(dataset_names, 0)
        evicted: dict[str, int] = {}
        for name in dataset_names:
            self._sums.setdefault(name, [0] * n)
        for rec in records:
            wid = rec.info.id
            if rec.live:
                live += 1
                for tier in worker_tiers(rec):
                    used, cap = tiers.get(tier["name"], (0, 0))
                    tiers[tier["name"]] = (used + tier["used"], cap + tier["capacity"])
            else:
                down += 1
            per_ds = rec.stats.get("datasets")
            if isinstance(per_ds, Mapping):
                for name, st in per_ds.items():
                    if not isinstance(name, str) or not isinstance(st, Mapping):
                        continue
                    self._see(wid, name, st)
                    if rec.live:
                        cached[name] = cached.get(name, 0) + _num(st, "cached_bytes")
            tier_stats = rec.stats.get("tiers")
            if isinstance(tier_stats, list):
                v = sum(_num(x, "evicted_bytes") for x in tier_stats)
                last = self._evict_last.get(wid, 0)
                total = self._evict_sum.get(wid, 0) + (v - last if v >= last else v)
                self._evict_last[wid], self._evict_sum[wid] = v, total
                evicted[wid] = total
        # a worker that stopped reporting a dataset keeps its share of the sums
        for name in self._sums:
            cached.setdefault(name, 0)
        point = Point(
            t=t,
            workers_live=live,
            workers_down=down,
            tiers=dict(sorted(tiers.items())),
            cached_bytes=sum(cached.values()),
            counters=tuple(sum(r[i] for r in self._sums.values()) for i in range(n)),
            datasets={
                name: DatasetPoint(cached[name], tuple(self._sums[name]))
                for name in sorted(self._sums)
            },
            evicted=evicted,
        )
        self.points.append(point)
        return point

    def _see(self, wid: str, name: str, st: Mapping[str, Any]) -> None:
        src = st.get("bytes_by_source")
        values = (
            _num(src, "local"),
            _num(src, "remote"),
            _num(src, "ufs"),
            _num(st, "hits"),
            _num(st, "misses"),
        )
        last = self._last.get((wid, name))
        if last is None:
            last = self._last[wid, name] = [0] * len(_COUNTERS)
        sums = self._sums.get(name)
        if sums is None:
            sums = self._sums[name] = [0] * len(_COUNTERS)
        for i, v in enumerate(values):
            # a counter that went down belongs to a restarted worker: all of it is new
            sums[i] += v - last[i] if v >= last[i] else v
            last[i] = v

    # --- reading ----------------------------------------------------------------------

    def window(self, seconds: float | None = None) -> list[Point]:
        pts = list(self.points)
        if seconds is None or not pts:
            return pts
        since = pts[-1].t - seconds
        return [p for p in pts if p.t >= since]

    def series(self, dataset: str | None = None, seconds: float | None = None) -> dict[str, Any]:
        """Chart series: for each point after the first, read rates by source (bytes/s)
        and the byte-weighted hit ratio over that step (None when nothing was read);
        for every point, cached bytes and (cluster only) tier use and workers up/down."""
        pts = self.window(seconds)
        out: dict[str, Any] = {"interval": self.interval, "t": [p.t for p in pts]}
        counters = [_counters(p, dataset) for p in pts]
        out["cached_bytes"] = [
            p.cached_bytes
            if dataset is None
            else (p.datasets[dataset].cached_bytes if dataset in p.datasets else 0)
            for p in pts
        ]
        rates: dict[str, list[float | None]] = {s: [None] for s in SOURCES} if pts else {}
        ratio: list[float | None] = [None] if pts else []
        for prev, cur, a, b in zip(pts, pts[1:], counters, counters[1:], strict=False):
            dt = max(1e-9, cur.t - prev.t)
            deltas = [max(0, y - x) for x, y in zip(a, b, strict=True)]
            for i, s in enumerate(SOURCES):
                rates[s].append(deltas[i] / dt)
            ratio.append(_ratio(deltas))
        out["read_bytes_per_s"] = rates
        out["hit_ratio"] = ratio
        if dataset is None:
            names = sorted({n for p in pts for n in p.tiers})
            out["tiers"] = {
                n: {
                    "used": [p.tiers.get(n, (0, 0))[0] for p in pts],
                    "capacity": [p.tiers.get(n, (0, 0))[1] for p in pts],
                }
                for n in names
            }
            out["workers_live"] = [p.workers_live for p in pts]
            out["workers_down"] = [p.workers_down for p in pts]
        return out

    def hit_ratio(self, seconds: float, dataset: str | None = None) -> float | None:
        """Byte-weighted hit ratio over the last ``seconds`` (None: nothing was read)."""
        pts = self.window(seconds)
        if len(pts) < 2:
            return None
        a, b = _counters(pts[0], dataset), _counters(pts[-1], dataset)
        return _ratio([max(0, y - x) for x, y in zip(a, b, strict=True)])

    def rates(self, dataset: str | None = None) -> dict[str, float]:
        """Read bytes/s by source over the last step (zeros before two points)."""
        pts = list(self.points)[-2:]
        if len(pts) < 2:
            return dict.fromkeys(SOURCES, 0.0)
        a, b = _counters(pts[0], dataset), _counters(pts[1], dataset)
        dt = max(1e-9, pts[1].t - pts[0].t)
        return {s: max(0, b[i] - a[i]) / dt for i, s in enumerate(SOURCES)}

    def evictions_per_s(self, worker_id: str) -> float | None:
        """Evicted bytes/s of one worker over the last step (None: not reported)."""
        pts = list(self.points)[-2:]
        if len(pts) < 2 or worker_id not in pts[1].evicted or worker_id not in pts[0].evicted:
            return None
        dt = max(1e-9, pts[1].t - pts[0].t)
        return max(0, pts[1].evicted[worker_id] - pts[0].evicted[worker_id]) / dt


def _counters(p: Point, dataset: str | None) -> tuple[int, ...]:
    if dataset is None:
        return p.counters
    d = p.datasets.get(dataset)
    return d.counters if d is not None else (0,) * len(_COUNTERS)


def _ratio(deltas: list[int]) -> float | None:
    """Cache bytes over all bytes read; else hits over reads; None when nothing moved."""
    nbytes = sum(deltas[: len(SOURCES)])
    if nbytes > 0:
        return (deltas[0] + deltas[1]) / nbytes
    reads = deltas[-2] + deltas[-1]
    return deltas[-2] / reads if reads else None

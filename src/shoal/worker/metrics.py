"""Prometheus metrics of one worker, read from its counters at scrape time.

Names, types, labels and meanings are in :mod:`shoal.core.metric_names` (and
``docs/metrics.md``): bytes, hits and misses by dataset and source, cached bytes and
files, tier capacity, use, pages and health, bytes evicted by reason (watermark: each
tier's own count; ttl and free: counted by the tiered store), corrupt pages, refused
drops, under-storage GETs, files and bytes moved between workers (in, out), data-path
connections and buffered bytes, and the worker-side read latency histogram
(:class:`ReadLatency`).

The data path only bumps plain ints (``ReadLatency.observe`` is a dict lookup and a
bisect); families are built when scraped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from shoal.core.metric_names import (
    EVICT_REASONS,
    READ_OPS,
    READ_SOURCES,
    TIER_STATES,
    Buckets,
    family,
)
from shoal.core.tokens import REASONS
from shoal.ufs.errors import RETRIES

#: the families built from the heartbeat snapshot
_SNAPSHOT_NAMES = (
    "shoal_read_bytes_total", "shoal_cache_hits_total", "shoal_cache_misses_total",
    "shoal_cached_bytes", "shoal_cached_files", "shoal_tier_capacity_bytes",
    "shoal_tier_used_bytes", "shoal_tier_pages", "shoal_corrupt_pages_total",
    "shoal_refused_drops_total", "shoal_ufs_requests_total",
)  # fmt: skip


class ReadLatency:
    """Worker-side read latency by op (read, locate, batch) and source (cache, ufs),
    from a request's arrival to its reply handed to the socket."""

    def __init__(self) -> None:
        self.by_key = {(op, src): Buckets() for op in READ_OPS for src in READ_SOURCES}

    def observe(self, op: str, source: str, seconds: float) -> None:
        b = self.by_key.get((op, source))
        if b is not None:
            b.observe(seconds)

    def add_to(self, fam: Any) -> None:
        for (op, src), b in self.by_key.items():
            fam.add_metric([op, src], b.cumulative(), b.sum)


class WorkerCollector(Collector):
    """Builds the worker's families from ``snapshot()`` (what heartbeats carry) and,
    given the worker, its store, data service and read latency."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], worker: Any = None) -> None:
        self._snapshot = snapshot
        self._worker = worker

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        f = {n: family(n) for n in _SNAPSHOT_NAMES}
        for name, d in s["datasets"].items():
            for src, n in d.get("bytes_by_source", {}).items():
                f["shoal_read_bytes_total"].add_metric([name, src], n)
            f["shoal_cache_hits_total"].add_metric([name], d.get("hits", 0))
            f["shoal_cache_misses_total"].add_metric([name], d.get("misses", 0))
            f["shoal_cached_bytes"].add_metric([name], d.get("cached_bytes", 0))
            f["shoal_cached_files"].add_metric([name], d.get("cached_files", 0))
        for t in s["tiers"]:
            f["shoal_tier_capacity_bytes"].add_metric([t["name"]], t["capacity"])
            f["shoal_tier_used_bytes"].add_metric([t["name"]], t["used"])
            f["shoal_tier_pages"].add_metric([t["name"]], t.get("pages", 0))
        f["shoal_corrupt_pages_total"].add_metric([], s.get("corrupt_pages", 0))
        f["shoal_refused_drops_total"].add_metric([], s.get("refused_drops", 0))
        f["shoal_ufs_requests_total"].add_metric([], s.get("ufs_requests", 0))
        yield from f.values()
        yield from _moved(s.get("moved") or {})
        retries = family("shoal_ufs_retries_total")
        for kind in ("store_retryable", "store_timeout"):
            retries.add_metric([kind], RETRIES.get(kind, 0))
        yield retries
        if self._worker is not None:
            yield from _store_metrics(self._worker.store)
            yield from _service_metrics(self._worker.service)


def _moved(moved: dict[str, Any]) -> Iterator[Metric]:
    """Files and bytes moved when the ring moved (shoal.worker.drain ``stats()``): in
    from previous owners, out handed over by a drain."""
    for what in ("files", "bytes"):
        fam = family(f"shoal_moved_{what}_total")
        for direction in ("in", "out"):
            fam.add_metric([direction], moved.get(f"{what}_{direction}", 0))
        yield fam


def _store_metrics(store: Any) -> Iterator[Metric]:
    health, evicted = family("shoal_tier_health"), family("shoal_evicted_bytes_total")
    dropped: dict[tuple[str, str], int] = getattr(store, "dropped", {})
    for tier in getattr(store, "tiers", ()):
        state = getattr(tier, "health", "normal")
        for st in TIER_STATES:
            health.add_metric([tier.name, st], 1 if st == state else 0)
        watermark = tier.usage().evicted_bytes
        for reason in EVICT_REASONS:
            n = watermark if reason == "watermark" else 0
            evicted.add_metric([tier.name, reason], n + dropped.get((tier.name, reason), 0))
    yield health
    yield evicted


def _service_metrics(service: Any) -> Iterator[Metric]:
    conns, buffered = family("shoal_worker_connections"), family("shoal_worker_buffered_bytes")
    conns.add_metric([], len(service.conns))
    buffered.add_metric([], service.buffered)
    yield conns
    yield buffered
    checks, refusals = family("shoal_worker_auth_checks_total"), family("shoal_worker_auth_refusals_total")  # fmt: skip
    checks.add_metric([], getattr(service, "auth_checks", 0))
    refused = getattr(service, "auth_refusals", {})
    for why in REASONS:
        refusals.add_metric([why], refused.get(why, 0))
    yield checks
    yield refusals
    latency = family("shoal_read_seconds")
    timings = getattr(service, "latency", None)
    if isinstance(timings, ReadLatency):
        timings.add_to(latency)
    yield latency


def render(snapshot: Callable[[], dict[str, Any]], worker: Any = None) -> bytes:
    """The text exposition. ``worker`` defaults to the object ``snapshot`` is a bound
    method of (``worker.snapshot``): its store and data service give the metrics that
    heartbeats do not carry."""
    if worker is None:
        worker = getattr(snapshot, "__self__", None)
        if not (hasattr(worker, "store") and hasattr(worker, "service")):
            worker = None
    reg = CollectorRegistry(auto_describe=False)
    reg.register(WorkerCollector(snapshot, worker))
    return generate_latest(reg)

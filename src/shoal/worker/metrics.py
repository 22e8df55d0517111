"""Prometheus metrics of one worker, read from its counters at scrape time.

Names and units (Prometheus conventions):

=================================  =======  ==========================================
shoal_read_bytes_total             counter  bytes served, by dataset and source
                                            (local | remote | ufs)
shoal_cache_hits_total             counter  reads served wholly from cache, by dataset
shoal_cache_misses_total           counter  reads that fetched from under storage
shoal_cached_bytes                 gauge    bytes cached, by dataset
shoal_cached_files                 gauge    files (versions) cached, by dataset
shoal_tier_capacity_bytes          gauge    by tier
shoal_tier_used_bytes              gauge    by tier
shoal_corrupt_pages_total          counter  pages dropped for a bad checksum (a reader's
                                            report is honoured only if the worker's own
                                            check of the page fails too)
shoal_refused_drops_total          counter  reports of a bad page whose bytes were good
                                            (ignored, nothing refetched)
shoal_ufs_requests_total           counter  under-storage GETs issued
=================================  =======  ==========================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class WorkerCollector(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        read = CounterMetricFamily(
            "shoal_read_bytes", "Bytes served by source", labels=["dataset", "source"]
        )
        hits = CounterMetricFamily(
            "shoal_cache_hits", "Reads served from cache", labels=["dataset"]
        )
        misses = CounterMetricFamily(
            "shoal_cache_misses", "Reads that fetched from under storage", labels=["dataset"]
        )
        cbytes = GaugeMetricFamily("shoal_cached_bytes", "Bytes cached", labels=["dataset"])
        cfiles = GaugeMetricFamily("shoal_cached_files", "Files cached", labels=["dataset"])
        for name, d in s["datasets"].items():
            for src, n in d.get("bytes_by_source", {}).items():
                read.add_metric([name, src], n)
            hits.add_metric([name], d.get("hits", 0))
            misses.add_metric([name], d.get("misses", 0))
            cbytes.add_metric([name], d.get("cached_bytes", 0))
            cfiles.add_metric([name], d.get("cached_files", 0))
        cap = GaugeMetricFamily("shoal_tier_capacity_bytes", "Tier capacity", labels=["tier"])
        used = GaugeMetricFamily("shoal_tier_used_bytes", "Tier bytes used", labels=["tier"])
        for t in s["tiers"]:
            cap.add_metric([t["name"]], t["capacity"])
            used.add_metric([t["name"]], t["used"])
        corrupt = CounterMetricFamily("shoal_corrupt_pages", "Pages dropped for a bad checksum")
        corrupt.add_metric([], s.get("corrupt_pages", 0))
        refused = CounterMetricFamily(
            "shoal_refused_drops", "Reports of a bad page whose bytes were good (ignored)"
        )
        refused.add_metric([], s.get("refused_drops", 0))
        ufs = CounterMetricFamily("shoal_ufs_requests", "Under-storage GETs issued")
        ufs.add_metric([], s.get("ufs_requests", 0))
        yield from (read, hits, misses, cbytes, cfiles, cap, used, corrupt, refused, ufs)


def render(snapshot: Callable[[], dict[str, Any]]) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(WorkerCollector(snapshot))
    return generate_latest(reg)

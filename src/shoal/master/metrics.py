"""Prometheus metrics of the master, computed at scrape time from its current state.

A custom collector reads membership, datasets and the latest worker stats when scraped,
so nothing is double-counted and no gauge goes stale. Each master owns its own
:class:`~prometheus_client.CollectorRegistry`, so several masters in one process (tests,
a local cluster) do not collide.

=====================================  =======  =====================================
name                                   type     labels / meaning
=====================================  =======  =====================================
shoal_master_workers                   gauge    state=live|expired
shoal_master_datasets                  gauge    datasets defined
shoal_ring_epoch                       gauge    current ring epoch
shoal_cached_bytes                     gauge    dataset; on live workers
shoal_cached_files                     gauge    dataset; on live workers
shoal_cache_hits_total                 counter  dataset; summed over known workers
shoal_cache_misses_total               counter  dataset; summed over known workers
shoal_read_bytes_total                 counter  dataset, source=local|remote|ufs
=====================================  =======  =====================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shoal.core.membership import WorkerRecord
from shoal.master.report import SOURCES, dataset_totals


@dataclass(frozen=True)
class Snapshot:
    """What one scrape reads from the master."""

    records: list[WorkerRecord]
    dataset_names: list[str]
    epoch: int


class _Families:
    """One fresh set of metric families per scrape."""

    def __init__(self) -> None:
        self.workers = GaugeMetricFamily(
            "shoal_master_workers", "Registered workers by state", labels=["state"]
        )
        self.datasets = GaugeMetricFamily("shoal_master_datasets", "Datasets defined")
        self.epoch = GaugeMetricFamily("shoal_ring_epoch", "Current ring epoch")
        self.cached_bytes = GaugeMetricFamily(
            "shoal_cached_bytes", "Bytes cached on live workers", labels=["dataset"]
        )
        self.cached_files = GaugeMetricFamily(
            "shoal_cached_files", "Files cached on live workers", labels=["dataset"]
        )
        self.hits = CounterMetricFamily(
            "shoal_cache_hits", "Reads served from the cache", labels=["dataset"]
        )
        self.misses = CounterMetricFamily(
            "shoal_cache_misses", "Reads that went to under storage", labels=["dataset"]
        )
        self.read_bytes = CounterMetricFamily(
            "shoal_read_bytes", "Bytes read, by where they came from", labels=["dataset", "source"]
        )

    def all(self) -> list[Metric]:
        return [
            self.workers,
            self.datasets,
            self.epoch,
            self.cached_bytes,
            self.cached_files,
            self.hits,
            self.misses,
            self.read_bytes,
        ]


class MasterCollector(Collector):
    """Builds every master metric from a fresh :class:`Snapshot` at each scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        # declared so the registry knows the names without collecting at register time
        yield from _Families().all()

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        f = _Families()
        live = sum(1 for r in snap.records if r.live)
        f.workers.add_metric(["live"], live)
        f.workers.add_metric(["expired"], len(snap.records) - live)
        f.datasets.add_metric([], len(snap.dataset_names))
        f.epoch.add_metric([], snap.epoch)
        for name, t in dataset_totals(snap.records, snap.dataset_names).items():
            f.cached_bytes.add_metric([name], t.cached_bytes)
            f.cached_files.add_metric([name], t.cached_files)
            f.hits.add_metric([name], t.hits)
            f.misses.add_metric([name], t.misses)
            for s in SOURCES:
                f.read_bytes.add_metric([name, s], t.by_source[s])
        yield from f.all()


def make_registry(snapshot: Callable[[], Snapshot]) -> CollectorRegistry:
    """A registry private to one master, holding only its collector."""
    registry = CollectorRegistry()
    registry.register(MasterCollector(snapshot))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition of ``registry``."""
    return generate_latest(registry)

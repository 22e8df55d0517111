"""Prometheus metrics of the master, computed at scrape time from its current state.

A custom collector reads membership, datasets, the latest worker stats and the jobs
when scraped, so nothing is double-counted and no gauge goes stale. Each master owns
its own :class:`~prometheus_client.CollectorRegistry`, so several masters in one
process (tests, a local cluster) do not collide.

Names, types, labels and meanings are in :mod:`shoal.core.metric_names` (and
``docs/metrics.md``): cluster gauges, per-worker up and heartbeat age, per-dataset
cached bytes and files (live workers), hits, misses and bytes by source (every known
worker), hit and cached ratios, and job progress for active jobs plus the last
:data:`~shoal.core.metric_names.JOBS_KEPT` finished ones (so the job labels stay
bounded).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from shoal.core import jobs as J
from shoal.core.membership import WorkerRecord
from shoal.core.metric_names import JOBS_KEPT, family
from shoal.master.report import SOURCES, dataset_totals
from shoal.proto.control import ReportResponse

if TYPE_CHECKING:
    from shoal.master.jobs import JobManager


@dataclass(frozen=True)
class Snapshot:
    """What one scrape reads from the master's membership."""

    records: list[WorkerRecord]
    dataset_names: list[str]
    epoch: int


class Service(Protocol):
    """What the collector reads from a master service beyond its :class:`Snapshot`."""

    jobs: JobManager

    def report(self) -> ReportResponse: ...


_NAMES = (
    "shoal_master_workers", "shoal_master_datasets", "shoal_ring_epoch",
    "shoal_cached_bytes", "shoal_cached_files", "shoal_cache_hits_total",
    "shoal_cache_misses_total", "shoal_read_bytes_total",
)  # fmt: skip
_SERVICE_NAMES = (
    "shoal_worker_up", "shoal_worker_heartbeat_age_seconds", "shoal_dataset_hit_ratio",
    "shoal_dataset_cached_ratio", "shoal_jobs", "shoal_job_files", "shoal_job_bytes",
    "shoal_job_active", "shoal_job_tasks", "shoal_job_deadline_timestamp_seconds",
    "shoal_moved_files_total", "shoal_moved_bytes_total",
)  # fmt: skip


class MasterCollector(Collector):
    """Builds every master metric from a fresh :class:`Snapshot` (and, given the
    service, its report and jobs) at each scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot], service: Service | None = None) -> None:
        self._snapshot = snapshot
        self._service = service

    def _names(self) -> tuple[str, ...]:
        return _NAMES + (_SERVICE_NAMES if self._service is not None else ())

    def describe(self) -> Iterator[Metric]:
        # declared so the registry knows the names without collecting at register time
        for name in self._names():
            yield family(name)

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        f = {name: family(name) for name in self._names()}
        for state in ("live", "expired", "draining", "left"):
            n = sum(1 for r in snap.records if r.state == state)
            f["shoal_master_workers"].add_metric([state], n)
        f["shoal_master_datasets"].add_metric([], len(snap.dataset_names))
        f["shoal_ring_epoch"].add_metric([], snap.epoch)
        for name, t in dataset_totals(snap.records, snap.dataset_names).items():
            f["shoal_cached_bytes"].add_metric([name], t.cached_bytes)
            f["shoal_cached_files"].add_metric([name], t.cached_files)
            f["shoal_cache_hits_total"].add_metric([name], t.hits)
            f["shoal_cache_misses_total"].add_metric([name], t.misses)
            for s in SOURCES:
                f["shoal_read_bytes_total"].add_metric([name, s], t.by_source[s])
        if self._service is not None:
            _report_metrics(f, self._service.report())
            _job_metrics(f, self._service.jobs)
        yield from f.values()


def _report_metrics(f: dict[str, Any], report: ReportResponse) -> None:
    totals: Any = report["totals"]
    for way in ("in", "out"):
        files = totals.get("moved_files" if way == "in" else "handed_over_files", 0)
        nbytes = totals.get("moved_bytes" if way == "in" else "handed_over_bytes", 0)
        f["shoal_moved_files_total"].add_metric([way], files)
        f["shoal_moved_bytes_total"].add_metric([way], nbytes)
    for w in report["workers"]:
        f["shoal_worker_up"].add_metric([w["id"]], 1 if w["state"] == "live" else 0)
        f["shoal_worker_heartbeat_age_seconds"].add_metric([w["id"]], w["last_heartbeat_age_s"])
    for d in report["datasets"]:
        looked = d["hits"] + d["misses"]
        f["shoal_dataset_hit_ratio"].add_metric([d["name"]], d["hits"] / looked if looked else 0)
        pct: Any = d.get("cached_pct")
        if isinstance(pct, int | float):
            f["shoal_dataset_cached_ratio"].add_metric([d["name"]], pct / 100.0)


def _job_metrics(f: dict[str, Any], jm: JobManager) -> None:
    jobs = jm.state.jobs()
    by_state: dict[str, int] = dict.fromkeys(J.ACTIVE + J.FINAL + (J.STOPPED,), 0)
    for j in jobs:
        by_state[j.state] = by_state.get(j.state, 0) + 1
    for state, n in by_state.items():
        f["shoal_jobs"].add_metric([state], n)
    ended = [j for j in jobs if j.state not in J.ACTIVE][-JOBS_KEPT:]
    shown = [j for j in jobs if j.state in J.ACTIVE] + ended
    next_run = {s.id: s.next_run for s in jm.state.schedules() if s.enabled}
    for j in shown:
        key = [j.id, j.spec.kind, j.spec.dataset]
        p = jm.progress(j)
        for count, n in (
            ("total", p.files_total),
            ("done", p.files_done),
            ("skipped", p.files_skipped),
            ("failed", p.files_failed),
        ):
            f["shoal_job_files"].add_metric([*key, count], n)
        f["shoal_job_bytes"].add_metric([*key, "total"], p.bytes_total)
        f["shoal_job_bytes"].add_metric([*key, "done"], p.bytes_done)
        active = j.state in J.ACTIVE
        f["shoal_job_active"].add_metric(key, 1 if active else 0)
        for state, n in jm.state.counts(j.id).items():
            f["shoal_job_tasks"].add_metric([*key, state], n)
        if active and j.schedule in next_run:
            f["shoal_job_deadline_timestamp_seconds"].add_metric(key, next_run[j.schedule])


def make_registry(
    snapshot: Callable[[], Snapshot], service: Service | None = None
) -> CollectorRegistry:
    """A registry private to one master, holding only its collector. ``service``
    defaults to the object ``snapshot`` is a bound method of (``service.snapshot``)."""
    if service is None:
        owner = getattr(snapshot, "__self__", None)
        if owner is not None and hasattr(owner, "report") and hasattr(owner, "jobs"):
            service = owner
    registry = CollectorRegistry()
    registry.register(MasterCollector(snapshot, service))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition of ``registry``."""
    return generate_latest(registry)

"""The one table of every Prometheus metric shoal exports: name, type, labels, unit,
meaning and which processes export it.

The master, worker and FUSE collectors build their metric families from this table
(:func:`spec`), the gateways' are checked against it in tests, and ``docs/metrics.md``
is generated from it (``python -m shoal.cli.metrics_doc``), so the table cannot drift
from what is exported. Names follow Prometheus conventions: counters end in ``_total``
(the name here is the exposed one), sizes are ``_bytes``, durations ``_seconds``,
ratios 0..1.

Labels are bounded: datasets, tiers, workers, operations, sources, reasons, and job
ids of active jobs plus the last few finished ones. Nothing is labelled by path, file
or key.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

#: who exports a metric
MASTER, WORKER, FUSE, GATEWAY = "master", "worker", "fuse", "gateway"

#: where read bytes came from (worker view): local and remote cache hits, under storage
SOURCES = ("local", "remote", "ufs")
#: why pages left a tier
EVICT_REASONS = ("watermark", "ttl", "free")
#: a tier's health (shoal.store.health)
TIER_STATES = ("normal", "unstable", "down")
#: worker-side read latency: whether the pages were cached or fetched from under storage
READ_SOURCES = ("cache", "ufs")
#: data-path operations timed at the worker
READ_OPS = ("read", "locate", "batch")
#: FUSE operations timed by the daemon (the per-file and per-byte costs)
FUSE_TIMED_OPS = ("LOOKUP", "OPEN", "READ")
#: finished jobs kept in the job gauges besides active ones
JOBS_KEPT = 10

#: seconds: local hits in tens of microseconds, cold reads of large files in seconds
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    type: str
    labels: tuple[str, ...]
    unit: str
    help: str
    exporters: tuple[str, ...]

    @property
    def family(self) -> str:
        """The name prometheus_client takes for a family (counters without _total)."""
        return self.name.removesuffix("_total") if self.type == COUNTER else self.name


def _m(name: str, type: str, labels: str, unit: str, help: str, *exporters: str) -> MetricSpec:
    return MetricSpec(name, type, tuple(labels.split()), unit, help, exporters)


_C, _G, _H = COUNTER, GAUGE, HISTOGRAM
_MW = (MASTER, WORKER)

# fmt: off
METRICS: tuple[MetricSpec, ...] = (
    # -- cluster (master) ---------------------------------------------------------------
    _m("shoal_master_workers", _G, "state", "workers",
       "Registered workers by state (live, expired, draining, left)", MASTER),
    _m("shoal_master_datasets", _G, "", "datasets", "Datasets defined", MASTER),
    _m("shoal_ring_epoch", _G, "", "epoch", "Current ring epoch", MASTER),
    _m("shoal_worker_up", _G, "worker", "bool",
       "1 while the worker heartbeats within its expiry, else 0", MASTER),
    _m("shoal_worker_heartbeat_age_seconds", _G, "worker", "seconds",
       "Seconds since the worker's last heartbeat", MASTER),
    _m("shoal_dataset_hit_ratio", _G, "dataset", "ratio",
       "Hits / (hits + misses) since the workers started (0..1)", MASTER),
    _m("shoal_dataset_cached_ratio", _G, "dataset", "ratio",
       "Cached bytes / dataset bytes in its manifest (0..1; absent without a manifest)",
       MASTER),
    _m("shoal_moved_files_total", _C, "direction", "files",
       "Files moved between workers when the ring moved: in (a new owner got it from "
       "a previous owner, not from under storage), out (a draining worker handed it "
       "over); the master's: summed over every known worker", *_MW),
    _m("shoal_moved_bytes_total", _C, "direction", "bytes",
       "Bytes moved between workers when the ring moved (in, out: as "
       "shoal_moved_files_total)", *_MW),
    _m("shoal_jobs", _G, "state", "jobs", "Jobs the master knows, by state", MASTER),
    _m("shoal_job_files", _G, "job_id kind dataset count", "files",
       "Files of an active or recent job: count=total|done|skipped|failed", MASTER),
    _m("shoal_job_bytes", _G, "job_id kind dataset count", "bytes",
       "Bytes of an active or recent job: count=total|done", MASTER),
    _m("shoal_job_active", _G, "job_id kind dataset", "bool",
       "1 while the job is pending, listing or running; 0 once it ended", MASTER),
    _m("shoal_job_tasks", _G, "job_id kind dataset state", "tasks",
       "A job's tasks by state (pending tasks are the job's queue)", MASTER),
    _m("shoal_job_deadline_timestamp_seconds", _G, "job_id kind dataset", "unix seconds",
       "When a scheduled job should be done: its schedule's next run", MASTER),
    # -- cache (worker; the master sums live workers) -----------------------------------
    _m("shoal_cached_bytes", _G, "dataset", "bytes",
       "Bytes cached (master: on live workers)", *_MW),
    _m("shoal_cached_files", _G, "dataset", "files",
       "Files (versions) cached (master: on live workers)", *_MW),
    _m("shoal_cache_hits_total", _C, "dataset", "reads",
       "Reads served wholly from the cache, including a local client's own reads of "
       "handed-over descriptors", *_MW),
    _m("shoal_cache_misses_total", _C, "dataset", "reads",
       "Reads that fetched from under storage", *_MW),
    _m("shoal_read_bytes_total", _C, "dataset source", "bytes",
       "Bytes read by source: local (same-host client), remote (over TCP), ufs "
       "(fetched from under storage)", *_MW),
    _m("shoal_read_seconds", _H, "op source", "seconds",
       "Worker-side read latency, request in to reply handed to the socket, by op "
       "(read, locate, batch) and source (cache, ufs)", WORKER),
    _m("shoal_tier_capacity_bytes", _G, "tier", "bytes", "Tier capacity", WORKER),
    _m("shoal_tier_used_bytes", _G, "tier", "bytes", "Tier bytes used", WORKER),
    _m("shoal_tier_pages", _G, "tier", "pages", "Pages stored in the tier", WORKER),
    _m("shoal_tier_health", _G, "tier state", "bool",
       "1 for the tier's current health state (normal, unstable: recent I/O errors, "
       "down: skipped)", WORKER),
    _m("shoal_evicted_bytes_total", _C, "tier reason", "bytes",
       "Bytes dropped from a tier by reason: watermark (eviction to make room), ttl "
       "(expired), free (a free job, a dataset deleted, a stale version)", WORKER),
    _m("shoal_corrupt_pages_total", _C, "", "pages",
       "Pages dropped for a bad checksum (a reader's report counts only if the "
       "worker's own check fails too)", WORKER),
    _m("shoal_refused_drops_total", _C, "", "reports",
       "Reports of a bad page whose bytes were good (ignored, nothing refetched)", WORKER),
    _m("shoal_ufs_requests_total", _C, "", "requests", "Under-storage GETs issued", WORKER),
    _m("shoal_ufs_retries_total", _C, "kind", "retries",
       "Under-storage requests retried, by the error that caused it (store_retryable, "
       "store_timeout)", WORKER),
    _m("shoal_worker_connections", _G, "", "connections",
       "Open data-path connections (TCP and Unix socket)", WORKER),
    _m("shoal_worker_buffered_bytes", _G, "", "bytes",
       "Bytes held for incomplete request frames (capped)", WORKER),
    _m("shoal_worker_auth_checks_total", _C, "", "tokens",
       "Data-path tokens verified (one per connection's HELLO, with a cluster secret)",
       WORKER),
    _m("shoal_worker_auth_refusals_total", _C, "reason", "refusals",
       "Data-path connections or requests refused for their token: missing, expired, "
       "bad_signature, malformed, dataset (a reader token for another dataset)", WORKER),
    # -- FUSE daemon (one per mount) ----------------------------------------------------
    _m("shoal_fuse_requests_total", _C, "op", "requests", "FUSE requests by operation", FUSE),
    _m("shoal_fuse_errors_total", _C, "errno", "replies", "FUSE error replies by errno", FUSE),
    _m("shoal_fuse_request_seconds", _H, "op", "seconds",
       "FUSE request latency in the daemon, request read to reply written "
       "(LOOKUP, OPEN, READ)", FUSE),
    _m("shoal_fuse_inflight", _G, "", "requests",
       "FUSE requests waiting on the client (the daemon's queue)", FUSE),
    _m("shoal_fuse_read_bytes_total", _C, "", "bytes", "Bytes served by READ", FUSE),
    _m("shoal_fuse_opens_total", _C, "mode", "opens",
       "File opens by mode (passthrough: the kernel reads the worker's file)", FUSE),
    _m("shoal_fuse_client_calls_total", _C, "", "requests",
       "FUSE requests that needed the client", FUSE),
    _m("shoal_fuse_notifications_total", _C, "", "messages",
       "Invalidations sent to the kernel", FUSE),
    _m("shoal_fuse_backing_files", _G, "", "files", "Passthrough backing files open", FUSE),
    _m("shoal_fuse_inodes", _G, "", "inodes", "Inodes known to the kernel", FUSE),
    _m("shoal_fuse_passthrough", _G, "", "bool", "1 if the kernel granted passthrough", FUSE),
    _m("shoal_fuse_client_reads_total", _C, "source", "reads",
       "The mount's client reads by source (short_circuit, local, remote, ufs)", FUSE),
    _m("shoal_fuse_client_read_bytes_total", _C, "source", "bytes",
       "The mount's client bytes by source (short_circuit, local, remote, ufs)", FUSE),
    _m("shoal_fuse_client_failovers_total", _C, "", "reads",
       "The mount's client reads retried on the next owner of a file", FUSE),
    _m("shoal_fallback_reads_total", _C, "interface cause", "reads",
       "Reads a client served from under storage because no worker could, by "
       "interface (fuse) and cause", FUSE),
    # -- gateways (shoal.gateway.metrics) -----------------------------------------------
    _m("shoal_gateway_requests_total", _C, "gateway op status", "requests",
       "Gateway requests by operation and HTTP status", GATEWAY),
    _m("shoal_gateway_bytes_total", _C, "gateway op", "bytes",
       "Body bytes a gateway sent (reads) or received (writes)", GATEWAY),
    _m("shoal_gateway_request_seconds", _H, "gateway op", "seconds",
       "Gateway request latency (until the whole body was handed to the socket)", GATEWAY),
)
# fmt: on

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


def spec(name: str) -> MetricSpec:
    """The table's entry for ``name`` (KeyError: a metric missing from the table)."""
    return BY_NAME[name]


def family(name: str) -> Any:
    """An empty metric family for ``name`` with the table's help and labels (Any: the
    three family classes' ``add_metric`` differ)."""
    s = BY_NAME[name]
    kind = {COUNTER: CounterMetricFamily, GAUGE: GaugeMetricFamily}.get(
        s.type, HistogramMetricFamily
    )
    return kind(s.family, s.help, labels=list(s.labels))


def base_name(sample: str) -> str:
    """The table name a sample or series name belongs to: histogram suffixes and a
    counter's ``_created`` off."""
    for suffix in ("_bucket", "_sum", "_count", "_created"):
        if sample.endswith(suffix) and sample.removesuffix(suffix) in BY_NAME:
            return sample.removesuffix(suffix)
    if sample.endswith("_created") and sample.replace("_created", "_total") in BY_NAME:
        return sample.replace("_created", "_total")
    return sample


#: a series selector: a name followed by { or [ (a call is followed by "(")
_SELECTOR = re.compile(r"(?<![\w\"'$.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[\{\[]")
_SHOAL = re.compile(r"(?<![\w\"'])shoal_[a-z0-9_]+")
_STRING = re.compile(r'"[^"]*"')


def promql_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (any shoal_* name, and any name
    before { or [), histogram and ``_created`` suffixes mapped to the table's names;
    label values (strings) are ignored. For checking dashboards and alert rules."""
    bare = _STRING.sub('""', expr)
    return {base_name(n) for n in set(_SHOAL.findall(bare)) | set(_SELECTOR.findall(bare))}


class Buckets:
    """A label-less latency histogram as plain ints: ``observe`` is a bisect and two
    adds, cheap enough for a per-request hot path (no lock: one event loop)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count)`` pairs as a histogram family takes them, +Inf last."""
        out, acc = [], 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            out.append((repr(float(bound)), float(acc)))
        out.append(("+Inf", float(acc + self.counts[-1])))
        return out

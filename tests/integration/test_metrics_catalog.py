"""The metric table (shoal.core.metric_names, docs/metrics.md) against live scrapes of
a real master, two workers, a FUSE mount and a gateway's registry: every metric of the
table is exported by the processes it names, with its type and labels; every shoal_*
metric exported is in the table; label values stay bounded; the dashboard's and the
alert rules' queries name exported metrics; and the numbers say what happened (a load
job's files, a free job's evicted bytes, FUSE reads timed)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from shoal.cli.metrics_doc import render
from shoal.core.metric_names import (
    BY_NAME,
    COUNTER,
    FUSE,
    GATEWAY,
    MASTER,
    METRICS,
    WORKER,
    base_name,
    promql_names,
)
from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.fuse import can_mount, mounted
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: no label may name a file; no label may take more values than this in a small cluster
FORBIDDEN_LABELS = {"path", "file", "key", "filename", "object"}
MAX_VALUES = 40


@dataclass
class Family:
    name: str  # the table's name (a counter's with _total)
    type: str
    labels: set[str]
    samples: list[tuple[str, dict[str, str], float]]


@dataclass
class Scrapes:
    by_role: dict[str, list[dict[str, Family]]] = field(default_factory=lambda: defaultdict(list))
    files: dict[str, bytes] = field(default_factory=dict)
    job: dict[str, Any] = field(default_factory=dict)

    def names(self, role: str | None = None) -> set[str]:
        roles = [role] if role else list(self.by_role)
        return {n for r in roles for s in self.by_role[r] for n in s}

    def value(self, role: str, name: str, **labels: str) -> float:
        total = 0.0
        for s in self.by_role[role]:
            fam = s.get(base_name(name))
            for sname, lab, v in fam.samples if fam else []:
                if sname == name and all(lab.get(k) == x for k, x in labels.items()):
                    total += v
        return total


def parse(text: str) -> dict[str, Family]:
    out = {}
    for f in text_string_to_metric_families(text):
        if f.name.endswith("_created") and base_name(f.name) != f.name:
            continue  # a prometheus_client counter's creation time, part of the counter
        name = f.name + "_total" if f.type == COUNTER else f.name
        labels = {k for s in f.samples for k in s.labels if k != "le"}
        out[name] = Family(name, f.type, labels, [(s.name, s.labels, s.value) for s in f.samples])
    return out


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def _wait_job(c: Any, job_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        v: dict[str, Any] = c.job(job_id)
        if v["state"] in ("done", "failed", "stopped") or time.monotonic() > deadline:
            return v
        time.sleep(0.1)


def _gateway_text() -> str:
    gw = pytest.importorskip("shoal.gateway.metrics")
    m = gw.GatewayMetrics("s3")
    m.observe("GetObject", 200, 1234, 0.002)
    return str(m.text().decode())


def _quiet_scrape(port: int, timeout: float = 10.0) -> dict[str, Family]:
    """The mount's metrics once no request is in flight: the kernel's readahead can
    still be reading after read_bytes() returned, and a request is counted when it
    arrives but timed when it is answered. (After the deadline: the last scrape, for
    the tests to judge.)"""
    deadline = time.monotonic() + timeout
    while True:
        fams = parse(_get(f"http://127.0.0.1:{port}/metrics"))
        one = Scrapes()
        one.by_role[FUSE].append(fams)
        quiet = one.value(FUSE, "shoal_fuse_inflight") == 0 and one.value(
            FUSE, "shoal_fuse_requests_total", op="READ"
        ) == one.value(FUSE, "shoal_fuse_request_seconds_count", op="READ")
        if quiet or time.monotonic() > deadline:
            return fams
        time.sleep(0.05)


@pytest.fixture(scope="module")
def scrapes(
    moto: MotoServer, s3_credentials: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scrapes]:
    base = tmp_path_factory.mktemp("metrics")
    files = sample_files(12, 100, 60_000, seed=17)
    files.update({f"b/{k}": v for k, v in sample_files(4, 100, 20_000, seed=18).items()})
    make_bucket(moto.endpoint, "metrics-catalog", files)
    cluster: TestCluster = start_cluster(base / "cluster", workers=2, mem="64MiB")
    out = Scrapes(files={f"/ds/data/{k}": v for k, v in files.items()})
    try:
        cluster.s3_dataset("metrics-catalog", moto.endpoint)
        with cluster.client(short_circuit=False) as c:
            out.job = _wait_job(c, c.submit_job({"kind": "load", "dataset": "ds"})["id"])
            for p, data in out.files.items():
                assert c.read(p) == data
            freed = _wait_job(c, c.submit_job({"kind": "free", "dataset": "ds", "paths": ["data/b"]})["id"])  # fmt: skip
            assert freed["state"] == "done", freed
        if can_mount():
            with mounted(cluster.master_url, base, "--no-passthrough") as m:
                for p, data in list(out.files.items())[:6]:
                    assert (m.path / p.lstrip("/")).read_bytes() == data
                out.by_role[FUSE].append(_quiet_scrape(m.state["metrics_port"]))
        for i in range(2):
            w = json.loads((cluster.worker_dir(i) / "worker.json").read_text())
            out.by_role[WORKER].append(parse(_get(f"http://127.0.0.1:{w['metrics_port']}/metrics")))  # fmt: skip
        out.by_role[MASTER].append(parse(_get(cluster.master_url + "/metrics")))
        out.by_role[GATEWAY].append(parse(_gateway_text()))
        yield out
    finally:
        cluster.stop()


def test_docs_are_generated_from_the_table() -> None:
    doc = (ROOT / "docs/metrics.md").read_text()
    assert doc == render(), (
        "docs/metrics.md drifted: python -m shoal.cli.metrics_doc > docs/metrics.md"
    )
    for m in METRICS:
        assert f"| `{m.name}` |" in doc


def test_every_exported_metric_is_in_the_table(scrapes: Scrapes) -> None:
    for role, texts in scrapes.by_role.items():
        for fams in texts:
            for name, f in fams.items():
                if not name.startswith("shoal_"):
                    continue
                spec = BY_NAME.get(name)
                assert spec is not None, f"{role} exports {name}, missing from the table"
                assert role in spec.exporters, (role, name)
                assert f.type == spec.type, (name, f.type, spec.type)
                assert f.labels <= set(spec.labels), (name, f.labels, spec.labels)


@pytest.mark.parametrize("role", [MASTER, WORKER, GATEWAY, FUSE])
def test_every_metric_of_the_table_is_exported(scrapes: Scrapes, role: str) -> None:
    if role == FUSE and not can_mount():
        pytest.skip("needs /dev/fuse and root to scrape a FUSE daemon")
    want = {m.name for m in METRICS if role in m.exporters}
    missing = want - scrapes.names(role)
    assert not missing, f"{role} does not export {sorted(missing)}"


def test_label_values_are_bounded(scrapes: Scrapes) -> None:
    values: dict[tuple[str, str], set[str]] = defaultdict(set)
    for texts in scrapes.by_role.values():
        for fams in texts:
            for name, f in fams.items():
                assert not f.labels & FORBIDDEN_LABELS, (name, f.labels)
                for _, labels, _ in f.samples:
                    for k, v in labels.items():
                        values[(name, k)].add(v)
    for (name, label), seen in values.items():
        assert len(seen) <= MAX_VALUES, (name, label, len(seen))
        if label not in ("le", "worker", "job_id"):
            assert not any("/" in v for v in seen), (name, label, seen)  # never a path


def test_dashboard_and_alerts_query_exported_metrics(scrapes: Scrapes) -> None:
    exported = scrapes.names()
    if not can_mount():
        exported |= {m.name for m in METRICS if FUSE in m.exporters}  # checked when mountable
    dash = json.loads((ROOT / "deploy/grafana/shoal.json").read_text())
    rules = yaml.safe_load((ROOT / "deploy/prometheus/rules.yaml").read_text())
    exprs = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]
    for where, expr in exprs:
        unknown = promql_names(expr) - exported
        assert not unknown, (where, unknown)


def test_numbers_say_what_happened(scrapes: Scrapes) -> None:
    s, n = scrapes, len(scrapes.files)
    assert s.value(MASTER, "shoal_worker_up") == 2
    assert s.value(MASTER, "shoal_master_workers", state="live") == 2
    job = s.job["id"]
    assert s.value(MASTER, "shoal_job_files", job_id=job, count="total") == n
    done = s.value(MASTER, "shoal_job_files", job_id=job, count="done")
    skipped = s.value(MASTER, "shoal_job_files", job_id=job, count="skipped")
    assert done + skipped == n and done == s.job["files_done"]
    assert s.value(MASTER, "shoal_job_bytes", job_id=job, count="done") == s.job["bytes_done"]
    assert s.value(MASTER, "shoal_job_active", job_id=job) == 0
    assert s.value(MASTER, "shoal_jobs", state="done") == 2
    # the free job dropped the four files under data/b, counted as reason=free
    freed = sum(len(v) for k, v in s.files.items() if k.startswith("/ds/data/b/"))
    assert s.value(WORKER, "shoal_evicted_bytes_total", reason="free") >= freed
    assert s.value(WORKER, "shoal_evicted_bytes_total", reason="ttl") == 0
    assert s.value(WORKER, "shoal_tier_health", state="normal") == 4  # 2 workers x 2 tiers
    hits = s.value(MASTER, "shoal_cache_hits_total", dataset="ds")
    misses = s.value(MASTER, "shoal_cache_misses_total", dataset="ds")
    assert hits > 0
    ratio = s.value(MASTER, "shoal_dataset_hit_ratio", dataset="ds")
    assert ratio == pytest.approx(hits / (hits + misses))
    assert s.value(GATEWAY, "shoal_gateway_request_seconds_count", op="GetObject") == 1


@pytest.mark.skipif(not can_mount(), reason="needs /dev/fuse and root")
def test_fuse_reads_are_timed(scrapes: Scrapes) -> None:
    s = scrapes
    reads = s.value(FUSE, "shoal_fuse_requests_total", op="READ")
    assert reads >= 6
    assert s.value(FUSE, "shoal_fuse_request_seconds_count", op="READ") == reads
    assert s.value(FUSE, "shoal_fuse_request_seconds_count", op="OPEN") == s.value(
        FUSE, "shoal_fuse_requests_total", op="OPEN"
    )
    assert s.value(FUSE, "shoal_fuse_request_seconds_bucket", op="READ", le="+Inf") == reads
    assert s.value(FUSE, "shoal_fuse_request_seconds_sum", op="READ") > 0
    assert s.value(FUSE, "shoal_fuse_client_read_bytes_total") > 0


def test_worker_reads_are_timed(scrapes: Scrapes) -> None:
    # every file was read once over TCP after the load: warm READs, timed by the workers
    s = scrapes
    n = len(s.files)
    assert s.value(WORKER, "shoal_read_seconds_count", op="read", source="cache") >= n
    assert s.value(WORKER, "shoal_read_seconds_bucket", op="read", source="cache", le="+Inf") >= n
    assert s.value(WORKER, "shoal_read_seconds_sum", op="read") > 0

"""Client behaviour that DataLoader workers rely on (fork, pickle) and the metrics."""

from __future__ import annotations

import json
import os
import pickle
import urllib.request

import pytest

from shoal.client import Client
from shoal.testing.cluster import TestCluster, sample_files
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration


def _seed(moto: MotoServer, cluster: TestCluster, bucket: str, n: int = 40) -> dict[str, bytes]:
    files = sample_files(n, 100, 80_000, seed=21)
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint)
    return {f"/ds/data/{k}": v for k, v in files.items()}


def test_client_survives_fork_and_pickle(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = _seed(moto, cluster, bucket)
    paths = list(files)
    with cluster.client() as c:
        for p in paths[:20]:  # the parent warms half and holds descriptors and a loop thread
            assert c.read(p) == files[p]
        pid = os.fork()
        if pid == 0:  # child: same object, no loop thread, inherited descriptors
            ok = all(c.read(p) == files[p] for p in paths)
            ok = ok and c.counters()["short_circuit"] >= 20
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        for p in paths:  # the parent still works
            assert c.read(p) == files[p]
        clone = pickle.loads(pickle.dumps(c))
    assert isinstance(clone, Client)
    with clone:
        assert all(clone.read(p) == files[p] for p in paths)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def test_metrics_on_master_and_workers(moto: MotoServer, cluster: TestCluster, bucket: str) -> None:
    files = _seed(moto, cluster, bucket, n=10)
    with cluster.client(short_circuit=False) as c:
        for p in files:
            assert c.read(p) == files[p]
    w = json.loads((cluster.worker_dir(0) / "worker.json").read_text())
    text = _get(f"http://127.0.0.1:{w['metrics_port']}/metrics")
    for name in (
        "shoal_read_bytes_total",
        "shoal_cache_hits_total",
        "shoal_cache_misses_total",
        "shoal_cached_bytes",
        "shoal_tier_used_bytes",
    ):
        assert name in text, name
    assert 'source="ufs"' in text
    master = _get(cluster.master_url + "/metrics")
    assert "shoal_ring_epoch" in master and "shoal_cached_bytes" in master


def test_fallback_reads_are_counted_by_cause(
    moto: MotoServer, tmp_path: object, bucket: str, s3_credentials: None
) -> None:
    from pathlib import Path

    from shoal.testing.cluster import start_cluster

    c = start_cluster(Path(str(tmp_path)) / "c", workers=1)
    try:
        files = _seed(moto, c, bucket, n=3)
        with c.client(short_circuit=False) as cl:
            first = next(iter(files))
            assert cl.read(first) == files[first]  # learns the ring and the dataset
            c.kill_worker(0)
            for path, data in files.items():
                assert cl.read(path) == data  # from the store, counted
            n = cl.counters()["ufs_fallback"]
            causes = cl.aio.cache.counters.fallback_causes
            assert n >= len(files) - 1 and sum(causes.values()) == n, causes
            assert set(causes) <= {"unavailable", "no_worker"}, causes
            assert "fallback_causes" not in cl.counters()  # counters() stays int-valued
    finally:
        c.stop()

"""A worker whose disk tier is declared far larger than its filesystem (a small tmpfs
declared 1 GiB): loads must evict or report failures, never claim files that were not
cached, and the log must not get one warning per refused put."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.reports import dataset_of, wait_report
from shoal.testing.s3 import CountingProxy, MotoServer, make_bucket
from shoal.testing.store_disk import small_tmpfs

pytestmark = pytest.mark.integration

TMPFS = 8 << 20


@pytest.fixture
def full_disk_cluster(tmp_path: Path, s3_credentials: None) -> Iterator[TestCluster]:
    """One worker whose ssd tier (declared 1 GiB) lives on an 8 MiB tmpfs."""
    cdir = tmp_path / "cluster"
    with small_tmpfs(cdir / "worker-0" / "cache", "8m"):
        c = start_cluster(cdir, workers=1, disk="1GiB")
        try:
            yield c
        finally:
            c.stop()


def shoal(c: TestCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SHOAL_MASTER=c.master_url, **c.env)
    return subprocess.run(
        [sys.executable, "-m", "shoal", *args], env=env, capture_output=True, text=True, timeout=120
    )


def load(c: TestCluster, path: str) -> dict[str, Any]:
    r = shoal(c, "load", path, "--wait", "--json")
    assert r.stdout, r.stderr
    view: dict[str, Any] = json.loads(r.stdout)
    return view


def cached_files(c: TestCluster, name: str, ok: Any, timeout: float = 10) -> int:
    """The dataset's cached files as the report says, once ``ok(n)`` (heartbeats lag)."""

    def n_of(r: dict[str, Any]) -> int:
        return int((dataset_of(r, name) or {}).get("cached_files", 0))

    return n_of(wait_report(c, lambda r: bool(ok(n_of(r))), timeout))


def storm_lines(c: TestCluster) -> list[str]:
    text = (c.dir / "worker-0.log").read_text(errors="replace")
    return [
        line
        for line in text.splitlines()
        if "No space left" in line or "cannot store" in line or "refused" in line
    ]


def test_load_larger_than_the_disk_evicts_and_what_is_done_is_cached(
    moto: MotoServer, full_disk_cluster: TestCluster, bucket: str
) -> None:
    c = full_disk_cluster
    old = sample_files(160, 90_000, 110_000, seed=5, prefix="old/")  # ~16 MB: twice the disk
    new = sample_files(20, 90_000, 110_000, seed=6, prefix="new/")
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, {**old, **new})
        c.s3_dataset(bucket, proxy.endpoint)
        v = load(c, "/ds/data/old")
        assert v["files_done"] + v["files_failed"] + v["files_skipped"] == len(old), v
        assert v["files_done"] == len(old), v  # unpinned data makes room for itself
        st = os.statvfs(c.worker_dir(0) / "cache")
        assert st.f_bavail * st.f_frsize > 0, "the tier filled its disk instead of evicting"
        # a later load evicts the older data: every file it reports done is cached
        v = load(c, "/ds/data/new")
        assert (v["files_done"], v["files_failed"]) == (len(new), 0), v
        proxy.reset()
        with c.client(short_circuit=False) as cl:
            for k, data in new.items():
                assert cl.read(f"/ds/data/{k}") == data
        assert proxy.counts() == {}, "files the load reported done were not cached"
    assert len(storm_lines(c)) <= 5, storm_lines(c)[:10]


def test_pinned_load_larger_than_the_disk_reports_what_did_not_fit(
    moto: MotoServer, full_disk_cluster: TestCluster, bucket: str
) -> None:
    c = full_disk_cluster
    files = sample_files(160, 90_000, 110_000, seed=7)  # ~16 MB, nothing may be evicted
    make_bucket(moto.endpoint, bucket, files)
    c.s3_dataset(bucket, moto.endpoint, {"pin": "true"})
    v = load(c, "/ds")
    assert v["files_done"] + v["files_failed"] + v["files_skipped"] == len(files), v
    assert v["files_failed"] > 0 and v["files_done"] > 0, v
    assert all("cache full" in why for _, why in v["failures"]), v["failures"][:3]
    # every file reported done is cached (pinned: none was evicted)
    n = cached_files(c, "ds", lambda n: n == v["files_done"])
    assert n == v["files_done"]
    with c.client() as cl:  # what did not fit is still served (from the store)
        for k in list(files)[-5:]:
            assert cl.read(f"/ds/data/{k}") == files[k]
    assert len(storm_lines(c)) <= 5, storm_lines(c)[:10]

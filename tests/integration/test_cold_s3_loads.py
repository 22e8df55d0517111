"""A load job of S3 files through the worker's plain-HTTP GETs (shoal.ufs.rawget):
every file cached byte-exact after exactly one GET each (none for an empty file), a
large file page by page, and readers afterwards served without any further GET."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from shoal.testing.cluster import TestCluster, sample_files
from shoal.testing.s3 import CountingProxy, MotoServer, make_bucket

pytestmark = pytest.mark.integration

MiB = 1 << 20


def _wait_job(cluster: TestCluster, job_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with cluster.client() as c:
        while True:
            v = c.job(job_id)
            if v["state"] in ("done", "failed", "cancelled") or time.monotonic() > deadline:
                return v
            time.sleep(0.1)


def test_a_load_of_s3_files_is_exact_with_one_get_each(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = sample_files(150, 1, 200_000, seed=61)
    files["empty.bin"] = b""
    files["big.bin"] = os.urandom(2 * MiB + 17)  # three pages
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, files)
        cluster.s3_dataset(bucket, proxy.endpoint, {"page_size": "1MiB"})
        with cluster.client() as c:
            job = c.submit_job({"kind": "load", "dataset": "ds", "paths": [""]})
        v = _wait_job(cluster, job["id"])
        assert v["state"] == "done", v
        assert v["files_failed"] == 0 and v["files_done"] == len(files), v
        counts = proxy.counts()
        # one ranged GET per non-empty small file, one per page of the large one
        assert counts.get("GET_range", 0) == (len(files) - 2) + 3, counts
        proxy.reset()
        with cluster.client() as c:
            for key, data in files.items():
                assert c.read(f"/ds/data/{key}") == data, key
        assert proxy.counts().get("GET_range", 0) == 0, proxy.counts()

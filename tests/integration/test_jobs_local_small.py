"""Loads of many small files from a file:// mount, where workers read a task's small
files in groups (one under-storage call per group) and store each group as one run:
every file is counted exactly once, across a worker lost mid-load too; when the job
says done the files are in the index a restarted worker reads (a second load skips
them all); and every byte served is the file's."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shoal.core.types import Mount
from shoal.testing.cluster import TestCluster
from shoal.testing.jobs import start_job_cluster

pytestmark = pytest.mark.integration

MiB = 1 << 20


def make_files(root: Path, n: int, seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {f"d{i % 7}/f{i:05d}.bin": rng.randbytes(rng.randint(1, 4096)) for i in range(n)}
    files["empty.bin"] = b""
    files["big/a.bin"] = rng.randbytes(2 * MiB + 3)  # larger than a page: loaded alone
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def shoal(cluster: TestCluster, *args: str) -> dict[str, Any]:
    env = dict(os.environ, SHOAL_MASTER=cluster.master_url, **cluster.env)
    r = subprocess.run(
        [sys.executable, "-m", "shoal", *args, "--wait", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def counts(v: dict[str, Any]) -> tuple[int, int, int, int]:
    return v["files_done"], v["files_skipped"], v["files_failed"], v["files_total"]


def test_a_local_load_counts_every_file_and_is_in_the_index_when_done(
    tmp_path: Path, s3_credentials: None
) -> None:
    root = tmp_path / "src"
    files = make_files(root, 900, seed=7)
    n = len(files)
    c = start_job_cluster(tmp_path / "c", {"batch_files": 100, "report_every": 0.05})
    try:
        with c.client() as cl:
            cl.create_dataset("ds", [Mount("data", root.as_uri())])
        v = shoal(c, "load", "/ds")
        assert v["state"] == "done" and v["tasks"]["done"] >= 9, v
        assert counts(v) == (n, 0, 0, n), v
        assert v["bytes_done"] == sum(map(len, files.values()))
        # killed at once: what "done" counted must come back from the index
        for i in range(2):
            c.kill_worker(i)
        for i in range(2):
            c.restart_worker(i)
        c.wait_ring(2)
        v = shoal(c, "load", "/ds")
        assert counts(v) == (0, n, 0, n), v
        with c.client(short_circuit=False) as cl:
            for rel, data in files.items():
                assert cl.read(f"/ds/data/{rel}") == data, rel
    finally:
        c.stop()


def test_a_local_load_that_loses_a_worker_adds_up(tmp_path: Path, s3_credentials: None) -> None:
    root = tmp_path / "src"
    files = make_files(root, 4000, seed=8)
    n = len(files)
    c = start_job_cluster(
        tmp_path / "c", {"batch_files": 40, "report_every": 0.05}, workers=3, expiry=2.0
    )
    try:
        with c.client() as cl:
            cl.create_dataset("ds", [Mount("data", root.as_uri())])
            jid = cl.submit_job({"kind": "load", "dataset": "ds", "paths": [""]})["id"]
            deadline = time.monotonic() + 60
            while cl.job(jid)["files_done"] < 100 and time.monotonic() < deadline:
                time.sleep(0.005)
            c.kill_worker(2)  # SIGKILL mid-load: its share is re-planned onto the others
            assert cl.job(jid)["state"] == "running", "killed too late to lose a share"
            deadline = time.monotonic() + 120
            while (v := cl.job(jid))["state"] not in ("done", "failed", "stopped"):
                assert time.monotonic() < deadline, v
                time.sleep(0.1)
        assert v["state"] == "done", v
        done, skipped, failed, total = counts(v)
        assert failed == 0 and done + skipped == total == n, v
        with c.client(short_circuit=False) as cl:
            for rel in sorted(files)[::50]:
                assert cl.read(f"/ds/data/{rel}") == files[rel], rel
    finally:
        c.stop()

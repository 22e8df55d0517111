"""A job's counts add up: done + skipped + failed = total when it says done, with many
small tasks whose progress reports cross their ends, across a master crash, and across
a worker crash; and the work of a lost worker ends up where readers look once it is
back (a finished load means no further store GETs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.testing.cluster import TestCluster, sample_files
from shoal.testing.jobs import JobCluster, start_job_cluster
from shoal.testing.s3 import CountingProxy, MotoServer, make_bucket

pytestmark = pytest.mark.integration


def shoal(cluster: TestCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SHOAL_MASTER=cluster.master_url, **cluster.env)
    return subprocess.run(
        [sys.executable, "-m", "shoal", *args], env=env, capture_output=True, text=True, timeout=180
    )


def wait_for(cond: Any, timeout: float, what: str, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(step)


def job_view(cluster: TestCluster, jid: str) -> dict[str, Any] | None:
    try:
        with cluster.client() as c:
            return c.job(jid)
    except Exception:  # the master is restarting
        return None


def finished(cluster: TestCluster, jid: str, timeout: float = 120) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        v = job_view(cluster, jid)
        return v if v is not None and v["state"] in ("done", "failed", "stopped") else None

    return wait_for(done, timeout, f"job {jid} to finish", 0.1)  # type: ignore[no-any-return]


def adds_up(v: dict[str, Any]) -> tuple[int, int]:
    return v["files_done"] + v["files_skipped"] + v["files_failed"], v["files_total"]


@pytest.fixture(scope="module")
def small_tasks(
    tmp_path_factory: pytest.TempPathFactory, s3_credentials: None
) -> Iterator[JobCluster]:
    """Tasks of 3 files with a progress report every 50 ms that takes 50 ms to leave
    the worker: many tasks end while a report is on its way to the master."""
    knobs = {"batch_files": 3, "report_every": 0.05, "report_delay": 0.05}
    c = start_job_cluster(tmp_path_factory.mktemp("small"), knobs)
    try:
        yield c
    finally:
        c.stop()


def test_done_means_every_report_was_counted(
    moto: MotoServer, small_tasks: JobCluster, bucket: str
) -> None:
    files = sample_files(300, 1, 200, seed=41)
    make_bucket(moto.endpoint, bucket, files)
    small_tasks.s3_dataset(bucket, moto.endpoint, name="counts")
    r = shoal(small_tasks, "load", "/counts", "--wait", "--json")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert v["state"] == "done" and v["tasks"]["done"] >= 100
    assert (v["files_done"], v["files_skipped"], v["files_failed"]) == (300, 0, 0), v
    assert v["bytes_done"] == sum(map(len, files.values()))


def test_a_load_resumed_after_a_master_crash_adds_up(
    moto: MotoServer, tmp_path: Path, s3_credentials: None, bucket: str
) -> None:
    c = start_job_cluster(tmp_path / "crash", {"batch_files": 40, "report_every": 0.05})
    try:
        files = sample_files(600, 1, 2000, seed=42)
        make_bucket(moto.endpoint, bucket, files)
        c.s3_dataset(bucket, moto.endpoint)
        with c.client() as cl:
            jid = cl.submit_job({"kind": "load", "dataset": "ds", "paths": [""]})["id"]
        # crash the master while tasks are part way through (some of it counted)
        wait_for(
            lambda: (v := job_view(c, jid)) and v["files_done"] >= 60,
            60,
            "the load to be under way",
            0.01,
        )
        c.restart_master()
        v = finished(c, jid)
        assert v["state"] == "done", v
        assert v["files_failed"] == 0
        assert adds_up(v) == (len(files), len(files)), v
    finally:
        c.stop()


def test_a_lost_workers_share_ends_up_on_it_when_it_is_back(
    moto: MotoServer, tmp_path: Path, s3_credentials: None, bucket: str
) -> None:
    c = start_job_cluster(
        tmp_path / "handback", {"batch_files": 40, "report_every": 0.05}, workers=3, expiry=2.0
    )
    try:
        files = sample_files(600, 1, 2000, seed=43)
        with CountingProxy(moto.endpoint) as proxy:
            make_bucket(moto.endpoint, bucket, files)
            c.s3_dataset(bucket, proxy.endpoint)
            with c.client() as cl:
                jid = cl.submit_job({"kind": "load", "dataset": "ds", "paths": [""]})["id"]
            wait_for(
                lambda: (v := job_view(c, jid)) and v["files_done"] >= 50,
                60,
                "the load to be under way",
                0.01,
            )
            c.kill_worker(2)  # SIGKILL mid-load: its share is re-planned onto the others
            wait_for(
                lambda: (v := job_view(c, jid)) and v["tasks"].get("reassigned"),
                30,
                "the lost worker's tasks to be reassigned",
                0.1,
            )
            c.restart_worker(2)  # back, and the owner of those files again
            c.wait_ring(3)
            v = finished(c, jid)
            assert v["state"] == "done", v
            proxy.reset()
            with c.client(short_circuit=False) as cl:
                for k, data in files.items():
                    assert cl.read(f"/ds/data/{k}") == data
            assert proxy.counts() == {}, "a finished load means no further store requests"
            assert v["files_failed"] == 0 and adds_up(v) == (len(files), len(files)), v
    finally:
        c.stop()

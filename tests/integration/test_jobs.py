"""Datasets and data operations end to end: load (incremental, metadata-only,
files-from, verify), free, sync, TTL, pin, schedules, restarts, lost workers."""

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
from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.reports import wait_dataset
from shoal.testing.s3 import CountingProxy, MotoServer, make_bucket, s3_client

pytestmark = pytest.mark.integration


def shoal(cluster: TestCluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SHOAL_MASTER=cluster.master_url, **cluster.env)
    r = subprocess.run(
        [sys.executable, "-m", "shoal", *args], env=env, capture_output=True, text=True, timeout=180
    )
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def create(cluster: TestCluster, bucket: str, endpoint: str, **options: str) -> None:
    cluster.s3_dataset(bucket, endpoint, options)


def wait_job(cluster: TestCluster, job_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with cluster.client() as c:
        while True:
            v = c.job(job_id)
            if v["state"] in ("done", "failed", "stopped") or time.monotonic() > deadline:
                return v
            time.sleep(0.2)


def test_load_is_incremental_and_serves_reads_with_no_store_requests(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = sample_files(300, 100, 120_000, seed=31)
    files["big/large.bin"] = random.Random(1).randbytes(3 * (1 << 20) + 5)
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, files)
        create(cluster, bucket, proxy.endpoint)
        r = json.loads(shoal(cluster, "load", "/ds", "--wait", "--json").stdout)
        assert r["state"] == "done"
        assert (r["files_done"], r["files_skipped"], r["files_failed"]) == (len(files), 0, 0)
        assert r["bytes_done"] == sum(map(len, files.values()))
        d = wait_dataset(cluster, "ds", lambda d: d["cached_files"] == len(files))
        assert d["store_files"] == len(files) and d["cached_pct"] == pytest.approx(100.0)
        proxy.reset()
        with cluster.client(short_circuit=False) as c:
            for k, v in files.items():
                assert c.read(f"/ds/data/{k}") == v
            assert {e.path for e in c.ls("/ds/data/big")} == {"/ds/data/big/large.bin"}
        assert proxy.counts() == {}, "reads after a load must not touch the store"
        # incremental: nothing changed -> everything skipped
        r = json.loads(shoal(cluster, "load", "/ds", "--wait", "--json").stdout)
        assert (r["files_done"], r["files_skipped"]) == (0, len(files))
        gets_before = proxy.counts().get("GET_range", 0)
        # one new file and one changed file: exactly those are fetched
        s3 = s3_client(moto.endpoint)
        s3.put_object(Bucket=bucket, Key="new.bin", Body=b"n" * 1000)
        s3.put_object(Bucket=bucket, Key="000/f000000.bin", Body=b"changed")
        r = json.loads(shoal(cluster, "load", "/ds", "--wait", "--json").stdout)
        assert (r["files_done"], r["files_skipped"]) == (2, len(files) - 1)
        assert proxy.counts().get("GET_range", 0) - gets_before == 2


def test_metadata_only_then_listing_and_stat_come_from_the_manifest(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = sample_files(500, 10, 100, seed=32)
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, files)
        create(cluster, bucket, proxy.endpoint)
        r = json.loads(shoal(cluster, "load", "/ds", "--metadata-only", "--wait", "--json").stdout)
        assert r["state"] == "done" and r["files_done"] == 0
        proxy.reset()
        ls = json.loads(shoal(cluster, "fs", "ls", "/ds/data/001", "--json").stdout)["entries"]
        assert len(ls) == 100
        st = json.loads(shoal(cluster, "fs", "stat", "/ds/data/001/f000100.bin", "--json").stdout)
        assert st["size"] == len(files["001/f000100.bin"])
        assert proxy.counts() == {}
        d = wait_dataset(cluster, "ds")
        assert d["store_files"] == 500 and d["cached_files"] == 0


def test_files_from_glob_verify_and_failures(
    moto: MotoServer, cluster: TestCluster, bucket: str, tmp_path: Path
) -> None:
    files = sample_files(200, 10, 5000, seed=33)
    make_bucket(moto.endpoint, bucket, files)
    create(cluster, bucket, moto.endpoint)
    lst = tmp_path / "list.txt"
    lst.write_text("/ds/data/000/f000001.bin\n/ds/data/001/f000150.bin\n/ds/data/000/nope.bin\n")
    r = shoal(
        cluster, "load", "/ds", "--files-from", str(lst), "--verify", "--wait", "--json", ok=False
    )
    assert r.returncode == 1  # a failed file makes the command fail, after doing the rest
    v = json.loads(r.stdout)
    assert (v["files_done"], v["files_failed"]) == (2, 1)
    assert v["failures"] == [["data/000/nope.bin", "not found in under storage"]]
    r = json.loads(
        shoal(
            cluster, "load", "/ds/data/001", "--glob", "*/f0001[0-5]?.bin", "--wait", "--json"
        ).stdout
    )
    assert r["files_done"] + r["files_skipped"] == 60 and r["files_skipped"] == 1
    jobs = json.loads(shoal(cluster, "job", "ls", "--json").stdout)["jobs"]
    assert len(jobs) == 2 and {j["state"] for j in jobs} == {"done"}


def test_free_and_sync(moto: MotoServer, cluster: TestCluster, bucket: str) -> None:
    files = sample_files(200, 10, 20_000, seed=34)
    make_bucket(moto.endpoint, bucket, files)
    create(cluster, bucket, moto.endpoint)
    shoal(cluster, "load", "/ds", "--wait")
    wait_dataset(cluster, "ds", lambda d: d["cached_files"] == 200)
    r = json.loads(shoal(cluster, "free", "/ds/data/000", "--wait", "--json").stdout)
    assert r["state"] == "done" and r["files_done"] == 100
    assert wait_dataset(cluster, "ds", lambda d: d["cached_files"] == 100)["cached_files"] == 100
    # sync: a changed and a deleted object; staleness=never serves the old until synced
    key = "001/f000100.bin"
    with cluster.client() as c:
        assert c.read(f"/ds/data/{key}") == files[key]
        s3 = s3_client(moto.endpoint)
        s3.put_object(Bucket=bucket, Key=key, Body=b"new contents")
        s3.delete_object(Bucket=bucket, Key="001/f000101.bin")
        assert c.read(f"/ds/data/{key}") == files[key]  # within the bound: never revalidate
        r = json.loads(shoal(cluster, "sync", "/ds/data/001", "--wait", "--json").stdout)
        assert r["state"] == "done"
        c.dataset("ds")  # the client notices the new generation (also within its refresh)
        assert c.read(f"/ds/data/{key}") == b"new contents"
        with pytest.raises(FileNotFoundError):
            c.stat("/ds/data/001/f000101.bin")


def test_ttl_expires_and_staleness_bound_revalidates(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = {"a.bin": b"a" * 5000, "b.bin": b"b" * 5000}
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, files)
        create(cluster, bucket, proxy.endpoint, ttl="2s", staleness="1s")
        with cluster.client(short_circuit=False) as c:
            assert c.read("/ds/data/a.bin") == files["a.bin"]
            assert (
                wait_dataset(cluster, "ds", lambda d: d["cached_files"] == 1)["cached_files"] == 1
            )
            assert (
                wait_dataset(cluster, "ds", lambda d: d["cached_files"] == 0)["cached_files"] == 0
            )
            s3_client(moto.endpoint).put_object(Bucket=bucket, Key="b.bin", Body=b"v1")
            assert c.read("/ds/data/b.bin") == b"v1"
            s3_client(moto.endpoint).put_object(Bucket=bucket, Key="b.bin", Body=b"v2")
            time.sleep(1.5)
            assert c.read("/ds/data/b.bin") == b"v2"


def test_pinned_data_is_never_evicted(
    moto: MotoServer, tmp_path: Path, s3_credentials: None, bucket: str
) -> None:
    c = start_cluster(tmp_path / "pin", workers=1, mem="0", disk="2MiB")
    try:
        pinned = sample_files(10, 50_000, 50_000, seed=35, prefix="p/")
        other = sample_files(60, 50_000, 50_000, seed=36, prefix="o/")
        make_bucket(moto.endpoint, bucket, {**pinned, **other})
        with c.client() as cl:
            cl.create_dataset(
                "pinned",
                [Mount("data", f"s3://{bucket}/p", {"endpoint_url": moto.endpoint})],
                {"pin": "true"},
            )
            cl.create_dataset(
                "ds", [Mount("data", f"s3://{bucket}/o", {"endpoint_url": moto.endpoint})]
            )
            for k in pinned:
                assert cl.read(f"/pinned/data/{k[2:]}") == pinned[k]
            for _ in range(2):
                for k in other:
                    assert cl.read(f"/ds/data/{k[2:]}") == other[k]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                rep = {d["name"]: d for d in cl.report()["datasets"]}
                if rep.get("ds", {}).get("cached_files"):
                    break
                time.sleep(0.2)
            assert rep["pinned"]["cached_files"] == 10
            assert rep["ds"]["cached_files"] < 60
    finally:
        c.stop()


def test_schedules_run_and_survive_a_master_restart(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    make_bucket(moto.endpoint, bucket, sample_files(20, 10, 1000, seed=37))
    create(cluster, bucket, moto.endpoint)
    r = shoal(cluster, "load", "/ds", "--schedule", "every minute", ok=False)
    assert r.returncode == 2 and "invalid cron" in r.stderr and "Traceback" not in r.stderr
    # a sixth field is seconds (croniter): every 2 seconds keeps the test short
    sched = json.loads(
        shoal(cluster, "load", "/ds", "--schedule", "* * * * * */2", "--json").stdout
    )
    deadline = time.monotonic() + 30
    jobs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        listed = json.loads(shoal(cluster, "job", "ls", "--json").stdout)["jobs"]
        jobs = sorted(
            (j for j in listed if j["schedule"] == sched["id"] and j["state"] == "done"),
            key=lambda j: float(j["created"]),  # `job ls` lists newest first
        )
        if len(jobs) >= 2:
            break
        time.sleep(0.5)
    assert len(jobs) >= 2
    assert jobs[0]["files_done"] == 20 and jobs[-1]["files_skipped"] == 20  # incremental
    cluster.stop_master()
    cluster.start_master()
    listed = json.loads(shoal(cluster, "job", "ls", "--json").stdout)
    assert [s["id"] for s in listed["schedules"]] == [sched["id"]]
    shoal(cluster, "job", "stop", sched["id"])
    assert (
        json.loads(shoal(cluster, "job", "status", sched["id"], "--json").stdout)["enabled"]
        is False
    )


def test_a_load_survives_a_master_restart_and_a_lost_worker(
    moto: MotoServer, tmp_path: Path, s3_credentials: None, bucket: str
) -> None:
    c = start_cluster(tmp_path / "resume", workers=3, expiry=3.0)
    try:
        files = sample_files(900, 1000, 40_000, seed=38)
        make_bucket(moto.endpoint, bucket, files)
        create(c, bucket, moto.endpoint)
        with c.client() as cl:
            job = cl.submit_job({"kind": "load", "dataset": "ds", "paths": [""]})
            while cl.job(job["id"])["state"] in ("pending", "listing"):
                time.sleep(0.02)
            c.kill_worker(2)  # SIGKILL: its share must be re-planned onto the others
            deadline = time.monotonic() + 60
            while cl.job(job["id"])["files_done"] < 50 and time.monotonic() < deadline:
                time.sleep(0.05)
        c.stop_master()  # and the master goes down part way through
        c.start_master()
        v = wait_job(c, job["id"], timeout=120)
        assert v["state"] == "done", v
        assert v["files_failed"] == 0
        assert v["tasks"].get("reassigned", 0) >= 1
        assert v["files_done"] + v["files_skipped"] >= len(files)
        with c.client() as cl:
            for k in random.Random(1).sample(sorted(files), 100):
                assert cl.read(f"/ds/data/{k}") == files[k]
    finally:
        c.stop()


def test_job_stop_and_resume_and_bad_input(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = sample_files(600, 1000, 30_000, seed=39)
    make_bucket(moto.endpoint, bucket, files)
    create(cluster, bucket, moto.endpoint)
    with cluster.client() as cl:
        job = cl.submit_job({"kind": "load", "dataset": "ds", "paths": [""]})
        while cl.job(job["id"])["state"] == "listing":
            time.sleep(0.02)
        stopped = cl.stop_job(job["id"])
        assert stopped["state"] == "stopped"
        # tasks in flight when the stop came still send their final counts: wait until
        # none runs, then nothing may move
        deadline = time.monotonic() + 30
        while cl.job(job["id"])["tasks"].get("running", 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        paused = cl.job(job["id"])
        assert not paused["tasks"].get("running", 0), paused["tasks"]
        time.sleep(1.0)
        assert cl.job(job["id"])["files_done"] == paused["files_done"]  # nothing moves
        cl.resume_job(job["id"])
    v = wait_job(cluster, job["id"])
    assert v["state"] == "done" and v["files_done"] + v["files_skipped"] == len(files)
    for args, words in (
        (("load", "/nosuch"), "nosuch"),
        (("load", "/ds", "/other"), "one dataset"),
        (("load", "/ds", "--files-from", "/nonexistent/list"), "cannot read"),
        (("job", "status", "j-00000000ff"), "no job"),
    ):
        r = shoal(cluster, *args, ok=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


def test_metadata_load_of_a_large_listing(cluster: TestCluster, tmp_path: Path) -> None:
    """A listing bigger than a default HTTP body limit (tens of thousands of files)."""
    root = tmp_path / "many"
    for d in range(25):
        (root / f"d{d:02d}").mkdir(parents=True)
        for i in range(1000):
            os.close(
                os.open(
                    root / f"d{d:02d}" / f"file-with-a-long-name-{i:06d}.jpg",
                    os.O_CREAT | os.O_WRONLY,
                    0o644,
                )
            )
    with cluster.client() as c:
        c.create_dataset("many", [Mount("data", root.as_uri())])
    r = json.loads(shoal(cluster, "load", "/many", "--metadata-only", "--wait", "--json").stdout)
    assert r["state"] == "done"
    with cluster.client() as c:
        assert len(c.ls("/many/data/d07")) == 1000
        d = next(x for x in c.report()["datasets"] if x["name"] == "many")
        assert d["store_files"] == 25_000


def test_new_readers_locate_the_dataset_once_and_never_see_a_stale_answer(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = sample_files(600, 10, 20_000, seed=35)  # 6 directories
    make_bucket(moto.endpoint, bucket, files)
    create(cluster, bucket, moto.endpoint)
    shoal(cluster, "load", "/ds", "--wait")
    order = sorted(files)
    random.Random(1).shuffle(order)

    def epoch(expect: dict[str, bytes]) -> tuple[dict[str, int], list[Any]]:
        """A new reader (a fresh DataLoader worker) reads every file once."""
        with cluster.client() as c:
            for k in order:
                if k in expect:
                    assert c.read(f"/ds/data/{k}") == expect[k], k
            return c.counters(), list(c.cache.dirs_located)

    for _ in range(2):  # the second reader gets the answers the workers kept
        counters, located = epoch(files)
        # no per-file round trip: three directories, then the whole dataset, per worker
        assert counters["local"] == 0 and counters["remote"] == 0
        assert counters["short_circuit"] == len(files)
        assert len({k[0] for k in located if k[2] is None}) == 2  # once per worker
        assert len([k for k in located if k[2] is not None]) <= 2 * 3

    # what the workers kept must follow frees, changes and syncs
    r = json.loads(shoal(cluster, "free", "/ds/data/002", "--wait", "--json").stdout)
    assert r["state"] == "done"
    counters, _ = epoch(files)
    assert counters["short_circuit"] <= len(files) - 100  # the freed files were not handed out
    key = "001/f000100.bin"
    s3_client(moto.endpoint).put_object(Bucket=bucket, Key=key, Body=b"new contents")
    shoal(cluster, "sync", "/ds/data/001", "--wait")
    counters, _ = epoch({**files, key: b"new contents"})

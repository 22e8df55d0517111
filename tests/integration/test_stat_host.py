"""A fresh process's stats from what another process on the host listed (the host's
metadata cache, shoal.client.hostmeta): no worker call and, after the first, no hop
to the loop thread; the same answers a listing gives; a sync is seen as before."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shoal.client import Client, hostmeta
from shoal.testing.cluster import TestCluster, sample_files
from shoal.testing.s3 import MotoServer, make_bucket, s3_client

pytestmark = pytest.mark.integration

_LIST = """
import sys
from shoal.client import Client
with Client(sys.argv[1]) as c:
    for d in sys.argv[2:]:
        c.ls(d)
"""


def _list_in_another_process(master: str, dirs: list[str], meta_dir: Path) -> None:
    env = {**os.environ, hostmeta.ENV: str(meta_dir)}
    subprocess.run([sys.executable, "-c", _LIST, master, *dirs], env=env, check=True, timeout=120)


def _count_calls(c: Client) -> list[str]:
    router = c._aio.router
    asked: list[str] = []
    send = router.with_failover

    async def counted(*a: Any, **kw: Any) -> Any:
        asked.append(type(a[2]).__name__)
        return await send(*a, **kw)

    router.with_failover = counted  # type: ignore[method-assign]
    return asked


def _no_loop(c: Client) -> None:
    def refuse(coro: Any) -> Any:
        coro.close()
        raise AssertionError("went to the loop thread")

    c._run = refuse  # type: ignore[method-assign]


@pytest.mark.parametrize("staleness", [None, "60"])
def test_a_fresh_process_stats_what_another_listed_without_asking_a_worker(
    moto: MotoServer,
    cluster: TestCluster,
    bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    staleness: str | None,
) -> None:
    monkeypatch.setenv(hostmeta.ENV, str(tmp_path / "hm"))
    files = sample_files(300, 10, 400, seed=21)
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": staleness} if staleness else None)
    dirs = sorted({k.rpartition("/")[0] for k in files})
    assert len(dirs) == 3
    _list_in_another_process(cluster.master_url, [f"/ds/data/{d}" for d in dirs], tmp_path / "hm")
    keys = sorted(files, key=lambda k: (k[-6:], k))  # directories interleaved
    with cluster.client() as c, cluster.client() as ref:
        c.dataset("ds")  # the first contact with the master, as the bench makes it
        asked = _count_calls(c)
        got = {keys[0]: c.stat(f"/ds/data/{keys[0]}")}  # reads the host's listings
        _no_loop(c)
        for k in keys[1:]:
            got[k] = c.stat(f"/ds/data/{k}")
        assert asked == []
        listed = {e.path: e for d in dirs for e in ref.ls(f"/ds/data/{d}")}
        for k in keys:
            want = listed[f"/ds/data/{k}"]
            assert (got[k].path, got[k].size, got[k].version, got[k].mtime, got[k].is_dir) == (
                want.path,
                len(files[k]),
                want.version,
                want.mtime,
                False,
            )
        # what no listing holds is still asked for: a missing file, a directory
        with pytest.raises(AssertionError, match="loop thread"):
            c.stat(f"/ds/data/{dirs[0]}/missing.bin")
        with pytest.raises(AssertionError, match="loop thread"):
            c.stat(f"/ds/data/{dirs[0]}")


def test_a_sync_reaches_processes_served_from_the_host(
    moto: MotoServer,
    cluster: TestCluster,
    bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(hostmeta.ENV, str(tmp_path / "hm"))
    files = {"a/x.bin": b"one", "a/y.bin": b"two"}
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": "never"})
    _list_in_another_process(cluster.master_url, ["/ds/data/a"], tmp_path / "hm")
    with cluster.client(ring_refresh=1.0) as c, cluster.client() as admin:
        asked = _count_calls(c)
        assert c.stat("/ds/data/a/x.bin").size == len(b"one")
        assert asked == []  # from the host's listing
        s3_client(moto.endpoint).put_object(Bucket=bucket, Key="a/x.bin", Body=b"version two")
        job = admin.submit_job({"kind": "sync", "dataset": "ds", "paths": [""]})
        deadline = time.monotonic() + 60
        while admin.job(job["id"])["state"] != "done":
            assert time.monotonic() < deadline, "the sync never finished"
            time.sleep(0.05)
        synced = time.monotonic()
        while (size := c.stat("/ds/data/a/x.bin").size) != len(b"version two"):
            assert size == len(b"one")
            assert time.monotonic() - synced < 8.0, "the stat never saw the sync"
            time.sleep(0.05)
        # a process started after the sync: the listings from before are never read
        with cluster.client() as fresh:
            assert fresh.stat("/ds/data/a/x.bin").size == len(b"version two")
            assert fresh.stat("/ds/data/a/y.bin").size == len(b"two")


def test_no_host_cache_when_the_dataset_revalidates_always(
    moto: MotoServer,
    cluster: TestCluster,
    bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(hostmeta.ENV, str(tmp_path / "hm"))
    files = {"d/a.bin": b"one", "d/b.bin": b"two"}
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": "always"})
    _list_in_another_process(cluster.master_url, ["/ds/data/d"], tmp_path / "hm")
    assert not list((tmp_path / "hm").rglob("*.log"))
    s3_client(moto.endpoint).put_object(Bucket=bucket, Key="d/a.bin", Body=b"version two")
    with cluster.client() as c:
        assert c.stat("/ds/data/d/a.bin").size == len(b"version two")

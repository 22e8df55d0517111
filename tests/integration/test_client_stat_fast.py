"""Warm metadata and reads with no hop to a loop thread: ``Client.stat`` and fsspec's
``info``/``cat_file`` answer from the client's metadata cache, manifest and located
pages on the caller's thread, a stat that misses twice in a directory lists it once,
and none of it outlives the dataset's staleness bound or a sync."""

from __future__ import annotations

import time
from typing import Any

import fsspec
import pytest

import shoal.fsspec  # noqa: F401  (registers shoal://)
from shoal.client import Client
from shoal.testing.cluster import TestCluster, sample_files
from shoal.testing.s3 import MotoServer, make_bucket, s3_client

pytestmark = pytest.mark.integration


def _no_loop(c: Client) -> None:
    """From here on, anything that would go to the client's loop thread fails."""

    def refuse(coro: Any) -> Any:
        coro.close()
        raise AssertionError("went to the loop thread")

    c._run = refuse  # type: ignore[method-assign]


def _wait(ok: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_stat_misses_list_the_directory_then_answer_on_the_callers_thread(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = sample_files(250, 10, 3000, seed=11)
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": "never"})
    in_000 = sorted(k for k in files if k.startswith("000/"))
    with cluster.client() as c, cluster.client() as lister:
        listed = {e.path: e for e in lister.ls("/ds/data/000")}
        for k in in_000[:2]:  # the second miss in 000 lists it
            assert c.stat(f"/ds/data/{k}").size == len(files[k])
        _no_loop(c)
        for k in in_000:
            got = c.stat(f"/ds/data/{k}")
            want = listed[f"/ds/data/{k}"]
            assert (got.path, got.size, got.version, got.mtime) == (
                want.path,
                len(files[k]),
                want.version,
                want.mtime,
            )
            assert got.mtime > 0 and not got.is_dir
        # nothing else is answered without asking: another directory, an odd spelling
        for p in ("/ds/data/001/f000100.bin", f"/ds/data//{in_000[0]}"):
            with pytest.raises(AssertionError, match="loop thread"):
                c.stat(p)


def test_stat_after_reads_of_located_files_has_their_real_mtime(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    # reads learn a directory's cached files (LOCATE_DIR): sizes and versions, no mtime
    files = sample_files(40, 10, 3000, seed=12)
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": "never"})
    with cluster.client() as warm:
        for k, v in files.items():
            assert warm.read(f"/ds/data/{k}") == v
    with cluster.client() as c, cluster.client() as lister:
        for k, v in files.items():
            assert c.read(f"/ds/data/{k}") == v
        got = {k: c.stat(f"/ds/data/{k}").mtime for k in files}
        listed = {e.path: e.mtime for e in lister.ls("/ds/data/000")}
        for k in files:  # a stat and a listing may round differently (HEAD vs LIST)
            assert got[k] > 0 and abs(got[k] - listed[f"/ds/data/{k}"]) < 1.0


def test_stat_fast_path_keeps_the_staleness_bound_and_sees_a_sync(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = {"a/x.bin": b"one", "a/y.bin": b"two", "b/z.bin": b"three"}
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": "always"}, name="always")
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": "never"}, name="never")
    s3 = s3_client(moto.endpoint)
    with cluster.client(ring_refresh=1.0) as c, cluster.client() as admin:
        fs = fsspec.filesystem("shoal", master=cluster.master_url, skip_instance_cache=True)
        for _ in range(3):
            for k in files:
                assert c.stat(f"/always/data/{k}").size == len(files[k])
                assert c.stat(f"/never/data/{k}").size == len(files[k])
                assert fs.info(f"/always/data/{k}")["size"] == len(files[k])
        s3.put_object(Bucket=bucket, Key="a/x.bin", Body=b"version two")
        # revalidate always: the next stat sees it, through either interface
        assert c.stat("/always/data/a/x.bin").size == len(b"version two")
        assert fs.info("/always/data/a/x.bin")["size"] == len(b"version two")
        # never revalidate: the old one until a sync, then the new one within the refresh
        assert c.stat("/never/data/a/x.bin").size == len(b"one")
        job = admin.submit_job({"kind": "sync", "dataset": "never", "paths": [""]})
        _wait(lambda: admin.job(job["id"])["state"] == "done", 60, "the sync")
        synced = time.monotonic()
        while (size := c.stat("/never/data/a/x.bin").size) != len(b"version two"):
            assert size == len(b"one")
            assert time.monotonic() - synced < 8.0, "the stat never saw the sync"
            time.sleep(0.05)
        assert c.read("/never/data/a/x.bin") == b"version two"


def test_fsspec_cat_file_fast_path_has_the_slow_paths_range_semantics(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    data = {"r/small.bin": bytes(range(256)) * 40, "r/big.bin": bytes(range(251)) * 20_000}
    make_bucket(moto.endpoint, bucket, data)
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": "never", "page_size": "1MiB"})
    fs = fsspec.filesystem("shoal", master=cluster.master_url, skip_instance_cache=True)
    for k, v in data.items():
        n = len(v)
        ranges = [(None, None), (0, None), (7, None), (0, 1), (5, 5), (9, 3), (n - 3, None)]
        ranges += [(n, None), (n + 10, n + 20), (3, n + 100), ((1 << 20) - 5, (1 << 20) + 9)]
        ranges += [(-10, None), (-10, -2), (2, -1)]
        for rep in range(2):  # the first reads locate the pages, the next are preads
            for s, e in ranges:
                assert fs.cat_file(f"/ds/data/{k}", s, e) == v[s:e], (k, s, e, rep)
        with fs.open(f"/ds/data/{k}", "rb") as f:
            assert f.read() == v
    assert fs.client_cache.counters.short_circuit > 0


@pytest.mark.parametrize("staleness", [None, "never", "60"])
def test_stats_of_listed_files_make_no_call_beyond_the_listing(
    moto: MotoServer, cluster: TestCluster, bucket: str, staleness: str | None
) -> None:
    # the bench's meta pass in one process: ls every directory, then stat its files,
    # twice; the staleness bound unset (the default), never, or finite
    files = sample_files(240, 10, 400, seed=13)
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": staleness} if staleness else None)
    dirs = sorted({k.rpartition("/")[0] for k in files})
    assert len(dirs) == 3
    with cluster.client() as c:
        listed: dict[str, Any] = {}
        for i, d in enumerate(dirs):  # either spelling of a directory teaches the same
            for e in c.ls(f"/ds/data/{d}" + ("/" if i % 2 else "")):
                listed[e.path] = e
        assert c.stat(f"/ds/data/{dirs[0]}").is_dir  # still a directory, when asked
        with pytest.raises(FileNotFoundError):
            c.stat(f"/ds/data/{dirs[0]}/missing.bin")
        _no_loop(c)
        for _ in range(2):
            for k in sorted(files):
                got = c.stat(f"/ds/data/{k}")
                want = listed[f"/ds/data/{k}"]
                assert (got.path, got.size, got.version, got.mtime, got.is_dir) == (
                    want.path,
                    len(files[k]),
                    want.version,
                    want.mtime,
                    False,
                )


def test_stats_of_listed_files_ask_again_when_the_dataset_revalidates_always(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = {"d/a.bin": b"one", "d/b.bin": b"two"}
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": "always"})
    s3 = s3_client(moto.endpoint)
    with cluster.client() as c:
        assert {e.path for e in c.ls("/ds/data/d")} == {"/ds/data/d/a.bin", "/ds/data/d/b.bin"}
        s3.put_object(Bucket=bucket, Key="d/a.bin", Body=b"version two")
        assert c.stat("/ds/data/d/a.bin").size == len(b"version two")
        _no_loop(c)
        with pytest.raises(AssertionError, match="loop thread"):
            c.stat("/ds/data/d/b.bin")


def test_a_process_that_walks_lists_each_further_directory_once_for_its_stats(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    # the bench's warm stat pass: a fresh process stats files of many directories it
    # never listed; once it has walked one directory, each further one costs a listing
    files = sample_files(200, 10, 300, seed=14)
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint)
    by_dir: dict[str, list[str]] = {}
    for k in sorted(files):
        by_dir.setdefault(k.rpartition("/")[0], []).append(k)
    assert len(by_dir) >= 2
    with cluster.client() as c:
        router = c._aio.router
        asked: list[str] = []
        send = router.with_failover

        async def counted(*a: Any, **kw: Any) -> Any:
            asked.append(type(a[2]).__name__)
            return await send(*a, **kw)

        router.with_failover = counted  # type: ignore[method-assign]
        direct, call = c._direct, c._direct._call

        def direct_call(w: Any, req: Any, *a: Any) -> Any:
            asked.append("direct " + type(req).__name__)
            return call(w, req, *a)

        direct._call = direct_call  # type: ignore[method-assign]
        first, *rest = by_dir
        # a stat (on the caller's thread: no loop yet), then a second miss lists the directory
        for k in by_dir[first][:3]:
            assert c.stat(f"/ds/data/{k}").size == len(files[k])
        assert asked == ["direct StatRequest", "ListRequest"]
        for d in rest:
            del asked[:]
            for k in by_dir[d]:
                got = c.stat(f"/ds/data/{k}")
                assert (got.path, got.size, got.is_dir) == (f"/ds/data/{k}", len(files[k]), False)
            assert asked == ["ListRequest"], d
        del asked[:]
        # what a listing does not hold is still asked for: a missing file, a directory
        with pytest.raises(FileNotFoundError):
            c.stat(f"/ds/data/{rest[0]}/missing.bin")
        assert c.stat(f"/ds/data/{rest[0]}").is_dir
        assert "StatRequest" in asked

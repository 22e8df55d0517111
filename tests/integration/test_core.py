"""End to end: real master and worker processes over moto's S3 server, bytes checked
by hash through every read path (short circuit, Unix socket, TCP, batch)."""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading

import pytest

from shoal.client import AsyncClient
from shoal.config import ClientSettings
from shoal.testing.cluster import TestCluster, sample_files
from shoal.testing.reports import wait_report
from shoal.testing.s3 import CountingProxy, MotoServer, make_bucket

pytestmark = pytest.mark.integration

MiB = 1 << 20


def h(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def seed(
    moto: MotoServer,
    cluster: TestCluster,
    bucket: str,
    files: dict[str, bytes],
    endpoint: str | None = None,
    name: str = "ds",
    options: dict[str, str] | None = None,
) -> None:
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, endpoint or moto.endpoint, options, name)


def test_reads_are_byte_exact_on_every_path(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = sample_files(120, 1, 300_000, seed=1)
    files["big/large.bin"] = random.Random(2).randbytes(5 * MiB + 123)
    files["empty.bin"] = b""
    seed(moto, cluster, bucket, files)
    want = {f"/ds/data/{k}": h(v) for k, v in files.items()}

    with cluster.client() as local, cluster.client(short_circuit=False) as tcp:
        for c in (local, tcp):
            for p in want:
                assert h(c.read(p)) == want[p], p
        # warm: the local client now reads with pread on handed-over descriptors
        before = local.counters()["short_circuit"]
        for p in want:
            assert h(local.read(p)) == want[p]
        assert local.counters()["short_circuit"] - before == len(want)
        # ranges of the large file, across page boundaries
        big = files["big/large.bin"]
        rng = random.Random(3)
        for _ in range(40):
            off = rng.randrange(0, len(big))
            n = rng.randrange(0, 3 * MiB)
            for c in (local, tcp):
                assert c.read("/ds/data/big/large.bin", off, n) == big[off : off + n]
        # a batch of many small files in one request per worker
        small = [p for p in want if "large" not in p][:60]
        got = tcp.cat_many([*small, "/ds/data/big/large.bin", "/ds/data/missing.bin"])
        for p in small:
            assert h(got[p]) == want[p]  # type: ignore[arg-type]
        assert got["/ds/data/big/large.bin"] == big
        assert isinstance(got["/ds/data/missing.bin"], FileNotFoundError)
        # metadata
        st = tcp.stat("/ds/data/big/large.bin")
        assert st.size == len(big) and not st.is_dir and st.version
        names = {e.path for e in tcp.ls("/ds/data/big")}
        assert names == {"/ds/data/big/large.bin"}
        assert {e.path for e in tcp.ls("/ds")} == {"/ds/data"}
        local.flush()
    report = wait_report(
        cluster, lambda r: _ds(r)["hits"] >= len(want) and _ds(r)["cached_files"] >= len(files)
    )
    d = _ds(report)
    assert d["cached_files"] >= len(files) and d["cached_bytes"] >= sum(map(len, files.values()))
    assert d["misses"] >= 1 and 0 < d["hit_ratio"] <= 1


def _ds(report: dict, name: str = "ds") -> dict:
    return next(d for d in report["datasets"] if d["name"] == name)


def test_one_backend_get_per_page_for_concurrent_readers(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    data = random.Random(5).randbytes(6 * MiB + 7)
    with CountingProxy(moto.endpoint) as proxy:
        seed(
            moto,
            cluster,
            bucket,
            {"one.bin": data},
            endpoint=proxy.endpoint,
            options={"readahead": "0"},
        )
        proxy.reset()

        async def readers() -> list[bytes]:
            results = []
            for sc in (True, False):
                c = AsyncClient(ClientSettings(master=cluster.master_url, short_circuit=sc))
                results.append(c)
            try:
                return await asyncio.gather(
                    *(results[i % 2].read("/ds/data/one.bin") for i in range(16))
                )
            finally:
                for c in results:
                    await c.close()

        got = asyncio.run(readers())
        assert all(g == data for g in got)
        counts = proxy.counts_for(f"{bucket}/one.bin")
        assert counts.get("GET", 0) == 7  # 7 pages of 1 MiB, one GET each


def test_eviction_under_a_small_quota(
    moto: MotoServer, tmp_path, s3_credentials, bucket: str
) -> None:
    from shoal.testing.cluster import start_cluster

    c = start_cluster(tmp_path / "small", workers=1, mem="0", disk="3MiB")
    try:
        files = sample_files(80, 90_000, 110_000, seed=7)  # ~8 MB through a 3 MiB cache
        seed(moto, c, bucket, files)
        with c.client() as cl:
            for _ in range(2):
                for k, v in files.items():
                    assert cl.read(f"/ds/data/{k}") == v
        r = wait_report(c, lambda r: r["workers"] and r["workers"][0]["used"] > 0)
        w = r["workers"][0]
        assert 0 < w["used"] <= 3 * MiB
        assert _ds(r)["cached_bytes"] < sum(map(len, files.values()))
    finally:
        c.stop()


def test_restarted_worker_serves_its_disk_cache_without_refetching(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = sample_files(60, 1000, 200_000, seed=9)
    files["large.bin"] = random.Random(9).randbytes(3 * MiB)
    with CountingProxy(moto.endpoint) as proxy:
        seed(moto, cluster, bucket, files, endpoint=proxy.endpoint)
        with cluster.client() as c:
            for k, v in files.items():
                assert c.read(f"/ds/data/{k}") == v
        fetched = proxy.counts().get("GET", 0)
        assert fetched >= len(files)
        for i in range(cluster.workers):
            cluster.kill_worker(i, sig=15)
        for i in range(cluster.workers):
            cluster.restart_worker(i)
        cluster.wait_ring(cluster.workers)
        with cluster.client(short_circuit=False) as c:
            for k, v in files.items():
                assert c.read(f"/ds/data/{k}") == v
        assert proxy.counts().get("GET", 0) == fetched


def test_corrupt_page_on_disk_is_detected_and_refetched(
    moto: MotoServer, tmp_path, s3_credentials, bucket: str
) -> None:
    from shoal.testing.cluster import start_cluster

    c = start_cluster(tmp_path / "corrupt", workers=1, mem="0")
    try:
        data = random.Random(11).randbytes(50_000)
        seed(moto, c, bucket, {"x.bin": data})
        with c.client() as cl:
            assert cl.read("/ds/data/x.bin") == data
        segs = [
            p
            for p in (c.worker_dir(0) / "cache").rglob("*")
            if p.is_file() and p.stat().st_size >= 50_000
        ]
        assert segs, "no cache file holds the data"
        for p in segs:
            raw = bytearray(p.read_bytes())
            at = raw.find(data[:64])
            if at >= 0:
                raw[at + 100] ^= 0xFF
                p.write_bytes(bytes(raw))
        for sc in (False, True):
            with c.client(short_circuit=sc) as cl:
                assert cl.read("/ds/data/x.bin") == data
        with c.client(short_circuit=False) as cl:
            assert cl.read("/ds/data/x.bin") == data
    finally:
        c.stop()


def test_worker_killed_during_reads_fails_no_read(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = sample_files(300, 1000, 60_000, seed=13)
    seed(moto, cluster, bucket, files)
    paths = [f"/ds/data/{k}" for k in files]
    errors: list[BaseException] = []
    done = threading.Event()

    def reader(seed_: int, sc: bool) -> None:
        rng = random.Random(seed_)
        with cluster.client(short_circuit=sc) as c:
            order = paths[:]
            for _ in range(2):
                rng.shuffle(order)
                for p in order:
                    try:
                        assert c.read(p) == files[p[len("/ds/data/") :]]
                    except BaseException as exc:  # collected and asserted below
                        errors.append(exc)
        done.set()

    threads = [threading.Thread(target=reader, args=(i, i % 2 == 0)) for i in range(4)]
    for t in threads:
        t.start()
    import time

    time.sleep(0.5)
    cluster.kill_worker(0)  # SIGKILL mid-read
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]


def test_master_stopped_during_reads_fails_no_read(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = sample_files(100, 1000, 50_000, seed=17)
    seed(moto, cluster, bucket, files)
    keys = list(files)
    with cluster.client() as c, cluster.client(short_circuit=False) as t:
        for k in keys[:50]:  # cache half, learn the ring
            assert c.read(f"/ds/data/{k}") == files[k]
            assert t.read(f"/ds/data/{k}") == files[k]
        cluster.stop_master()
        for k in keys:  # cached and uncached, master gone
            assert c.read(f"/ds/data/{k}") == files[k]
            assert t.read(f"/ds/data/{k}") == files[k]

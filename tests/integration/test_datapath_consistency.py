"""The client/worker data path never returns a wrong byte: page-size changes while
clients read, pages corrupted on disk under a long-running short-circuit reader, and a
sync seen by a long-running reader within its ring refresh."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from shoal.cli.local import mem_prefix
from shoal.client import Client
from shoal.core.types import parse_size
from shoal.errors import ShoalError
from shoal.testing.cluster import TestCluster, sample_files
from shoal.testing.s3 import MotoServer, make_bucket, s3_client

pytestmark = pytest.mark.integration

MiB = 1 << 20


def _worker_stats(cluster: TestCluster, i: int) -> str:
    w = json.loads((cluster.worker_dir(i) / "worker.json").read_text())
    with urllib.request.urlopen(f"http://127.0.0.1:{w['metrics_port']}/metrics", timeout=10) as r:
        return str(r.read().decode())


def _metric(cluster: TestCluster, name: str) -> float:
    total = 0.0
    for i in range(2):
        for line in _worker_stats(cluster, i).splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def _wait(ok: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ok():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# -- 10.1: a page-size change while clients read ----------------------------------------


def test_page_size_change_while_reading_never_returns_wrong_or_short_bytes(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    rng = random.Random(7)
    big = {f"L{i}.bin": rng.randbytes(6 * MiB + 12345 * (i + 1)) for i in range(2)}
    small = sample_files(30, 100, 50_000, seed=3)
    make_bucket(moto.endpoint, bucket, {**big, **small})
    cluster.s3_dataset(bucket, moto.endpoint, {"page_size": "1MiB"})
    with cluster.client() as warm:
        for k, v in {**big, **small}.items():
            assert warm.read(f"/ds/data/{k}") == v  # everything cached, 1 MiB pages

    bad: list[str] = []
    errors: list[str] = []
    stale: list[str] = []
    reads = [0]
    stop = threading.Event()

    def reader(client: Client, seed: int) -> None:
        r = random.Random(seed)
        while not stop.is_set():
            name = r.choice(list(big))
            src = big[name]
            off = r.randrange(0, len(src))
            n = r.choice([1, 4096, MiB, 3 * MiB + 17, len(src)])
            try:
                got = client.read(f"/ds/data/{name}", off, n)
            except ShoalError as exc:  # the StaleLayout retry leaves none to see
                errors.append(f"read({name}, {off}, {n}): {exc!r}")
                continue
            reads[0] += 1
            if got != src[off : off + n]:
                bad.append(f"read({name}, {off}, {n}) gave {len(got)} bytes, wrong")

    clients = [cluster.client(short_circuit=False), cluster.client(short_circuit=False)]
    # and a short-circuit reader: its located pages stay valid (a replaced data file
    # keeps its bytes for the descriptors handed out) until its refresh (2 s here)
    clients.append(cluster.client(ring_refresh=2.0))
    threads = [threading.Thread(target=reader, args=(c, i)) for i, c in enumerate(clients)]
    try:
        for t in threads:
            t.start()
        _wait(lambda: reads[0] > 30, 30, "reads before the change")
        ufs_before = _metric(cluster, "shoal_ufs_requests_total")
        with cluster.client() as admin:
            for new in ("256KiB", "2MiB"):
                admin.update_dataset("ds", {"page_size": new})
                # readers hold the old definition up to their ring refresh (10 s) and
                # workers up to a heartbeat (2 s): read on until every reader uses the
                # new one (a worker that moved answers StaleLayout: they switch at once)
                ps = parse_size(new)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    if all(c.cache.datasets["ds"][0].policy.page_size == ps for c in clients):
                        break
                    time.sleep(0.05)
                else:
                    stale.append(new)
                at = reads[0]
                _wait(lambda at=at: reads[0] > at + 100, 60, "reads in the new layout")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        for c in clients:
            c.close()
    assert bad == [], bad[:10]
    assert errors == [], errors[:10]
    assert stale == [], f"readers still used the old page size after {stale}"
    # the change kept the cache: small files are whole in every layout, so reading them
    # all again fetches nothing from the store
    # readahead of the large files may still be landing: count from when it settled
    base, deadline = _metric(cluster, "shoal_ufs_requests_total"), time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = _metric(cluster, "shoal_ufs_requests_total")
        if now == base:
            break
        base = now
    assert base >= ufs_before
    with cluster.client(short_circuit=False) as c:
        for k, v in small.items():
            assert c.read(f"/ds/data/{k}") == v
    assert _metric(cluster, "shoal_ufs_requests_total") == base


# -- 10.2: corruption on disk under a long-running short-circuit reader ----------------


def _corrupt_on_disk(cluster: TestCluster, needle: bytes) -> Path:
    """Flip bytes of the cached copy of ``needle`` (in a segment or large data file)."""
    roots = [cluster.worker_dir(i) / "cache" for i in range(2)]
    roots += Path("/dev/shm").glob(mem_prefix(cluster.dir) + "*")  # the memory tiers
    for cache in roots:
        for f in list(cache.rglob("*.seg")) + list(cache.rglob("*.data")):
            data = f.read_bytes()
            at = data.find(needle)
            if at >= 0:
                mid = len(needle) // 2
                with open(f, "r+b") as fh:
                    fh.seek(at + mid)
                    fh.write(bytes(b ^ 0xFF for b in needle[mid : mid + 8]))
                return f
    raise AssertionError("cached bytes not found on any worker")


def test_long_running_reader_never_serves_pages_corrupted_after_it_checked_them(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    rng = random.Random(11)
    files = {"small.bin": rng.randbytes(100_000), "large.bin": rng.randbytes(3 * MiB + 99)}
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint)
    large = files["large.bin"]
    with cluster.client() as c:
        # warm: located and checked once by this process, then served by pread alone
        for _ in range(3):
            assert c.read("/ds/data/small.bin") == files["small.bin"]
            assert c.read("/ds/data/large.bin") == large
            assert c.read("/ds/data/large.bin", MiB + 10, 5000) == large[MiB + 10 : MiB + 5010]
        served = c.counters()["short_circuit"]
        assert served >= 6, c.counters()
        corrupt0 = _metric(cluster, "shoal_corrupt_pages_total")

        _corrupt_on_disk(cluster, files["small.bin"][40_000:40_064])
        _corrupt_on_disk(cluster, large[MiB + 1000 : MiB + 1064])  # page 1 of the large file
        for _ in range(3):
            for path, off, n in (("small", 0, -1), ("large", 0, -1), ("large", MiB + 10, 5000)):
                src = files[f"{path}.bin"]
                want = src[off:] if n < 0 else src[off : off + n]
                try:
                    got = c.read(f"/ds/data/{path}.bin", off, n)
                except ShoalError:
                    continue  # an error is allowed; the corrupted bytes are not
                assert got == want, f"{path} [{off}, {n}) served corrupted bytes"
        assert c.counters()["corrupt"] >= 2, c.counters()
        _wait(
            lambda: _metric(cluster, "shoal_corrupt_pages_total") >= corrupt0 + 2,
            10,
            "the workers to count the bad pages",
        )
        # refetched: correct bytes again, from the short circuit
        assert c.read("/ds/data/small.bin") == files["small.bin"]
        assert c.read("/ds/data/large.bin") == large


# -- 10.3: a long-running reader sees a sync within its ring refresh -------------------


def test_long_running_short_circuit_reader_sees_sync_within_its_refresh(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = sample_files(20, 1000, 30_000, seed=5)
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": "never"})
    key = next(iter(files))
    path = f"/ds/data/{key}"
    with cluster.client(ring_refresh=1.0) as reader, cluster.client() as admin:
        job = admin.submit_job({"kind": "load", "dataset": "ds", "paths": [""]})
        _wait(lambda: admin.job(job["id"])["state"] == "done", 60, "the load")
        for _ in range(3):
            for k, v in files.items():
                assert reader.read(f"/ds/data/{k}") == v
        assert reader.counters()["short_circuit"] > 0
        s3_client(moto.endpoint).put_object(Bucket=bucket, Key=key, Body=b"version two")
        assert reader.read(path) == files[key]  # never revalidate: the old one until a sync
        job = admin.submit_job({"kind": "sync", "dataset": "ds", "paths": [""]})
        _wait(lambda: admin.job(job["id"])["state"] == "done", 60, "the sync")
        synced = time.monotonic()
        # the same process, reading as it did: the new bytes within its refresh (1 s)
        # plus a worker heartbeat (2 s) and some slack
        while (got := reader.read(path)) != b"version two":
            assert got == files[key]
            assert time.monotonic() - synced < 8.0, "the reader never saw the sync"
            time.sleep(0.05)
        for k, v in files.items():
            if k != key:
                assert reader.read(f"/ds/data/{k}") == v
        # a reader that learns of a sync before the workers do (it refreshes right after
        # it) is answered from the new manifest, not pinned to the old version for good
        s3_client(moto.endpoint).put_object(Bucket=bucket, Key=key, Body=b"version three")
        job = admin.submit_job({"kind": "sync", "dataset": "ds", "paths": [""]})
        _wait(lambda: admin.job(job["id"])["state"] == "done", 60, "the second sync")
        reader.dataset("ds")
        assert reader.read(path) == b"version three"

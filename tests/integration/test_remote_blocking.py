"""The sync client's blocking remote path (shoal.client.blocking): reads of a worker
over TCP on the caller's own thread, with no hop to the event-loop thread, byte-exact,
and handed to the async path (failover, fallback) whenever anything goes wrong."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import pytest

from shoal.client import Client
from shoal.client.blocking import BlockingReads
from shoal.errors import NotFound
from shoal.testing.cluster import TestCluster
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration

MiB = 1 << 20
PATH = "/ds/data/big.bin"


def _count_hops(c: Client) -> list[int]:
    """Count the façade's hops to its loop thread (``Client._run``)."""
    hops = [0]
    run = c._run

    def counted(coro: Any) -> Any:
        hops[0] += 1
        return run(coro)

    c._run = counted  # type: ignore[method-assign]
    return hops


def test_remote_reads_stay_on_the_callers_thread_and_exact(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    data = random.Random(11).randbytes(30 * MiB + 777)
    make_bucket(moto.endpoint, bucket, {"big.bin": data, "small.bin": b"x" * 1000})
    cluster.s3_dataset(bucket, moto.endpoint)
    with cluster.client(short_circuit=False) as c:
        # learns the dataset, the ring, the file; the worker caches it (a cold read may
        # outlast the blocking path's wait and go the async way)
        assert c.read(PATH, 0, -1) == data
        hops = _count_hops(c)
        got = [data[:MiB]]
        for off in range(MiB, len(data), MiB):
            got.append(c.read(PATH, off, MiB))
        assert b"".join(got) == data
        assert hops[0] == 0, f"{hops[0]} sequential reads hopped to the loop thread"
        # jumps, odd sizes, past the end, whole small files: exact and still no hop
        rng = random.Random(5)
        for _ in range(80):
            off = rng.randrange(0, len(data) + 10)
            n = rng.choice([1, 4095, MiB - 1, MiB, 3 * MiB + 7])
            assert c.read(PATH, off, n) == data[off : off + n]
        assert c.read("/ds/data/small.bin") == b"x" * 1000
        assert hops[0] == 0
        # four threads at once, each on its own connection
        errors: list[BaseException] = []

        def reader(seed: int) -> None:
            r = random.Random(seed)
            try:
                for _ in range(30):
                    off = r.randrange(0, len(data))
                    assert c.read(PATH, off, MiB) == data[off : off + MiB]
            except BaseException as exc:
                errors.append(exc)

        ts = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors
        # a worker's definite error is raised as the async path raises it
        with pytest.raises(NotFound):
            c.read("/ds/data/missing.bin", 0, MiB)


def test_a_dead_worker_is_left_to_the_async_path(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    data = random.Random(12).randbytes(12 * MiB)
    make_bucket(moto.endpoint, bucket, {"big.bin": data})
    cluster.s3_dataset(bucket, moto.endpoint, {"replicas": "2"})
    with cluster.client(short_circuit=False) as c:
        assert c.read(PATH, 0, MiB) == data[:MiB]
        blocking: BlockingReads = c._blocking
        w = blocking.owner(*_ds_key(c), 0.0)
        assert w is not None
        cluster.kill_worker(_index(cluster, w.id))
        # the open connection dies under the reads: each is answered by another owner
        # (or under storage), byte-exact
        for off in range(0, len(data), MiB):
            assert c.read(PATH, off, MiB) == data[off : off + MiB]


def _index(cluster: TestCluster, worker_id: str) -> int:
    for i in range(2):
        if json.loads((cluster.worker_dir(i) / "worker.json").read_text())["id"] == worker_id:
            return i
    raise AssertionError(f"no worker {worker_id}")


def _ds_key(c: Client) -> tuple[Any, str]:
    ds = c.cache.datasets["ds"][0]
    return ds, "data/big.bin"


def test_cat_many_asks_remote_workers_on_the_callers_thread(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    rng = random.Random(13)
    files = {f"small/{i:04d}.bin": rng.randbytes(rng.randrange(0, 200_000)) for i in range(300)}
    files["big.bin"] = rng.randbytes(9 * MiB)  # larger than a page: not in a BATCH
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint)
    paths = [f"/ds/data/{k}" for k in files]
    with cluster.client(short_circuit=False) as c:
        first = c.cat_many(paths)  # learns the dataset and the ring; the workers cache
        assert {p: first[p] for p in paths} == {f"/ds/data/{k}": v for k, v in files.items()}
        hops = _count_hops(c)
        small = [p for p in paths if "/small/" in p]
        for _ in range(3):
            got = c.cat_many(small)
            assert got == {p: files[p.removeprefix("/ds/data/")] for p in small}
        assert hops[0] == 0, f"{hops[0]} cat_many calls hopped to the loop thread"
        # what a BATCH does not carry, and errors per file, as the async path answers
        got = c.cat_many([*small[:5], "/ds/data/big.bin", "/ds/data/nope.bin"])
        assert got["/ds/data/big.bin"] == files["big.bin"]
        assert isinstance(got["/ds/data/nope.bin"], NotFound)
        assert all(got[p] == files[p.removeprefix("/ds/data/")] for p in small[:5])


def test_sequential_reads_are_pipelined_and_exact_when_interleaved(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    """A sequential reader sends its next window's request ahead; another read of the
    same thread to the same worker first receives that answer and keeps it as
    read-ahead bytes; nothing is ever sent past the end."""
    rng = random.Random(14)
    big = rng.randbytes(40 * MiB + 5)
    small = {f"s/{i:02d}.bin": rng.randbytes(rng.randrange(1, 90_000)) for i in range(40)}
    make_bucket(moto.endpoint, bucket, {"big.bin": big, **small})
    cluster.s3_dataset(bucket, moto.endpoint)
    paths = [f"/ds/data/{k}" for k in small]
    with cluster.client(short_circuit=False) as c:
        assert c.read(PATH, 0, -1) == big  # caches it; learns dataset, ring, file
        assert c.cat_many(paths) == {p: small[p.removeprefix("/ds/data/")] for p in paths}
        hops = _count_hops(c)
        blocking: BlockingReads = c._blocking
        ds, key = _ds_key(c)
        owner = blocking.owner(ds, key, 0.0)
        assert owner is not None
        ahead = c.aio._ahead
        beside = [p for p in paths if blocking.owner(ds, p.removeprefix("/ds/"), 0.0) == owner]
        assert c.read(PATH, 0, MiB) == big[:MiB]
        off, set_aside = MiB, 0
        while off < len(big):
            assert c.read(PATH, off, MiB) == big[off : off + MiB]
            off += MiB
            conn = blocking._local.conns[owner.id]
            if conn.ahead is not None and beside:
                # another file of the same worker first: the answer in flight is kept
                p = beside[set_aside % len(beside)]
                sent = conn.ahead.req.offset
                assert c.read(p) == small[p.removeprefix("/ds/data/")]
                assert conn.ahead is None
                assert ahead._entries[("ds", key)].start == sent
                set_aside += 1
            if off == 20 * MiB:  # cat_many on the same connection: the same
                assert c.read(PATH, off, MiB) == big[off : off + MiB]
                off += MiB
                got = c.cat_many(paths)
                assert got == {p: small[p.removeprefix("/ds/data/")] for p in paths}
        assert set_aside >= 2, "no read was ever sent ahead"
        assert blocking._local.conns[owner.id].ahead is None  # nothing past the end
        assert hops[0] == 0, f"{hops[0]} reads hopped to the loop thread"

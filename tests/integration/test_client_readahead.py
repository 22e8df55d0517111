"""Read-ahead for sequential readers over TCP (shoal.client.ahead): the second read in
a row that starts where the last ended asks for 8 MiB at once, and what was read ahead
is never served for another version of the file."""

from __future__ import annotations

import random
import time

import pytest

from shoal.client.ahead import AHEAD
from shoal.testing.cluster import TestCluster
from shoal.testing.s3 import MotoServer, make_bucket, s3_client

pytestmark = pytest.mark.integration

MiB = 1 << 20


def test_sequential_reads_over_tcp_ask_ahead_and_stay_exact(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    data = random.Random(3).randbytes(20 * MiB + 12345)
    make_bucket(moto.endpoint, bucket, {"big.bin": data})
    cluster.s3_dataset(bucket, moto.endpoint)
    with cluster.client(short_circuit=False) as c:
        got = b""
        before = c.counters()["remote"]
        for off in range(0, len(data), MiB):
            got += c.read("/ds/data/big.bin", off, MiB)
        assert got == data
        requests = c.counters()["remote"] - before
        # one 1 MiB read, then one request per AHEAD bytes (21 reads without read-ahead)
        assert requests <= 2 + len(data) // AHEAD, requests
        # jumps, odd sizes, reads past the end: byte-exact, never a short read
        rng = random.Random(5)
        for _ in range(60):
            off = rng.randrange(0, len(data) + 10)
            n = rng.choice([1, 4095, MiB - 1, MiB, 3 * MiB + 7])
            assert c.read("/ds/data/big.bin", off, n) == data[off : off + n]


def test_what_was_read_ahead_is_not_served_after_the_file_changed(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    old = random.Random(7).randbytes(12 * MiB)
    new = random.Random(8).randbytes(12 * MiB)
    make_bucket(moto.endpoint, bucket, {"f.bin": old})
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": "never"})
    with cluster.client(short_circuit=False, ring_refresh=0.5) as c:
        # two sequential reads: the second asked for 8 MiB, most of it kept ahead
        assert c.read("/ds/data/f.bin", 0, MiB) == old[:MiB]
        assert c.read("/ds/data/f.bin", MiB, MiB) == old[MiB : 2 * MiB]
        s3_client(moto.endpoint).put_object(Bucket=bucket, Key="f.bin", Body=new)
        job = c.submit_job({"kind": "sync", "dataset": "ds"})
        deadline = time.monotonic() + 60
        while c.job(job["id"])["state"] not in ("done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # once this client has seen the sync, every read is the new version: never the
        # old bytes it read ahead, never a mix
        deadline = time.monotonic() + 20
        while c.read("/ds/data/f.bin", 0, 16) != new[:16]:
            assert time.monotonic() < deadline, "the client never saw the sync"
            time.sleep(0.1)
        got = b"".join(c.read("/ds/data/f.bin", off, MiB) for off in range(0, len(new), MiB))
        assert got == new

"""A real worker keeps each large file version whole in one tier: a file within the mem
tier's share lives in mem, a larger one (which used to fill mem and spill the rest of
its pages to disk) in the disk tier, and a client on the host gets either as one
descriptor (``open_local``), byte-exact."""

from __future__ import annotations

import os
import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.testing.cluster import TestCluster, one_file_cluster, start_cluster
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration

MiB = 1 << 20


@pytest.fixture
def mem_worker(tmp_path: Path, s3_credentials: None) -> Iterator[TestCluster]:
    # mem holds 7.6 MiB (its high watermark), so its share is 3.8 MiB
    c = start_cluster(tmp_path / "cluster", workers=1, mem="8MiB", disk="64MiB")
    try:
        yield c
    finally:
        c.stop()


def test_large_files_are_handed_over_whole_from_the_tier_that_fits_them(
    moto: MotoServer, mem_worker: TestCluster, bucket: str
) -> None:
    c = mem_worker
    rng = random.Random(5)
    files = {"mid.bin": rng.randbytes(3 * MiB + 11), "big.bin": rng.randbytes(12 * MiB + 5)}
    make_bucket(moto.endpoint, bucket, files)
    c.s3_dataset(bucket, moto.endpoint)
    ssd = str(c.worker_dir(0) / "cache") + "/"
    in_ssd = {"mid.bin": False, "big.bin": True}
    with c.client(short_circuit=True) as cl:
        for name, data in files.items():
            assert cl.read(f"/ds/data/{name}") == data  # fetched and cached by the worker
            got = cl.open_local(f"/ds/data/{name}", load=False)
            assert got is not None, f"{name} is not whole in one tier"
            fd, info = got
            try:
                assert info.size == len(data)
                assert os.readlink(f"/proc/self/fd/{fd}").startswith(ssd) == in_ssd[name]
                assert os.pread(fd, len(data) + 1, 0) == data
            finally:
                os.close(fd)


def test_a_whole_file_ask_counts_a_read_of_every_page(tmp_path: Path) -> None:
    """A mount's or gateway's ask for a whole cached file is answered as one run,
    without a lookup per page (``Ops.whole_run``), byte-exact, and still counts as a
    read of each of the file's pages in the statistics eviction and a restart use."""
    data = random.Random(7).randbytes(5 * MiB + 3)  # 6 pages
    with one_file_cluster(tmp_path, data) as c:
        with c.client(short_circuit=True) as cl:
            assert cl.read("/ds/m/big.bin") == data
        c.stop_process("worker-0")  # its access statistics are all written on close
        before = _access_counts(c)
        c.start_worker(0)
        with c.client(short_circuit=True) as cl:
            assert cl.stat("/ds/m/big.bin").size == len(data)  # the restarted worker learns it
            for _ in range(3):
                got = cl.open_local("/ds/m/big.bin", load=False)
                assert got is not None
                fd, info = got
                try:
                    assert info.size == len(data)
                    assert os.pread(fd, len(data) + 1, 0) == data
                finally:
                    os.close(fd)
        c.stop_process("worker-0")
        after = _access_counts(c)
    assert len(before) == 6 and len(after) == 6
    assert [a - b for a, b in zip(after, before, strict=True)] == [3] * 6


def _access_counts(c: TestCluster) -> list[int]:
    with sqlite3.connect(c.worker_dir(0) / "cache" / "index.sqlite") as db:
        return [n for (n,) in db.execute("SELECT access_count FROM pages ORDER BY idx")]

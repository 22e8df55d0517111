"""A random reader of a large file that fits the cap gets the whole file fetched in the
background once it has missed a few times off any sequential run, each page exactly
once, and never a page of another version (issue 16)."""

from __future__ import annotations

import os
import time

import pytest

from shoal.testing.cluster import TestCluster
from shoal.testing.s3 import CountingProxy, MotoServer, make_bucket

pytestmark = pytest.mark.integration

MiB = 1 << 20
PAGES = 12


def _gets(proxy: CountingProxy, bucket: str) -> int:
    return proxy.counts_for(f"{bucket}/big.bin").get("GET_range", 0)


def _wait_bytes(proxy: CountingProxy, bucket: str, n: int) -> int:
    def asked() -> int:
        return proxy.counts_for(f"{bucket}/big.bin").get("GET_range_bytes", 0)

    deadline = time.monotonic() + 30
    while asked() < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return asked()


def test_random_misses_fetch_the_whole_file_once(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    data = os.urandom(PAGES * MiB + 123)  # 13 pages, the last one short
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, {"big.bin": data})
        cluster.s3_dataset(bucket, proxy.endpoint, {"page_size": "1MiB", "readahead": "16"})
        proxy.reset()
        with cluster.client(short_circuit=False) as c:
            path = "/ds/data/big.bin"
            # three scattered misses (a footer, two chunks): only their own pages
            for page in (12, 5, 9):
                off = page * MiB
                assert c.read(path, off, 100) == data[off : off + 100]
            # (and page 0, which came with the first read's metadata)
            assert _gets(proxy, bucket) == 4
            # the fourth: the rest of the file comes in the background, each page once
            # (adjacent pages in one GET: fewer GETs than pages, every byte asked once)
            assert c.read(path, 2 * MiB, 100) == data[2 * MiB : 2 * MiB + 100]
            assert _wait_bytes(proxy, bucket, len(data)) == len(data)
            gets = _gets(proxy, bucket)
            assert 4 < gets <= PAGES + 1
            assert c.read(path) == data
            for page in range(PAGES + 1):
                off = page * MiB + 7
                assert c.read(path, off, 4096) == data[off : off + 4096]
            counts = proxy.counts_for(f"{bucket}/big.bin")
            assert _gets(proxy, bucket) == gets, counts
            assert counts["GET_range_bytes"] == len(data), counts


def test_a_changed_object_is_never_mixed_into_a_whole_file_fetch(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    old, new = os.urandom(PAGES * MiB), os.urandom(PAGES * MiB)
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, {"big.bin": old})
        cluster.s3_dataset(bucket, proxy.endpoint, {"page_size": "1MiB", "readahead": "16"})
        with cluster.client(short_circuit=False) as c:
            path = "/ds/data/big.bin"
            for page in (11, 4, 8):
                off = page * MiB
                assert c.read(path, off, 10) == old[off : off + 10]
            make_bucket(moto.endpoint, bucket, {"big.bin": new})
            # the fourth miss starts a whole-file fetch of the old version: every one of
            # its GETs is conditioned on the old ETag and refused; the reader moves on to
            # the new version, as without prefetch
            got = c.read(path, 2 * MiB, 10)
            assert got in (old[2 * MiB : 2 * MiB + 10], new[2 * MiB : 2 * MiB + 10])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                whole = c.read(path)
                if whole == new:
                    break
                assert whole == old  # a whole read is one version, never a mix
                time.sleep(0.1)
            assert c.read(path) == new
            for page in (0, 3, 11):
                off = page * MiB
                assert c.read(path, off, 1000) == new[off : off + 1000]

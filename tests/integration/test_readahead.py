"""The worker reads ahead only for sequential reads: a random range (a parquet footer,
a column chunk) fetches the pages it touches and nothing more (issue 11 item 8)."""

from __future__ import annotations

import os
import time

import pytest

from shoal.testing.cluster import TestCluster
from shoal.testing.s3 import CountingProxy, MotoServer, make_bucket

pytestmark = pytest.mark.integration

MiB = 1 << 20


def _asked(proxy: CountingProxy, bucket: str) -> int:
    """Bytes the worker's ranged GETs of big.bin asked for (adjacent pages may share one)."""
    return proxy.counts_for(f"{bucket}/big.bin").get("GET_range_bytes", 0)


def test_random_ranges_fetch_only_the_pages_they_touch(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    data = os.urandom(8 * MiB)
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, {"big.bin": data})
        cluster.s3_dataset(bucket, proxy.endpoint, {"page_size": "1MiB", "readahead": "16"})
        proxy.reset()
        with cluster.client(short_circuit=False) as c:
            path = "/ds/data/big.bin"
            # a first read at the start: page 0 plus a small first readahead (2 pages)
            assert c.read(path, 100, 4096) == data[100:4196]
            # jumps elsewhere: only the touched page each
            assert c.read(path, 6 * MiB + 5, 4096) == data[6 * MiB + 5 : 6 * MiB + 4101]
            assert c.read(path, 4 * MiB, 10) == data[4 * MiB : 4 * MiB + 10]
            deadline = time.monotonic() + 20
            while _asked(proxy, bucket) < 5 * MiB and time.monotonic() < deadline:
                time.sleep(0.05)
            # background readahead would land within a moment: give it one, then count
            time.sleep(1.0)
            # pages 0, 1, 2 (readahead), 6 and 4; the old fixed 16-page window fetched all 8
            assert _asked(proxy, bucket) == 5 * MiB, proxy.counts_for(f"{bucket}/big.bin")
            # a sequential reader still gets its readahead: pages 1-2 are cached, 3 is not
            before = _asked(proxy, bucket)
            assert c.read(path, 1 * MiB, 2 * MiB) == data[1 * MiB : 3 * MiB]
            assert _asked(proxy, bucket) == before

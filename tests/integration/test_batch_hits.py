"""A BATCH that mixes cached files, files still to fetch and missing ones: the worker
answers the cached ones on the spot and only the rest through tasks (one open per data
file per answer), so every file's bytes and the hit/miss accounting must come out exactly
as if each had been read on its own."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.testing.cluster import TestCluster, sample_files
from shoal.testing.reports import wait_dataset
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration

N = 40


def _report(cluster: TestCluster, name: str, reads: int) -> dict[str, Any]:
    return wait_dataset(cluster, name, lambda d: d["hits"] + d["misses"] >= reads, timeout=20)


def test_mixed_batch_keeps_bytes_and_accounting(
    moto: MotoServer, module_cluster: TestCluster, bucket: str
) -> None:
    files = sample_files(N, 1000, 60_000, seed=13)
    make_bucket(moto.endpoint, bucket, files)
    module_cluster.s3_dataset(bucket, moto.endpoint, name="bh")
    want = {f"/bh/data/{k}": v for k, v in files.items()}
    paths = list(want)
    warm = paths[::2]  # every other file cached first: hits and misses interleave
    with module_cluster.client(short_circuit=False) as c:
        assert c.cat_many(warm) == {p: want[p] for p in warm}
        missing = "/bh/data/no-such-file.bin"
        mixed = [*paths[: N // 2], missing, *paths[N // 2 :]]
        got = c.cat_many(mixed)
        assert isinstance(got.pop(missing), FileNotFoundError)
        assert got == want
        # all cached now: a batch of hits only, twice (descriptors reused per answer)
        for _ in range(2):
            assert c.cat_many(paths) == want
    d = _report(module_cluster, "bh", len(warm) + N + 2 * N)
    assert (d["misses"], d["hits"]) == (N, len(warm) + 2 * N), d
    total = sum(map(len, want.values()))
    src = d["bytes_by_source"]
    assert src["ufs"] == total, d
    assert src["remote"] == total * 2 + sum(len(want[p]) for p in warm), d

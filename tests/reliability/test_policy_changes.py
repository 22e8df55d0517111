"""Policy changes while reader processes read: page size (a new layout) and replicas
changed back and forth under ranged reads of large files and whole reads of small
ones. No read may return short, empty or different bytes, and none may fail
(issue 10 item 1)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from relhelpers import Figures, Readers, digest, load, seed

from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.s3 import MotoServer

pytestmark = pytest.mark.integration

MiB = 1 << 20
CHANGES = [
    {"page_size": "256KiB"},
    {"replicas": "2"},
    {"page_size": "1MiB"},
    {"page_size": "512KiB", "replicas": "1"},
    {"page_size": "1MiB"},
    {"page_size": "256KiB"},
]


@pytest.fixture
def cluster2(tmp_path: Path, s3_credentials: None) -> Iterator[TestCluster]:
    c = start_cluster(tmp_path / "c", workers=2, mem="0")
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_policy_changes_during_reads_return_only_whole_correct_bytes(
    moto: MotoServer, cluster2: TestCluster, bucket: str, readers: Readers, figures: Figures
) -> None:
    rng = random.Random(101)
    files = sample_files(40, 1000, 100_000, seed=101)
    for i in range(3):
        files[f"big/L{i}.bin"] = rng.randbytes(5 * MiB + rng.randrange(MiB))
    ds = seed(moto, cluster2, bucket, files)
    load(cluster2)
    want: dict[str, str] = {ds.path(k): digest(v) for k, v in files.items() if "big" not in k}
    for i in range(3):
        big = files[f"big/L{i}.bin"]
        for _ in range(20):  # ranges across page boundaries of every page size used
            off = rng.randrange(len(big))
            n = rng.randrange(1, 2 * MiB)
            want[f"{ds.path(f'big/L{i}.bin')}#{off}#{n}"] = digest(big[off : off + n])
    common = {"request_timeout": 10.0, "ring_refresh": 1.0}
    readers.start(cluster2.master_url, want, 2, settings={**common, "short_circuit": False})
    readers.start(cluster2.master_url, want, 1, settings={**common, "short_circuit": True})
    readers.wait_reads(10, 60)
    with cluster2.client() as c:
        for change in CHANGES:
            c.update_dataset("ds", change)
            # reads across the change in every reader: the old bug showed for 2-5 s
            readers.wait_each_more(30, 90)
    total = readers.stop()
    figures.record(
        f"{len(CHANGES)} policy changes (page size, replicas) during ranged and whole reads "
        "(3 processes)",
        total["reads"],
        "0 wrong or short bytes, 0 failed reads",
        total["wrong"] + total["failed"],
        changes=len(CHANGES),
    )
    assert total["wrong"] == 0 and total["failed"] == 0, total["errors"]

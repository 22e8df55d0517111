"""A fresh reader that locates a whole dataset's cached small files (LOCATE_DIR) builds
no per-file records for them: each file costs its ``pread`` and check when read, so a
reader of a quarter of the files (one of four DataLoader workers) does not pay for all
of them first. The located files keep every rule of the short circuit: checked before
served, never served once the client forgets or relearns the path in another version."""

from __future__ import annotations

import pytest
from test_datapath_consistency import _corrupt_on_disk

from shoal.testing.cluster import TestCluster, sample_files
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration

N = 400  # four directories of 100


def _warm(moto: MotoServer, cluster: TestCluster, bucket: str) -> dict[str, bytes]:
    files = sample_files(N, 2000, 9000, seed=31)
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": "never"})
    with cluster.client() as warm:
        got = warm.cat_many([f"/ds/data/{k}" for k in files])
        assert all(got[f"/ds/data/{k}"] == v for k, v in files.items())
    return files


def test_a_reader_of_part_of_a_located_dataset_builds_records_only_for_what_it_reads(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = _warm(moto, cluster, bucket)
    keys = sorted(files)
    part = keys[::4]  # a quarter, across every directory
    with cluster.client() as c:
        for k in part:
            assert c.read(f"/ds/data/{k}") == files[k]
        assert any(d[2] is None for d in c.cache.dirs_located)  # the whole dataset
        counters = c.counters()
        # served by pread after the first few round trips
        assert counters["short_circuit"] >= len(part) - 10, counters
        records = sum(1 for k in c.cache.meta if k[0] == "ds")
        assert records <= 10, f"{records} metadata records for {len(part)} reads"
        # the rest were located too: served with no round trip, checked, correct
        for k in keys:
            assert c.read_fast(f"/ds/data/{k}") == files[k], k
        assert c.counters()["short_circuit"] >= counters["short_circuit"] + len(keys) - 10


def test_located_small_files_are_checked_and_forgotten_like_located_pages(
    moto: MotoServer, cluster: TestCluster, bucket: str
) -> None:
    files = _warm(moto, cluster, bucket)
    keys = sorted(files)
    with cluster.client() as c:
        for k in keys[::20]:  # across the directories: the whole dataset gets located
            assert c.read(f"/ds/data/{k}") == files[k]
        unread = [k for k in keys if ("ds", f"data/{k}") in c.cache.dir_locs]
        # kept raw: every file of the located directories but the few read (a locate
        # that timed out on a loaded machine leaves a directory to the next read)
        assert len(unread) >= N // 2, len(unread)
        # corrupted on disk before this process ever read it: caught, never served
        bad = unread[0]
        _corrupt_on_disk(cluster, files[bad][1000:1064])
        assert c.read_fast(f"/ds/data/{bad}") is None
        assert c.counters()["corrupt"] == 1
        assert c.read(f"/ds/data/{bad}") == files[bad]  # refetched by the worker
        # forgotten (a stale version, a write): asked again, not served from the answer
        gone = unread[1]
        c.cache.forget("ds", f"data/{gone}")
        assert c.read_fast(f"/ds/data/{gone}") is None
        assert c.read(f"/ds/data/{gone}") == files[gone]
        # learnt again at the version located (a listing): still a pread, no round trip
        d = unread[2].rsplit("/", 1)[0]
        listed = [k for k in unread[2:] if k.startswith(d + "/")]
        c.ls(f"/ds/data/{d}")
        for k in listed:
            assert c.read_fast(f"/ds/data/{k}") == files[k], k

"""A full cache disk (issue 10 item 5): a worker's disk tier on a small tmpfs, mounted in
the test (root only; shoal.testing.store_disk.small_tmpfs skips otherwise) and unmounted
when it ends. A load of more than fits adds up (done + failed + skipped = total), every
file it reports done is cached (reading it takes no store GET), and every file stays
readable, with the right bytes, from the cache or the store."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from relhelpers import Figures, digest, load

from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.s3 import CountingProxy, MotoServer, make_bucket
from shoal.testing.store_disk import small_tmpfs

pytestmark = pytest.mark.integration

MiB = 1 << 20


@pytest.fixture
def tiny_disk(tmp_path: Path, s3_credentials: None) -> Iterator[TestCluster]:
    """One worker whose disk tier, declared 1 GiB, lives on an 8 MiB tmpfs."""
    cdir = tmp_path / "cluster"
    with small_tmpfs(cdir / "worker-0" / "cache", "8m"):
        c = start_cluster(cdir, workers=1, mem="0", disk="1GiB")
        try:
            yield c
        finally:
            c.stop()


def _read_everything(
    c: TestCluster, proxy: CountingProxy, bucket: str, files: dict[str, bytes]
) -> tuple[int, int]:
    """(wrong or failed reads, files that needed a store GET) reading every file once."""
    proxy.reset()
    bad = 0
    with c.client(short_circuit=False) as cl:
        for k, v in files.items():
            try:
                bad += digest(cl.read(f"/ds/data/{k}")) != digest(v)
            except Exception:  # counted: a failed read is a finding
                bad += 1
    fetched = 0
    for k in files:
        got = proxy.counts_for(f"{bucket}/{k}")
        fetched += got.get("GET", 0) + got.get("GET_range", 0) > 0
    return bad, fetched


@pytest.mark.timeout(180)
def test_a_pinned_load_larger_than_its_disk_adds_up_and_done_means_cached(
    moto: MotoServer, tiny_disk: TestCluster, bucket: str, figures: Figures
) -> None:
    c = tiny_disk
    files = sample_files(120, 90_000, 110_000, seed=111)  # ~12 MB on 8 MiB, none evictable
    make_bucket(moto.endpoint, bucket, files)
    with CountingProxy(moto.endpoint) as proxy:
        c.s3_dataset(bucket, proxy.endpoint, {"pin": "true"})
        job = load(c)
        done, failed = job["files_done"], job["files_failed"]
        adds_up = done + failed + job["files_skipped"] == len(files)
        bad, fetched = _read_everything(c, proxy, bucket, files)
    figures.record(
        "pinned load of 12 MB into a tier declared 1 GiB on an 8 MiB tmpfs",
        len(files),
        "done + failed + skipped = total; a file reported done reads with no store GET; "
        "every file reads correct bytes",
        int(not adds_up) + max(0, fetched - failed) + bad,
        files_done=done,
        files_failed=failed,
        read_from_store=fetched,
    )
    assert adds_up, job
    assert done > 0 and failed > 0, job
    assert all("cache full" in why for _, why in job["failures"]), job["failures"][:3]
    assert bad == 0
    assert fetched <= failed, f"{fetched - failed} files reported done were not cached"


@pytest.mark.timeout(180)
def test_a_load_onto_a_disk_filled_by_something_else_adds_up_and_reads_go_on(
    moto: MotoServer, tiny_disk: TestCluster, bucket: str, figures: Figures
) -> None:
    """The tier's quota is far from reached, but its filesystem is full of another
    program's data: the tier's real free space is its quota."""
    c = tiny_disk
    cache = c.worker_dir(0) / "cache"
    st = os.statvfs(cache)
    free = st.f_bavail * st.f_frsize
    with open(cache / "someone-elses.bin", "wb") as f:  # leave ~1 MiB free
        f.write(b"\1" * max(0, free - MiB))
    files = sample_files(40, 90_000, 110_000, seed=113)  # ~4 MB into ~1 MiB
    make_bucket(moto.endpoint, bucket, files)
    with CountingProxy(moto.endpoint) as proxy:
        c.s3_dataset(bucket, proxy.endpoint)
        job = load(c)
        done, failed = job["files_done"], job["files_failed"]
        adds_up = done + failed + job["files_skipped"] == len(files)
        bad, fetched = _read_everything(c, proxy, bucket, files)
        bad2, _ = _read_everything(c, proxy, bucket, files)  # and again: reads go on
    figures.record(
        "load of 4 MB onto a tier (1 GiB declared) whose disk another file filled",
        len(files),
        "done + failed + skipped = total; every file reads correct bytes, twice",
        int(not adds_up) + bad + bad2,
        files_done=done,
        files_failed=failed,
        read_from_store=fetched,
    )
    assert adds_up, job
    assert bad == 0 and bad2 == 0

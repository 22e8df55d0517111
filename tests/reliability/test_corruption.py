"""Bytes flipped on disk in a worker's cache files, behind its back: no reader of any
kind (TCP, a new short-circuit process, a long-running short-circuit reader) returns
them."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from relhelpers import Dataset, Figures, Readers, digest, seed, wait_for

from shoal.client import Client
from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.s3 import MotoServer

pytestmark = pytest.mark.integration

MiB = 1 << 20


@pytest.fixture
def cluster1(tmp_path: Path, s3_credentials: None) -> Iterator[TestCluster]:
    # one worker and no memory tier: every cached byte is in a file under its cache dir
    c = start_cluster(tmp_path / "c", workers=1, mem="0")
    try:
        yield c
    finally:
        c.stop()


def _files() -> dict[str, bytes]:
    files = sample_files(30, 2000, 60_000, seed=51)
    files["big/a.bin"] = random.Random(52).randbytes(2 * MiB + 77)
    return files


def corrupt_on_disk(cluster: TestCluster, files: dict[str, bytes]) -> int:
    """Flip one byte inside every stored copy of every file (found by its bytes) in the
    worker's cache files; the number of copies flipped."""
    needles = {k: v[:64] for k, v in files.items() if len(v) >= 200}
    flipped = 0
    for p in (cluster.worker_dir(0) / "cache").rglob("*"):
        if not p.is_file() or p.suffix in (".db", ".sqlite", ".wal", ".shm", ".json"):
            continue
        raw = bytearray(p.read_bytes())
        changed = False
        for needle in needles.values():
            at = raw.find(needle)
            while at >= 0:
                raw[at + 100] ^= 0xFF
                flipped += 1
                changed = True
                at = raw.find(needle, at + 1)
        if changed:
            with open(p, "r+b") as f:  # in place: descriptors held by readers see it
                f.write(raw)
    return flipped


def _check(c: Client, ds: Dataset, rng: random.Random) -> tuple[int, int, list[str]]:
    """Read every file whole, and ranges of the large one; (reads, wrong, errors)."""
    reads = wrong = 0
    errors: list[str] = []
    for k, v in ds.files.items():
        reads += 1
        try:
            if digest(c.read(ds.path(k))) != digest(v):
                wrong += 1
        except Exception as exc:  # counted
            errors.append(f"{k}: {type(exc).__name__}: {exc}")
    big = ds.files["big/a.bin"]
    for _ in range(10):
        off = rng.randrange(len(big))
        n = rng.randrange(1, 300_000)
        reads += 1
        try:
            if c.read(ds.path("big/a.bin"), off, n) != big[off : off + n]:
                wrong += 1
        except Exception as exc:  # counted
            errors.append(f"range: {type(exc).__name__}: {exc}")
    return reads, wrong, errors


def _warm(cluster: TestCluster, ds: Dataset) -> None:
    with cluster.client(short_circuit=False) as c:
        for k, v in ds.files.items():
            assert c.read(ds.path(k)) == v


@pytest.mark.timeout(120)
def test_corruption_is_never_served_to_tcp_or_new_short_circuit_readers(
    moto: MotoServer, cluster1: TestCluster, bucket: str, readers: Readers, figures: Figures
) -> None:
    ds = seed(moto, cluster1, bucket, _files())
    _warm(cluster1, ds)
    rng = random.Random(53)
    assert corrupt_on_disk(cluster1, ds.files) >= len(ds.files)
    with cluster1.client(short_circuit=False) as c:
        reads, wrong, errors = _check(c, ds, rng)
        detected = c.counters()["corrupt"]
    figures.record(
        "TCP reads of pages corrupted on disk",
        reads,
        "0 wrong bytes, 0 failed reads",
        wrong + len(errors),
        detected=detected,
    )
    assert detected > 0
    assert wrong == 0 and not errors, errors[:3]

    # the worker refetched what the TCP reader reported: corrupt the new copies too
    _warm(cluster1, ds)
    assert corrupt_on_disk(cluster1, ds.files) >= len(ds.files)
    readers.start(cluster1.master_url, ds.want, 2, rounds=2)
    wait_for(lambda: all(p.poll() is not None for p, _ in readers.procs), 90, "the readers")
    total = readers.stop()
    figures.record(
        "new short-circuit reader processes reading pages corrupted on disk",
        total["reads"],
        "0 wrong bytes, 0 failed reads",
        total["wrong"] + total["failed"],
    )
    assert total["reads"] == 2 * 2 * len(ds.files)
    assert total["wrong"] == 0 and total["failed"] == 0, total["errors"]


@pytest.mark.timeout(120)
def test_corruption_is_never_served_to_a_long_running_short_circuit_reader(
    moto: MotoServer, cluster1: TestCluster, bucket: str, figures: Figures
) -> None:
    ds = seed(moto, cluster1, bucket, _files())
    _warm(cluster1, ds)
    rng = random.Random(54)
    with cluster1.client() as c:
        # the reader verifies and keeps descriptors and locations of every file
        reads, wrong, errors = _check(c, ds, rng)
        assert wrong == 0 and not errors
        assert c.counters()["short_circuit"] > 0
        total_reads = total_wrong = 0
        for _ in range(2):  # corrupted twice: also after the refetch
            assert corrupt_on_disk(cluster1, ds.files) >= len(ds.files)
            reads, wrong, errors = _check(c, ds, rng)
            total_reads += reads
            total_wrong += wrong + len(errors)
        # the bad bytes were read, and caught by this reader's own check
        detected = c.counters()["corrupt"]
        figures.record(
            "long-running short-circuit reader, pages corrupted on disk after it read them",
            total_reads,
            "0 wrong bytes, 0 failed reads",
            total_wrong,
            detected=detected,
        )
        assert total_wrong == 0
        assert detected > 0

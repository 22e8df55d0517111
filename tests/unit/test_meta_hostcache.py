"""The host's metadata cache (shoal.client.hostmeta) in plain calls: what one process
listed answers another's lookups with the same metadata, within the staleness bound,
for the same dataset incarnation only; tombstones hide changed files; torn or bad
records are misses; the client's metadata table answers from it without records."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from shoal.client import hostmeta
from shoal.client.cache import ClientCache
from shoal.client.hostmeta import HostMeta
from shoal.core.types import NEVER, CachePolicy, Dataset, FileInfo, Mount


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ds(staleness: float = NEVER, generation: int = 1) -> Dataset:
    return Dataset(
        "ds",
        (Mount("data", "s3://b"),),
        CachePolicy(staleness=staleness),
        generation=generation,
    )


def _listing(n: int, d: str = "data/a") -> list[FileInfo]:
    out = [
        FileInfo(f"{d}/f{i}.bin", 100 + i, f'"etag{i}"', 0.0, False, 1_700_000_000_123_456_789 + i)
        for i in range(n)
    ]
    return [*out, FileInfo(f"{d}/sub", 0, "", 0.0, True)]


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "hm"
    monkeypatch.setenv(hostmeta.ENV, str(d))
    return d


def _pair(clock: Clock) -> tuple[HostMeta, HostMeta]:
    return HostMeta("http://m:1", clock), HostMeta("http://m:1", clock)


def test_a_listing_answers_another_process_with_the_same_metadata(root: Path) -> None:
    clock = Clock()
    writer, reader = _pair(clock)
    entries = _listing(50)
    writer.put(_ds(), "data/a", entries)
    space = reader.space(_ds())
    assert space is not None
    for e in entries[:-1]:
        got = space.lookup(e.path)
        assert got is not None
        assert got[0] == e and got[1] == clock.now
    assert space.lookup("data/a/sub") is None  # directories are not kept
    assert space.lookup("data/a/nope") is None and space.lookup("data/b/f1.bin") is None


def test_other_incarnations_and_bound_zero_see_nothing(root: Path) -> None:
    clock = Clock()
    writer, reader = _pair(clock)
    writer.put(_ds(), "data/a", _listing(3))
    assert reader.space(_ds(generation=2)) is None  # a sync made a new generation
    other = HostMeta("http://m:2", clock)
    assert other.space(_ds()) is None  # another cluster
    scoped = HostMeta("http://m:1", clock, token=lambda: "a-reader-token-for-another-dataset")
    assert scoped.space(_ds()) is None  # another token: shares nothing
    same = HostMeta("http://m:1", clock, token=lambda: "t1")
    HostMeta("http://m:1", clock, token=lambda: "t1").put(_ds(), "data/a", _listing(3))
    assert same.space(_ds()) is not None  # the same token: shared
    writer.put(_ds(staleness=0), "data/a", _listing(3))
    assert reader.space(_ds(staleness=0)) is None


def test_records_older_than_the_bound_or_the_ttl_are_not_read(root: Path) -> None:
    clock = Clock()
    writer, reader = _pair(clock)
    writer.put(_ds(staleness=30), "data/a", _listing(3))
    writer.put(_ds(), "data/a", _listing(3))
    clock.now += 31
    space = reader.space(_ds(staleness=30))
    assert space is not None and space.lookup("data/a/f1.bin") is None
    space = reader.space(_ds())
    assert space is not None and space.lookup("data/a/f1.bin") is not None
    clock.now += hostmeta.HOST_TTL
    space = reader.space(_ds())
    assert space is not None and space.lookup("data/a/f1.bin") is None


def test_a_tombstone_hides_a_file_until_a_newer_listing(root: Path) -> None:
    clock = Clock()
    writer, reader = _pair(clock)
    writer.put(_ds(), "data/a", _listing(3))
    clock.now += 1
    writer.tombstone(_ds(), "data/a/f1.bin")
    space = reader.space(_ds())
    assert space is not None
    assert space.lookup("data/a/f1.bin") is None and space.lookup("data/a/f2.bin") is not None
    clock.now += 1
    changed = [FileInfo("data/a/f1.bin", 7, '"new"', 0.0, False, 1_800_000_000_000_000_000)]
    writer.put(_ds(), "data/a", changed)
    space.checked -= hostmeta.RECHECK
    assert space.due()
    space.refresh()
    got = space.lookup("data/a/f1.bin")
    assert got is not None and (got[0].size, got[0].version) == (7, '"new"')


def test_torn_and_corrupt_records_are_misses(root: Path) -> None:
    clock = Clock()
    writer, reader = _pair(clock)
    writer.put(_ds(), "data/a", _listing(3, "data/a"))
    writer.put(_ds(), "data/b", _listing(3, "data/b"))
    (log,) = [p for p in root.rglob("*.log")]
    data = bytearray(log.read_bytes())
    data[-3] ^= 0xFF  # data/b's body: its checksum fails
    log.write_bytes(bytes(data) + b"LSHM-torn")  # and a record being written
    space = reader.space(_ds())
    assert space is not None
    assert space.lookup("data/a/f1.bin") is not None
    assert space.lookup("data/b/f1.bin") is None


def test_names_with_newlines_are_not_kept(root: Path) -> None:
    writer, reader = _pair(Clock())
    writer.put(_ds(), "data/a", [FileInfo("data/a/x\ny", 1, "v", 1.0)])
    assert reader.space(_ds()) is None  # nothing written, no folder


def test_a_folder_not_private_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "open"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    monkeypatch.setenv(hostmeta.ENV, str(d))
    writer, _ = _pair(Clock())
    assert writer.root is None
    monkeypatch.setenv(hostmeta.ENV, "off")
    assert _pair(Clock())[0].root is None


def test_the_metadata_table_answers_from_the_host_without_records(root: Path) -> None:
    clock = Clock()
    writer, reader = _pair(clock)
    writer.put(_ds(), "data/a", _listing(5))
    c = ClientCache()
    space = reader.space(_ds())
    assert space is not None
    c.meta.spaces["ds"] = space
    assert len(c.meta) == 0
    got = c.meta.get(("ds", "data/a/f2.bin"))
    assert got is not None and got[0].size == 102 and len(c.meta) == 0
    assert c.meta.get(("other", "data/a/f2.bin")) is None
    # a small file a LOCATE_DIR answer located: left to its first read (remember)
    c.dir_locs[("ds", "data/a/f3.bin")] = ((1, 2), 0, 103, 0, '"etag3"', "w-1", 1 << 20)
    assert c.meta.get(("ds", "data/a/f3.bin")) is None
    c.forget("ds", "data/a/f2.bin")  # it changed: hidden here from now on
    assert c.meta.get(("ds", "data/a/f2.bin")) is None
    c.forget_dataset("ds")
    assert c.meta.get(("ds", "data/a/f1.bin")) is None


def test_old_logs_are_swept_at_most_once_per_sweep_every(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostmeta, "_SWEPT", [float("-inf")])
    root.mkdir(mode=0o700)
    writer = HostMeta("http://m:1", Clock())
    old = time.time() - hostmeta.HOST_TTL - 10

    def stale_log(folder: str) -> Path:
        d = root / folder
        d.mkdir(mode=0o700)
        log = d / "1-dead.log"
        log.write_bytes(b"x")
        os.utime(log, (old, old))
        os.utime(d, (old, old))
        return log

    gone = stale_log("old-incarnation")
    writer.put(_ds(generation=1), "data/a", _listing(2))  # a new folder: swept first
    assert not gone.exists()
    kept = stale_log("another-old-one")
    # every sync makes a new incarnation: its first write does not scan the host again
    writer.put(_ds(generation=2), "data/a", _listing(2))
    assert kept.exists()
    monkeypatch.setattr(hostmeta, "SWEEP_EVERY", 0.0)
    writer.put(_ds(generation=3), "data/a", _listing(2))
    assert not kept.exists()
    reader = HostMeta("http://m:1", Clock())
    space = reader.space(_ds(generation=3))  # what this process wrote stays
    assert space is not None and space.lookup("data/a/f1.bin") is not None

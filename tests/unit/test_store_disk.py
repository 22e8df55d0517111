"""DiskTier specifics beyond the conformance suite: layout, crash, failures, fast path."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.config import TierSpec
from shoal.errors import InvalidArgument
from shoal.store import layout
from shoal.store.base import PutMeta
from shoal.store.disk import DiskTier
from shoal.store.index import TierIndex
from shoal.testing.store_conformance import PAGE, blob, fkey, put_file

MiB = 1 << 20


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def tier_dir(tmp_path: Path) -> str:
    return str(tmp_path / "ssd")


@pytest.fixture
def opened(tier_dir: str) -> Iterator[list[DiskTier]]:
    tiers: list[DiskTier] = []
    yield tiers
    for t in tiers:
        t.close()


def open_tier(opened: list[DiskTier], path: str, capacity: int = 64 * MiB, **kw: object) -> DiskTier:  # fmt: skip
    t = DiskTier(TierSpec("ssd", path, capacity), **kw)  # type: ignore[arg-type]
    opened.append(t)
    return t


def test_incompatible_layout_is_wiped(
    tier_dir: str, opened: list[DiskTier], caplog: pytest.LogCaptureFixture
) -> None:
    os.makedirs(os.path.join(tier_dir, "seg"))
    Path(tier_dir, "seg", "00000001.seg").write_bytes(b"old")
    Path(tier_dir, "layout.json").write_text(json.dumps({"format": "x", "version": 99}))
    with caplog.at_level(logging.WARNING, logger="shoal.store.disk"):
        t = open_tier(opened, tier_dir)
    assert "discarding" in caplog.text
    assert not os.path.exists(os.path.join(tier_dir, "seg", "00000001.seg"))
    assert json.loads(Path(tier_dir, "layout.json").read_text())["version"] == layout.VERSION
    assert put_file(t, fkey("a"), b"abc") and t.get(fkey("a").page(0)) == b"abc"


def test_a_tier_directory_has_one_owner(tier_dir: str, opened: list[DiskTier]) -> None:
    open_tier(opened, tier_dir)
    with pytest.raises(InvalidArgument, match="in use"):
        DiskTier(TierSpec("ssd", tier_dir, MiB))


CRASH = """
import os, sys
from shoal.config import TierSpec
from shoal.errors import InvalidArgument
from shoal.store.disk import DiskTier
from shoal.testing.store_conformance import blob, fkey, put_file
t = DiskTier(TierSpec("ssd", sys.argv[1], 64 << 20))
for i in range(100):
    put_file(t, fkey(f"f{i}"), blob(i, 1000))
    if i == 49:
        t.flush()
os._exit(0)  # no close: the tail of the write-behind batch is lost
"""


def test_crash_loses_only_the_uncommitted_tail(tier_dir: str, opened: list[DiskTier]) -> None:
    subprocess.run([sys.executable, "-c", textwrap.dedent(CRASH), tier_dir], check=True)
    t = open_tier(opened, tier_dir)
    for i in range(100):
        got = t.get(fkey(f"f{i}").page(0))
        assert got == blob(i, 1000) if i < 50 else got in (None, blob(i, 1000))
    # new data never overwrites the leaked tail: it goes to a new segment
    assert put_file(t, fkey("new"), blob(7, 1000))
    loc = t.locate(fkey("new").page(0))
    old = t.locate(fkey("f0").page(0))
    assert loc is not None and old is not None and loc.path != old.path
    assert t.get(fkey("new").page(0)) == blob(7, 1000)


def test_index_pointing_at_lost_bytes_is_a_counted_miss(
    tier_dir: str, opened: list[DiskTier]
) -> None:
    t = open_tier(opened, tier_dir)
    put_file(t, fkey("a"), blob(1, 1000))
    loc = t.locate(fkey("a").page(0))
    assert loc is not None
    t.close()
    os.truncate(loc.path, 0)  # as if the bytes never reached the disk
    t = open_tier(opened, tier_dir)
    assert t.get(fkey("a").page(0)) is None
    assert t.usage().corrupt_pages == 1


def test_disk_errors_are_misses_not_exceptions(
    tier_dir: str, opened: list[DiskTier], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = open_tier(opened, tier_dir)
    put_file(t, fkey("a"), blob(1, 1000))
    put_file(t, fkey("big"), blob(2, 2 * PAGE))

    def enospc(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", enospc)
    assert not put_file(t, fkey("b"), blob(3, 1000))
    assert not put_file(t, fkey("big2"), blob(4, 2 * PAGE))
    assert t.get(fkey("a").page(0)) == blob(1, 1000)
    monkeypatch.setattr(os, "pread", lambda *a: enospc())
    assert t.get(fkey("a").page(0)) is None
    assert t.get(fkey("big").page(0)) is None
    monkeypatch.undo()
    assert put_file(t, fkey("b"), blob(3, 1000)) and t.get(fkey("b").page(0)) == blob(3, 1000)


def test_read_path_opens_nothing_and_skips_sqlite(
    tier_dir: str, opened: list[DiskTier], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = open_tier(opened, tier_dir)
    for i in range(20):
        put_file(t, fkey(f"f{i}"), blob(i, 3000))
    put_file(t, fkey("big"), blob(99, 3 * PAGE))
    t.get(fkey("big").page(0))  # opens the data file once

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("no open / SQLite on the read path")

    monkeypatch.setattr(os, "open", forbidden)
    monkeypatch.setattr(t._index, "_db", None)
    for i in range(20):
        assert t.get(fkey(f"f{i}").page(0)) == blob(i, 3000)
        assert t.locate(fkey(f"f{i}").page(0)) is not None
    assert t.get(fkey("big").page(2)) == blob(99, 3 * PAGE)[2 * PAGE :]
    monkeypatch.undo()


def test_index_commits_in_batches(
    tier_dir: str, opened: list[DiskTier], monkeypatch: pytest.MonkeyPatch
) -> None:
    commits = []
    real = TierIndex.flush

    def counting(self: TierIndex, *, touches: bool = True, touch_rows: int | None = None) -> bool:
        commits.append(self.pending)
        return real(self, touches=touches, touch_rows=touch_rows)

    monkeypatch.setattr(TierIndex, "flush", counting)
    t = open_tier(opened, tier_dir)
    t._index.flush_interval = 3600  # only the batch size triggers a commit
    for i in range(3000):
        put_file(t, fkey(f"f{i}"), b"x" * 100)
    assert len(commits) <= 5, commits
    t.close()
    t = open_tier(opened, tier_dir)
    assert t.usage().files == 3000


def test_ttl_is_honoured_on_read(tier_dir: str, opened: list[DiskTier]) -> None:
    clock = Clock(1000.0)
    t = open_tier(opened, tier_dir, clock=clock)
    put_file(t, fkey("a"), b"abc", expires_at=1010.0)
    assert t.get(fkey("a").page(0)) == b"abc"
    clock.now = 1010.0
    assert t.get(fkey("a").page(0)) is None and not t.contains(fkey("a").page(0))


def test_lru_order_survives_restart(tier_dir: str, opened: list[DiskTier]) -> None:
    clock = Clock(1000.0)
    t = open_tier(opened, tier_dir, capacity=256 * 1024, clock=clock)
    for i in range(30):
        clock.now += 1
        put_file(t, fkey(f"f{i}"), blob(i, 4000))
    clock.now += 1
    t.get(fkey("f0").page(0))
    t.close()
    t = open_tier(opened, tier_dir, capacity=256 * 1024, clock=clock)
    for j in range(30, 200):
        put_file(t, fkey(f"f{j}"), blob(j, 4000))
        if not t.contains(fkey("f1").page(0)):
            break
    assert t.contains(fkey("f0").page(0))


def test_changed_geometry_replaces_the_version(tier_dir: str, opened: list[DiskTier]) -> None:
    t = open_tier(opened, tier_dir)
    fk, data = fkey("big"), blob(1, 4 * PAGE)
    assert t.put(fk.page(0), data[:PAGE], PutMeta(len(data), PAGE))
    assert t.put(fk.page(0), data[: 2 * PAGE], PutMeta(len(data), 2 * PAGE))
    assert t.get(fk.page(0)) == data[: 2 * PAGE]
    assert t.usage().used == 2 * PAGE


def test_put_of_stored_page_can_pin_it(tier_dir: str, opened: list[DiskTier]) -> None:
    t = open_tier(opened, tier_dir, capacity=256 * 1024)
    put_file(t, fkey("a"), blob(0, 3000))
    assert put_file(t, fkey("a"), blob(0, 3000), pin=True)
    for i in range(200):
        put_file(t, fkey(f"f{i}"), blob(i, 3000))
    assert t.get(fkey("a").page(0)) == blob(0, 3000)


def test_a_page_larger_than_the_tier_is_refused(tier_dir: str, opened: list[DiskTier]) -> None:
    t = open_tier(opened, tier_dir, capacity=64 * 1024)
    assert not t.put(fkey("a").page(0), b"x" * 70_000, PutMeta(70_000, MiB))
    assert t.usage().used == 0


def test_delete_needs_a_target(tier_dir: str, opened: list[DiskTier]) -> None:
    t = open_tier(opened, tier_dir)
    with pytest.raises(InvalidArgument):
        t.delete()


def test_eviction_demotes_to_the_next_tier(tmp_path: Path, opened: list[DiskTier]) -> None:
    ssd = open_tier(opened, str(tmp_path / "ssd"))
    mem = DiskTier(TierSpec("mem", str(tmp_path / "mem"), 128 * 1024), demote_to=ssd)
    opened.append(mem)
    for i in range(100):
        assert put_file(mem, fkey(f"f{i}"), blob(i, 3000))
    put_file(mem, fkey("big"), blob(7, 3 * PAGE))
    for i in range(100):
        put_file(mem, fkey(f"g{i}"), blob(i, 3000))
    assert mem.usage().evicted_bytes > 0
    assert ssd.get(fkey("f0").page(0)) == blob(0, 3000)
    loc = ssd.locate_file(fkey("big"))
    assert loc is not None and loc.tier == "ssd"
    assert mem.usage().files + ssd.usage().files == 201


def test_unreadable_index_starts_empty(tier_dir: str, opened: list[DiskTier]) -> None:
    t = open_tier(opened, tier_dir)
    put_file(t, fkey("a"), blob(1, 1000))
    t.close()
    for suffix in ("-wal", "-shm"):
        Path(tier_dir, "index.sqlite" + suffix).unlink(missing_ok=True)
    Path(tier_dir, "index.sqlite").write_bytes(b"not a database" * 100)
    t = open_tier(opened, tier_dir)
    assert t.usage().files == 0 and t.get(fkey("a").page(0)) is None
    assert put_file(t, fkey("b"), b"b") and t.get(fkey("b").page(0)) == b"b"


def test_changes_move_with_locations_and_not_with_reads(
    tier_dir: str, opened: list[DiskTier]
) -> None:
    t = open_tier(opened, tier_dir, capacity=64 * PAGE)  # lru
    a, b = fkey("a"), fkey("b")
    c0 = t.changes()
    assert c0 is not None
    put_file(t, a, blob(1, 100))
    put_file(t, b, blob(2, 100))
    c1 = t.changes()
    assert c1 is not None and c1 > c0
    for _ in range(3):  # reads, locates, peeks and touches move nothing
        t.get(a.page(0))
        t.locate(a.page(0))
        t.peek(b.page(0))
        assert t.touch(b.page(0))
    assert t.changes() == c1
    # peek does not count an access, touch does: "b" is evicted while "a" stays
    i = 0
    while t.contains(b.page(0)):
        put_file(t, fkey(f"x{i}"), blob(10 + i, PAGE))
        t.touch(a.page(0))
        t.peek(b.page(0))
        i += 1
        assert i < 100
    assert t.contains(a.page(0))
    assert t.changes() != c1
    assert not t.touch(b.page(0))
    c2 = t.changes()
    t.delete(a)
    assert t.changes() != c2


def test_access_statistics_are_written_a_slice_per_commit_and_all_on_close(
    tmp_path: Path,
) -> None:
    """A warm epoch's touches go out ``touch_rows`` per periodic commit (each commit
    holds the worker's loop), stay due until all are written, and close writes the rest."""
    import sqlite3

    from shoal.store.index import PageEntry

    clock = Clock(1000.0)
    path = str(tmp_path / "index.db")
    idx = TierIndex(path, touch_interval=5.0, touch_rows=100, clock=clock)
    keys = [fkey(f"f{i}").page(0) for i in range(250)]
    entries = [PageEntry(0, i * 10, 10, i, last_access=1.0) for i in range(250)]
    for k, e in zip(keys, entries, strict=True):
        idx.put_page(k, e)
    assert idx.flush_due()

    def fresh() -> int:
        with sqlite3.connect(path) as db:
            return int(db.execute("SELECT count(*) FROM pages WHERE last_access=2.0").fetchone()[0])

    for k, e in zip(keys, entries, strict=True):
        e.last_access = 2.0
        idx.touch(k, e)
    idx.flush_due()
    assert fresh() == 0  # not due yet
    clock.now += 5
    written = []
    while idx.touches_due() and len(written) < 10:
        idx.flush_due()
        written.append(fresh())
    assert written == [100, 200, 250]
    for k, e in zip(keys[:30], entries[:30], strict=True):  # touched again, not due
        e.last_access = 3.0
        idx.touch(k, e)
    idx.flush_due()
    idx.close()  # writes every access statistic left
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM pages WHERE last_access=3.0").fetchone()[0] == 30

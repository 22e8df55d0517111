"""A tier's real free space as a quota: statvfs checks, eviction on a full filesystem,
refused puts counted with a reason, and warnings aggregated instead of one per put."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shoal.config import TierSpec
from shoal.store.base import PageStore, PutMeta
from shoal.store.disk import DiskTier
from shoal.store.space import RESERVE_MIN, Aggregated, FsSpace
from shoal.store.tiered import TieredStore
from shoal.testing.store_conformance import blob, fkey
from shoal.testing.store_disk import data_bytes, small_tmpfs

MiB = 1 << 20
GiB = 1 << 30


class FakeFs:
    """statvfs of a filesystem whose free space the test sets (bytes, or a function
    giving them); counts the calls."""

    def __init__(self, size: int, free: int | Callable[[], int]) -> None:
        self.size, self.free, self.calls = size, free, 0

    def __call__(self, path: str) -> os.statvfs_result:
        self.calls += 1
        bs = 4096
        free = self.free() if callable(self.free) else self.free
        return os.statvfs_result((bs, bs, self.size // bs, free // bs, free // bs, 0, 0, 0, 0, 255))


def test_ceiling_is_used_plus_free_less_a_reserve_and_checked_only_now_and_then() -> None:
    fs = FakeFs(16 * MiB, 10 * MiB)
    sp = FsSpace("/x", check_puts=8, check_bytes=1 * MiB, statvfs=fs)
    assert sp.ceiling(used=2 * MiB) == 12 * MiB - RESERVE_MIN
    assert fs.calls == 1
    for _ in range(6):  # the tier's own writes move used and free together
        assert sp.ceiling(used=2 * MiB + 1000) == 12 * MiB - RESERVE_MIN
    assert fs.calls == 1
    fs.free = 1 * MiB  # someone else filled the filesystem: seen at the next check
    sp.ceiling(used=2 * MiB)
    sp.ceiling(used=2 * MiB)
    assert fs.calls == 2 and sp.last() == 3 * MiB - RESERVE_MIN
    sp.ceiling(used=2 * MiB + 2 * MiB)  # more than check_bytes of change: checked at once
    assert fs.calls == 3


def test_aggregated_logs_one_line_per_interval_with_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    agg = Aggregated(logging.getLogger("shoal.test.agg"), interval=10.0, clock=lambda: now[0])
    what = "%d refused in %.0fs (%s)"
    with caplog.at_level(logging.WARNING, logger="shoal.test.agg"):
        for i in range(1100):  # 11 s of events
            now[0] += 0.01
            agg.note("full", what, f"put {i}")
        for _ in range(1000):
            agg.note("io", what, "bad sector")
    lines = [r.getMessage() for r in caplog.records]
    # the first of each kind at once, then one line per 10 s of events
    assert len(lines) == 2 + 1, lines
    assert lines[0] == "1 refused in 10s (put 0)"
    assert lines[1].split()[0] in ("1000", "1001") and "in 10s (put 10" in lines[1]
    assert lines[2] == "1 refused in 10s (bad sector)"
    assert agg.counts == {"full": 1100, "io": 1000}


LARGE = 600_000  # three pages of 256 KiB
LPAGE = 256 * 1024


def put(store: PageStore, name: str, data: bytes) -> bool:
    """A small file (one page of a 1 MiB page size) or a large one (256 KiB pages)."""
    fk = fkey(name)
    if len(data) < LARGE:
        return store.put(fk.page(0), data, PutMeta(len(data), MiB))
    meta = PutMeta(len(data), LPAGE)
    return all(
        store.put(fk.page(i // LPAGE), data[i : i + LPAGE], meta)
        for i in range(0, len(data), LPAGE)
    )


def read(store: PageStore, name: str) -> bytes | None:
    fk = fkey(name)
    out = b""
    for i in range(3):
        got = store.get(fk.page(i))
        if got is None:
            return None if i == 0 else out
        out += got
        if len(got) < LPAGE:
            break
    return out


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "tmpfs", "8m") as p:
        yield p


def test_tier_declared_larger_than_its_disk_evicts_by_the_real_free_space(
    tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = DiskTier(TierSpec("ssd", str(tmpfs / "ssd"), 1 * GiB))
    try:
        with caplog.at_level(logging.WARNING, logger="shoal.store"):
            for i in range(200):  # ~30 MB into 8 MiB: small files and large ones
                assert put(t, f"f{i}", blob(i, LARGE if i % 5 == 0 else 100_000)), i
                t.flush()
        u = t.usage()
        assert u.evicted_bytes > 0 and u.capacity < 8 * MiB
        assert u.used <= u.capacity
        st = os.statvfs(tmpfs)
        assert st.f_bavail * st.f_frsize > 0
        for i in range(190, 200):  # the newest are there and intact
            assert read(t, f"f{i}") == blob(i, LARGE if i % 5 == 0 else 100_000)
        assert data_bytes(tmpfs / "ssd") <= u.used + 64 * 1024
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        t.close()


def test_pinned_data_that_does_not_fit_is_refused_with_a_reason_and_one_log_line(
    tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = TieredStore.from_specs([TierSpec("ssd", str(tmpfs / "ssd"), 1 * GiB)])
    stored: list[int] = []
    try:
        with caplog.at_level(logging.WARNING, logger="shoal.store"):
            for i in range(150):
                key = fkey(f"p{i}").page(0)
                if store.put(key, blob(i, 100_000), PutMeta(100_000, MiB, pin=True)):
                    stored.append(i)
                else:
                    assert "cache full" in store.refusal(), store.refusal()
        assert 30 < len(stored) < 80
        for i in stored:  # every put that said yes is readable
            assert store.get(fkey(f"p{i}").page(0)) == blob(i, 100_000)
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert 1 <= len(warnings) <= 2, [r.getMessage() for r in warnings]
    finally:
        store.close()


def test_enospc_on_write_makes_room_and_retries_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem that filled behind the tier's back (its statvfs was not due yet)."""
    t = DiskTier(TierSpec("ssd", str(tmp_path / "ssd"), 1 * GiB))
    try:
        for i in range(20):
            assert put(t, f"f{i}", blob(i, 50_000))
        # the disk now has room for 1.1 MB of this tier: a little more than it holds
        fs = FakeFs(16 * MiB, lambda: max(0, 1_100_000 - t.usage().used))
        t._space._statvfs = fs
        real = os.pwrite
        calls = [0]

        def pwrite(fd: int, data: bytes, off: int) -> int:
            calls[0] += 1
            if calls[0] == 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data, off)

        monkeypatch.setattr(os, "pwrite", pwrite)
        assert put(t, "new", blob(99, 50_000))
        monkeypatch.undo()
        assert calls[0] >= 2 and fs.calls >= 1 and t.usage().evicted_bytes > 0
        assert read(t, "new") == blob(99, 50_000)
    finally:
        t.close()

"""put_many: a run of small files written at once stores exactly what puts one by one
would (same bytes, same answers, the index a restart reads), and whatever cannot go
in the run -- a page already there, a large file's page, a refused or failed write --
gets what a single put gives it."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from shoal.config import TierSpec
from shoal.core.types import PageKey
from shoal.errors import InvalidArgument
from shoal.store import segments
from shoal.store.base import PutMeta
from shoal.store.disk import DiskTier
from shoal.store.tiered import TieredStore
from shoal.testing.store_conformance import PAGE, blob, fkey, put_file

KiB = 1 << 10
Page = tuple[PageKey, bytes, PutMeta]


def small(n: int, size: Callable[[int], int] = lambda i: 100 + 37 * i % 3000) -> list[Page]:
    out = []
    for i in range(n):
        data = blob(i, size(i) % (PAGE + 1))
        out.append((fkey(f"f{i:04d}").page(0), data, PutMeta(len(data), PAGE)))
    return out


def tier(root: Path, capacity: int = 64 << 20, **kw: object) -> DiskTier:
    return DiskTier(TierSpec("ssd", str(root), capacity), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("segment_size", [None, 4 * KiB])
def test_a_run_is_stored_readable_and_survives_a_restart(
    tmp_path: Path, segment_size: int | None
) -> None:
    pages = small(300)
    t = tier(tmp_path / "t", segment_size=segment_size)
    assert t.put_many(pages) == [True] * len(pages)
    for key, data, _ in pages:
        assert t.get(key) == data
    t.close()
    t = tier(tmp_path / "t", segment_size=segment_size)
    try:
        assert t.usage().files == len(pages)
        for key, data, _ in pages:
            assert t.get(key) == data
    finally:
        t.close()


def test_the_same_store_as_puts_one_by_one(tmp_path: Path) -> None:
    pages = small(200)
    a, b = tier(tmp_path / "a"), tier(tmp_path / "b")
    try:
        assert a.put_many(pages) == [b.put(*p) for p in pages]
        for key, data, _ in pages:
            la, lb = a.locate(key), b.locate(key)
            assert la is not None and lb is not None
            assert (la.length, la.checksum) == (lb.length, lb.checksum) == (la.length, lb.checksum)
            assert a.get(key) == b.get(key) == data
        ua, ub = a.usage(), b.usage()
        assert (ua.files, ua.pages, ua.used) == (ub.files, ub.pages, ub.used)
        assert a.files("ds") == b.files("ds")
        assert a.versions("ds", "m/f0007") == b.versions("ds", "m/f0007")
    finally:
        a.close()
        b.close()


def test_pages_outside_the_run_get_what_put_gives_them(tmp_path: Path) -> None:
    t = tier(tmp_path / "t")
    try:
        there = small(1)[0]
        assert t.put(*there)
        big = blob(99, 3 * PAGE)
        large = (fkey("big").page(1), big[PAGE : 2 * PAGE], PutMeta(len(big), PAGE))
        pages = [there, *small(5)[1:], large, small(3)[2]]  # f0002 twice
        assert t.put_many(pages) == [True] * len(pages)
        assert t.get(large[0]) == big[PAGE : 2 * PAGE]
        assert t.usage().files == 6
        bad = (fkey("bad").page(0), b"short", PutMeta(10, PAGE))
        with pytest.raises(InvalidArgument):
            t.put_many([bad])
    finally:
        t.close()


def test_a_full_tier_evicts_or_refuses_as_put_does(tmp_path: Path) -> None:
    pages = small(400, lambda i: 1000)
    a, b = tier(tmp_path / "a", 64 * KiB), tier(tmp_path / "b", 64 * KiB)
    try:
        got = a.put_many(pages)
        assert got == [b.put(*p) for p in pages] == [True] * len(pages)
        assert a.usage().used <= 64 * KiB and a.usage().evicted_bytes > 0
        assert a.get(pages[-1][0]) == pages[-1][1]
        # pinned files that fill the tier leave no room: refused, and the reason kept
        c, d = tier(tmp_path / "c", 16 * KiB), tier(tmp_path / "d", 16 * KiB)
        try:
            for t in (c, d):
                for i in range(15):
                    assert put_file(t, fkey(f"pin{i}"), blob(i, 1000), pin=True)
            more = small(5, lambda i: 1000)
            assert c.put_many(more) == [d.put(*p) for p in more] == [False] * 5
            assert "cache full" in c.refusal()
            assert c.usage().files == 15
        finally:
            c.close()
            d.close()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC])
def test_a_failed_run_write_falls_back_to_single_puts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    calls = []

    def failing(fd: int, buffers: list[bytes], offset: int) -> int:
        calls.append(len(buffers))
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(segments.os, "pwritev", failing)
    t = tier(tmp_path / "t")
    try:
        pages = small(50)
        assert t.put_many(pages) == [True] * 50  # each on its own, with pwrite
        assert calls
        for key, data, _ in pages:
            assert t.get(key) == data
    finally:
        t.close()
    t = tier(tmp_path / "t")
    try:
        assert all(t.get(key) == data for key, data, _ in pages)
    finally:
        t.close()


def test_tiered_runs_go_to_the_allowed_tier_and_fall_through(tmp_path: Path) -> None:
    store = TieredStore.from_specs(
        [
            TierSpec("ssd", str(tmp_path / "ssd"), 4 << 20),
            TierSpec("mem", str(tmp_path / "mem"), 16 * KiB),
        ]
    )
    try:
        mem, ssd = store.tiers
        only_ssd = [
            (k, d, PutMeta(m.file_size, m.page_size, tiers=("ssd",))) for k, d, m in small(20)
        ]
        assert store.put_many(only_ssd) == [True] * 20
        assert mem.usage().files == 0 and ssd.usage().files == 20
        # mem full of pinned files: the run goes on to ssd
        for i in range(15):
            assert put_file(mem, fkey(f"pin{i}"), blob(i, 1000), pin=True)
        rest = small(40)[20:]
        assert store.put_many(rest) == [True] * 20
        for key, data, _ in rest:
            loc = store.locate(key)
            assert loc is not None and loc.tier == "ssd" and store.get(key) == data
        assert store.put_many(rest) == [True] * 20  # already there
        assert ssd.usage().files == 40
    finally:
        store.close()

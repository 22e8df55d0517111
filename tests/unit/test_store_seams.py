"""The store's seams: the tiered composite owns demotion (a tier only reports what it
evicts), and a tier whose disk fails is skipped by the composite: its puts go to the
next tier, its reads are misses (never errors), one log line per transition."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.config import TierSpec
from shoal.core.types import FileKey, PageKey
from shoal.store.base import EvictedPages, PutMeta
from shoal.store.demotion import Demotion
from shoal.store.disk import DiskTier
from shoal.store.health import DOWN, NORMAL, TierHealth
from shoal.store.tiered import TieredStore
from shoal.testing.store_conformance import PAGE, blob, fkey, put_file

KiB = 1 << 10


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def tiered(tmp_path: Path) -> Iterator[TieredStore]:
    store = TieredStore.from_specs(
        [
            TierSpec("mem", str(tmp_path / "mem"), 128 * KiB),
            TierSpec("ssd", str(tmp_path / "ssd"), 4096 * KiB),
        ]
    )
    yield store
    store.close()


def test_the_composite_wires_a_demotion_into_every_tier_but_the_last(
    tiered: TieredStore,
) -> None:
    mem, ssd = tiered.tiers
    assert isinstance(mem.on_evict, Demotion) and mem.on_evict.below == (ssd,)
    assert ssd.on_evict is None
    assert TieredStore(list(tiered.tiers), demote=True).tiers[0].on_evict is mem.on_evict


def test_a_tier_reports_each_evicted_file_with_its_pages(tmp_path: Path) -> None:
    seen: dict[FileKey, list[tuple[PageKey, bytes, PutMeta]]] = {}

    def sink(file: FileKey, pages: EvictedPages) -> None:
        seen[file] = list(pages)

    tier = DiskTier(TierSpec("mem", str(tmp_path / "mem"), 128 * KiB), on_evict=sink)
    try:
        big = blob(7, 3 * PAGE)
        assert put_file(tier, fkey("big"), big)
        for i in range(100):
            put_file(tier, fkey(f"f{i}"), blob(i, 3000))
        assert tier.usage().evicted_bytes > 0
        pages = seen[fkey("big")]
        assert [k.index for k, _, _ in pages] == [0, 1, 2]
        assert b"".join(d for _, d, _ in pages) == big
        assert all(m.file_size == len(big) and m.page_size == PAGE for _, _, m in pages)
        assert seen[fkey("f0")][0][1] == blob(0, 3000)
        assert not tier.contains(fkey("f0").page(0))  # reported, then dropped
    finally:
        tier.close()


def test_demotion_honours_the_tiers_a_dataset_allows(tiered: TieredStore) -> None:
    mem, ssd = tiered.tiers
    mem_only = PutMeta(3000, PAGE, tiers=("mem",))
    for i in range(100):
        assert tiered.put(FileKey("m", f"a/{i}", "v1").page(0), blob(i, 3000), mem_only)
    assert mem.usage().evicted_bytes > 0
    assert "m" not in ssd.usage().by_dataset  # the dataset allows mem only: dropped
    for i in range(100):
        assert put_file(tiered, fkey(f"f{i}"), blob(i, 3000))
    assert ssd.usage().by_dataset["ds"].files > 0  # any tier allowed: demoted
    assert all(tiered.get(fkey(f"f{i}").page(0)) == blob(i, 3000) for i in range(100))


def test_a_failing_tier_is_skipped_by_the_composite(
    tiered: TieredStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    mem, ssd = tiered.tiers
    assert isinstance(mem, DiskTier)
    clock = Clock()
    mem._health = TierHealth(clock=clock)
    for i in range(10):
        assert put_file(tiered, fkey(f"old{i}"), blob(i, 1000))
    assert all(mem.contains(fkey(f"old{i}").page(0)) for i in range(10))
    calls = {"io": 0}

    def eio(*args: object) -> object:
        calls["io"] += 1
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(mem._segments, "read", eio)
    monkeypatch.setattr(mem._segments, "append", eio)
    with caplog.at_level(logging.INFO, logger="shoal.store"):
        for i in range(10):  # reads of the failing tier: misses, never an exception
            assert tiered.get(fkey(f"old{i}").page(0)) is None
        for i in range(40):  # puts go to the next tier
            assert put_file(tiered, fkey(f"new{i}"), blob(i, 1000))
        assert mem.health == DOWN
        io_when_down = calls["io"]
        for i in range(40, 80):
            assert put_file(tiered, fkey(f"new{i}"), blob(i, 1000))
            assert tiered.get(fkey(f"new{i}").page(0)) == blob(i, 1000)
        assert calls["io"] == io_when_down  # skipped: its disk is not touched
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("shoal.store")]
    assert len(lines) <= 5, lines  # per transition (and aggregated), never per operation
    assert sum("skipped (reads miss" in m for m in lines) == 1  # one line going down
    assert ssd.usage().files == 80 and mem.usage().files == 0
    monkeypatch.undo()
    clock.now += 30  # the backoff passed: the next put probes the disk, and it works
    assert put_file(tiered, fkey("later"), blob(1, 1000))
    loc = tiered.locate(fkey("later").page(0))
    assert loc is not None and loc.tier == "mem" and mem.health == NORMAL

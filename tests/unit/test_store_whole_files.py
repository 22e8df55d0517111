"""A large file version lives whole in one tier of a TieredStore: placed by its share of
each tier's room, moved whole when its tier refuses a page of it, demoted whole."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.config import TierSpec
from shoal.core.types import FileKey
from shoal.store.base import CacheStore, PutMeta
from shoal.store.demotion import FITS, TOO_LARGE, WITHIN_SHARE, fit
from shoal.store.tiered import TieredStore
from shoal.testing.store_conformance import PAGE, blob, fkey, put_file, read_location

KiB = 1 << 10
#: mem's room is its high watermark (0.95) of 128 KiB: 121.6 KiB, its share half that
MEM, SSD = 128 * KiB, 1024 * KiB


def make(tmp_path: Path, *specs: tuple[str, int]) -> TieredStore:
    return TieredStore.from_specs([TierSpec(n, str(tmp_path / n), cap) for n, cap in specs])


@pytest.fixture
def tiered(tmp_path: Path) -> Iterator[TieredStore]:
    store = make(tmp_path, ("mem", MEM), ("ssd", SSD))
    yield store
    store.close()


def where(store: TieredStore, fk: FileKey) -> list[str]:
    """The tiers holding any page of ``fk``."""
    return [t.name for t in store.tiers if t.has_file(fk)]


def assert_whole_in(store: TieredStore, fk: FileKey, data: bytes, tier: str) -> None:
    assert where(store, fk) == [tier]
    loc = store.locate_file(fk)
    assert loc is not None and (loc.tier, loc.offset, loc.length) == (tier, 0, len(data))
    assert read_location(loc) == data
    for i in range(0, len(data), PAGE):
        assert store.get(fk.page(i // PAGE)) == data[i : i + PAGE]


def test_fit_ranks_by_the_share_of_the_room(tiered: TieredStore) -> None:
    mem = tiered.tiers[0]
    assert mem.file_room() == int(MEM * 0.95)
    assert fit(mem, 60 * KiB) == WITHIN_SHARE
    assert fit(mem, 61 * KiB) == FITS
    assert fit(mem, 122 * KiB) == TOO_LARGE


@pytest.mark.parametrize("size", [80 * KiB, 200 * KiB + 123])
def test_a_file_beyond_the_mem_share_goes_whole_to_the_disk_tier(
    tiered: TieredStore, size: int
) -> None:
    # 200 KiB is more than mem holds at all: its pages used to fill mem and spill the
    # rest to ssd, so that no tier could hand it over whole
    fk, data = fkey("big"), blob(1, size)
    assert put_file(tiered, fk, data)
    assert_whole_in(tiered, fk, data, "ssd")
    assert tiered.tier_usage()[0][1].used == 0


def test_a_file_within_the_mem_share_goes_whole_to_mem(tiered: TieredStore) -> None:
    fk, data = fkey("mid"), blob(2, 40 * KiB + 7)
    assert put_file(tiered, fk, data)
    assert_whole_in(tiered, fk, data, "mem")


def test_pages_put_out_of_order_follow_the_first(tiered: TieredStore) -> None:
    fk, data = fkey("big"), blob(3, 200 * KiB)
    meta = PutMeta(len(data), PAGE)
    order = list(range(len(data) // PAGE))[::-1]
    for i in order:
        assert tiered.put(fk.page(i), data[i * PAGE : (i + 1) * PAGE], meta)
    assert_whole_in(tiered, fk, data, "ssd")


def test_mem_eviction_demotes_a_large_file_whole(tiered: TieredStore) -> None:
    fk, data = fkey("mid"), blob(4, 40 * KiB + 7)
    assert put_file(tiered, fk, data)
    assert where(tiered, fk) == ["mem"]
    for i in range(60):  # small files fill mem: the large file is its oldest unit
        assert put_file(tiered, fkey(f"s{i}"), blob(100 + i, 3000))
    assert_whole_in(tiered, fk, data, "ssd")
    for i in range(60):
        assert tiered.get(fkey(f"s{i}").page(0)) == blob(100 + i, 3000)


def test_a_partly_cached_file_demoted_keeps_its_pages_and_completes_below(
    tiered: TieredStore,
) -> None:
    fk, data = fkey("mid"), blob(5, 40 * KiB)
    meta = PutMeta(len(data), PAGE)
    for i in range(4):
        assert tiered.put(fk.page(i), data[i * PAGE : (i + 1) * PAGE], meta)
    for i in range(60):
        put_file(tiered, fkey(f"s{i}"), blob(i, 3000))
    assert where(tiered, fk) == ["ssd"] and tiered.locate_file(fk) is None
    for i in range(4, len(data) // PAGE):  # the rest follows it to ssd
        assert tiered.put(fk.page(i), data[i * PAGE : (i + 1) * PAGE], meta)
    assert_whole_in(tiered, fk, data, "ssd")


def test_demotion_skips_a_lower_tier_the_file_would_crowd(tmp_path: Path) -> None:
    # within mem's share; beyond ssd's (but it fits there); within hdd's
    store = make(tmp_path, ("mem", 256 * KiB), ("ssd", 128 * KiB), ("hdd", 4096 * KiB))
    try:
        fk, data = fkey("mid"), blob(6, 100 * KiB)
        assert put_file(store, fk, data)
        assert where(store, fk) == ["mem"]
        mem = store.tiers[0]
        i = 0
        while mem.has_file(fk):  # small files fill mem until it evicts the large one
            assert put_file(store, fkey(f"s{i}"), blob(i, 3000))
            i += 1
        assert_whole_in(store, fk, data, "hdd")
    finally:
        store.close()


def test_a_holder_that_refuses_a_page_moves_the_file_whole(tiered: TieredStore) -> None:
    """mem holds part of a pinned file and pinned small files fill the rest: it can
    evict nothing for the next page, so the file moves to ssd with all its pages."""
    fk, data = fkey("pinned"), blob(7, 48 * KiB)
    meta = PutMeta(len(data), PAGE, pin=True)
    for i in range(6):
        assert tiered.put(fk.page(i), data[i * PAGE : (i + 1) * PAGE], meta)
    mem = tiered.tiers[0]
    n = 0
    while mem.put(fkey(f"p{n}").page(0), blob(n, 3000), PutMeta(3000, PAGE, pin=True)):
        n += 1
    assert n > 0 and where(tiered, fk) == ["mem"]
    for i in range(6, len(data) // PAGE):
        assert tiered.put(fk.page(i), data[i * PAGE : (i + 1) * PAGE], meta)
    assert_whole_in(tiered, fk, data, "ssd")
    # pinned in its new tier too
    ssd = tiered.tiers[1]
    for i in range(300):
        put_file(ssd, fkey(f"f{i}"), blob(i, 3000))
    assert_whole_in(tiered, fk, data, "ssd")


def test_a_file_no_tier_holds_whole_is_still_cached_and_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = make(tmp_path, ("mem", 128 * KiB), ("ssd", 256 * KiB))
    try:
        fk, data = fkey("huge"), blob(8, 300 * KiB)
        with caplog.at_level(logging.WARNING, "shoal.store.tiered"):
            put_file(store, fk, data)
        stored = 0
        for i in range(0, len(data), PAGE):
            got = store.get(fk.page(i // PAGE))
            assert got is None or got == data[i : i + PAGE]
            stored += got is not None
        assert stored > len(data) // PAGE // 2
        assert "stored in another tier than the rest of their file" in caplog.text
    finally:
        store.close()


def test_small_files_keep_going_to_mem_first_and_are_demoted(tiered: TieredStore) -> None:
    store: CacheStore = tiered
    for i in range(100):
        assert put_file(store, fkey(f"f{i}"), blob(i, 3000))
    loc = tiered.locate(fkey("f99").page(0))
    assert loc is not None and loc.tier == "mem"
    loc = tiered.locate(fkey("f0").page(0))
    assert loc is not None and loc.tier == "ssd"
    for i in range(100):
        assert tiered.get(fkey(f"f{i}").page(0)) == blob(i, 3000)


def test_a_dataset_limited_to_mem_still_caches_a_large_file_there(tiered: TieredStore) -> None:
    fk, data = fkey("big"), blob(9, 80 * KiB)
    meta = PutMeta(len(data), PAGE, tiers=("mem",))
    for i in range(0, len(data), PAGE):
        assert tiered.put(fk.page(i // PAGE), data[i : i + PAGE], meta)
    assert_whole_in(tiered, fk, data, "mem")

"""Counting a client's reads of a file in one call (TOUCH items): ``touch_pages`` of a
tier and of a tiered store, against the page-by-page ``touch`` it stands for."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.config import TierSpec
from shoal.core.types import FileKey
from shoal.store.base import Handover, PutMeta
from shoal.store.disk import DiskTier
from shoal.store.eviction import PerDataset
from shoal.store.tiered import TieredStore
from shoal.testing.store_conformance import PAGE, blob, fkey, put_file

PAGES = 6
SIZE = PAGES * PAGE - 100  # the last page short


def _put_pages(tier: DiskTier | TieredStore, fk: FileKey, pages: list[int], **kw: float) -> None:
    data = blob(7, SIZE)
    for i in pages:
        meta = PutMeta(SIZE, PAGE, expires_at=kw.get("expires_at", 0.0))
        assert tier.put(fk.page(i), data[i * PAGE : (i + 1) * PAGE], meta)


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[DiskTier]:
    t = DiskTier(TierSpec("ssd", str(tmp_path / "ssd"), 64 * PAGE))  # lru
    yield t
    t.close()


def test_counts_up_to_the_first_missing_page(tier: DiskTier) -> None:
    fk = fkey("big")
    _put_pages(tier, fk, [0, 1, 2, 4, 5])
    assert tier.touch_pages(fk, 0, PAGES) == 3
    assert tier.touch_pages(fk, 4, PAGES) == 2
    assert tier.touch_pages(fk, 3, PAGES) == 0
    assert tier.touch_pages(fk, 2, 2) == 0
    assert tier.touch_pages(fkey("absent"), 0, 1) == 0


def test_agrees_with_touching_page_by_page(tmp_path: Path) -> None:
    """The tier's own loop and the protocol's default (``touch`` per page) count the
    same pages for any pattern of held pages and any range."""
    rng = random.Random(11)
    t = DiskTier(TierSpec("ssd", str(tmp_path / "ssd"), 4096 * PAGE))
    try:
        for n in range(40):
            fk = fkey(f"f{n}")
            held = sorted(rng.sample(range(PAGES), rng.randrange(1, PAGES + 1)))
            _put_pages(t, fk, held)
            start = rng.randrange(PAGES)
            stop = rng.randrange(start, PAGES + 2)
            assert t.touch_pages(fk, start, stop) == Handover.touch_pages(t, fk, start, stop)
    finally:
        t.close()


def test_a_touched_file_outlives_an_untouched_one(tier: DiskTier) -> None:
    """The count is an access: under LRU the touched file stays while puts evict."""
    a, b = fkey("a"), fkey("b")
    _put_pages(tier, a, list(range(PAGES)))
    _put_pages(tier, b, list(range(PAGES)))
    i = 0
    while tier.contains(b.page(0)):
        assert tier.touch_pages(a, 0, PAGES) == PAGES
        put_file(tier, fkey(f"x{i}"), blob(10 + i, PAGE))
        i += 1
        assert i < 200
    assert all(tier.contains(a.page(p)) for p in range(PAGES))


def test_an_expired_file_is_dropped_not_counted(tier: DiskTier) -> None:
    fk = fkey("old")
    _put_pages(tier, fk, list(range(PAGES)), expires_at=time.time() - 1)
    assert tier.touch_pages(fk, 0, PAGES) == 0
    assert not tier.contains(fk.page(0))


def test_a_tiered_store_follows_a_file_across_its_tiers(tmp_path: Path) -> None:
    store = TieredStore.from_specs(
        [
            TierSpec("ssd", str(tmp_path / "ssd"), 1024 * PAGE),
            TierSpec("mem", str(tmp_path / "mem"), 1024 * PAGE),
        ]
    )
    try:
        mem, ssd = store.tiers
        assert isinstance(mem, DiskTier) and isinstance(ssd, DiskTier)
        fk = fkey("split")
        _put_pages(mem, fk, [0, 1, 4])
        _put_pages(ssd, fk, [2, 3])
        assert store.touch_pages(fk, 0, PAGES) == 5  # page 5 is in neither
        assert store.touch_pages(fk, 2, 4) == 2
        assert store.touch_pages(fk, 5, PAGES) == 0
        _put_pages(ssd, fk, [5])
        assert store.touch_pages(fk, 0, PAGES) == PAGES
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["lru", "lfu", "fifo"])
def test_touch_times_is_touch_that_many_times(kind: str) -> None:
    """Each policy, fed the same reads once as ``touch_times`` and once read by
    read, gives up its units in the same order."""
    rng = random.Random(kind)
    one, many = PerDataset(kind), PerDataset(kind)
    keys = [FileKey(f"ds{i % 2}", f"m/f{i}", "v") for i in range(30)]
    for k in keys:
        one.add(k)
        many.add(k)
    for _ in range(200):
        k, n = rng.choice(keys), rng.randrange(0, 5)
        many.touch_times(k, n)
        for _ in range(n):
            one.touch(k)
    order = [many.pop_victim() for _ in keys]
    assert order == [one.pop_victim() for _ in keys]
    assert sorted(order, key=keys.index) == keys  # every unit, once

"""TieredStore specifics: placement between tiers, demotion, per-tier usage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.config import TierSpec
from shoal.store.base import PutMeta
from shoal.store.disk import DiskTier
from shoal.store.tiered import TieredStore
from shoal.testing.store_conformance import PAGE, blob, fkey, put_file

KiB = 1 << 10


@pytest.fixture
def tiered(tmp_path: Path) -> Iterator[TieredStore]:
    store = TieredStore.from_specs(
        [
            TierSpec("ssd", str(tmp_path / "ssd"), 1024 * KiB),
            TierSpec("mem", str(tmp_path / "mem"), 128 * KiB),
        ]
    )
    yield store
    store.close()


def test_from_specs_orders_fastest_first(tiered: TieredStore) -> None:
    assert [t.name for t in tiered.tiers] == ["mem", "ssd"]
    mem, ssd = tiered.tiers
    assert isinstance(mem, DiskTier) and mem.demote_to is ssd


def test_puts_go_to_the_highest_tier(tiered: TieredStore) -> None:
    put_file(tiered, fkey("a"), blob(1, 1000))
    loc = tiered.locate(fkey("a").page(0))
    assert loc is not None and loc.tier == "mem"
    # too big for mem (page above its high watermark): goes to ssd
    assert tiered.put(fkey("b").page(0), b"x" * 200_000, PutMeta(200_000, 1 << 20))
    loc = tiered.locate(fkey("b").page(0))
    assert loc is not None and loc.tier == "ssd"
    assert put_file(tiered, fkey("a"), blob(1, 1000))  # already stored: no second copy
    assert tiered.usage().files == 2


def test_eviction_demotes_and_usage_sums_the_tiers(tiered: TieredStore) -> None:
    for i in range(100):
        assert put_file(tiered, fkey(f"f{i}"), blob(i, 3000))
    for i in range(100):
        assert tiered.get(fkey(f"f{i}").page(0)) == blob(i, 3000)
    (mem_name, mem), (ssd_name, ssd) = tiered.tier_usage()
    assert (mem_name, ssd_name) == ("mem", "ssd")
    assert mem.evicted_bytes > 0 and ssd.files > 0 and mem.used <= mem.capacity
    total = tiered.usage()
    assert total.files == mem.files + ssd.files == 100
    assert total.capacity == mem.capacity + ssd.capacity
    assert total.by_dataset["ds"].files == 100
    assert tiered.delete(dataset="ds") == 100 * 3000
    assert tiered.usage().files == 0


def test_a_large_file_stays_in_one_tier(tiered: TieredStore) -> None:
    fk, data = fkey("big"), blob(1, 3 * PAGE)
    meta = PutMeta(len(data), PAGE)
    assert tiered.put(fk.page(0), data[:PAGE], meta)
    mem = tiered.tiers[0]
    # fill mem so that the big file is demoted to ssd
    for i in range(100):
        put_file(tiered, fkey(f"f{i}"), blob(i, 3000))
    assert not mem.has_file(fk) and tiered.has_file(fk)
    for i in (1, 2):
        assert tiered.put(fk.page(i), data[i * PAGE : (i + 1) * PAGE], meta)
    loc = tiered.locate_file(fk)
    assert loc is not None and loc.tier == "ssd" and loc.length == len(data)


def test_drop_corrupt_and_expire_reach_every_tier(tiered: TieredStore) -> None:
    put_file(tiered, fkey("a"), blob(1, 1000), expires_at=100.0)
    tiered.drop_corrupt(fkey("a").page(0))
    assert tiered.usage().corrupt_pages == 1 and not tiered.contains(fkey("a").page(0))
    put_file(tiered, fkey("b"), blob(2, 1000), expires_at=100.0)
    assert tiered.expire(200.0) == 1000
    tiered.flush()


def test_put_honours_the_tiers_a_dataset_allows(tmp_path: Path) -> None:
    from shoal.core.types import FileKey

    store = TieredStore.from_specs(
        [
            TierSpec("mem", str(tmp_path / "mem"), 1 << 20),
            TierSpec("ssd", str(tmp_path / "ssd"), 1 << 20),
        ]
    )
    try:
        key = FileKey("ds", "m/a", "v1").page(0)
        assert store.put(key, b"x" * 100, PutMeta(100, 4096, tiers=("ssd",)))
        assert [name for name, u in store.tier_usage() if u.pages] == ["ssd"]
        other = FileKey("ds", "m/b", "v1").page(0)
        assert not store.put(other, b"y" * 100, PutMeta(100, 4096, tiers=("hdd",)))
    finally:
        store.close()

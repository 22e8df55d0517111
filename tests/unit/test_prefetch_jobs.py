"""The prefetcher's decisions with a fake fetch: a sequential reader's window stays full
on hits, a random reader's misses pull the whole file once, budgets hold (issue 16)."""

from __future__ import annotations

import asyncio

from shoal.core.types import CachePolicy, Dataset, FileInfo, Mount
from shoal.worker.prefetch import WHOLE_AFTER, Prefetcher

MiB = 1 << 20


class Fake:
    """Pages ``fetched`` so far; fetches stay in flight until released."""

    def __init__(self) -> None:
        self.fetched: list[int] = []
        self.inflight: set[int] = set()
        self.gate = asyncio.Event()

    async def fetch(self, ds: Dataset, info: FileInfo, index: int) -> None:
        assert index not in self.fetched, f"page {index} fetched twice"
        self.inflight.add(index)
        await self.gate.wait()
        self.inflight.discard(index)
        self.fetched.append(index)

    def skip(self, ds: Dataset, info: FileInfo, index: int) -> bool:
        return index in self.fetched or index in self.inflight


def _ds(readahead: int = 8) -> Dataset:
    policy = CachePolicy(page_size=MiB, readahead=readahead)
    return Dataset("ds", (Mount("data", "s3://b"),), policy)


async def _settle(fake: Fake, pf: Prefetcher) -> None:
    fake.gate.set()
    while pf.active:
        await asyncio.sleep(0)


def test_hits_keep_a_sequential_readers_window_full() -> None:
    async def go() -> None:
        fake = Fake()
        pf = Prefetcher(fake.fetch, fake.skip, lambda: 1 << 40, budget=64, per_file=64)
        ds, info = _ds(8), FileInfo("data/f", 100 * MiB, "v1")
        pf.on_read(ds, info, range(0, 1), True)  # first read: a small window (pages 1, 2)
        await asyncio.sleep(0)
        assert fake.inflight == {1, 2}
        pf.on_read(ds, info, range(1, 2), True)  # continues it: the window doubles
        await _settle(fake, pf)
        fake.gate.clear()
        # every further read is a hit, and the window stays 8 pages ahead of it
        for page in range(2, 40):
            pf.on_read(ds, info, range(page, page + 1), False)
            await asyncio.sleep(0)
            assert max(fake.inflight | set(fake.fetched)) == page + 8
        await _settle(fake, pf)
        assert sorted(fake.fetched) == list(range(1, 48))

    asyncio.run(go())


def test_random_misses_fetch_the_whole_file_within_budget() -> None:
    async def go() -> None:
        fake = Fake()
        pf = Prefetcher(fake.fetch, fake.skip, lambda: 1 << 40, budget=4, per_file=3)
        ds, info = _ds(8), FileInfo("data/f", 20 * MiB, "v1")
        for n, page in enumerate((17, 3, 11, 6)[:WHOLE_AFTER], 1):
            fake.fetched.append(page)  # the reader fetched its own page
            pf.on_read(ds, info, range(page, page + 1), True)
            await asyncio.sleep(0)
            assert bool(fake.inflight) == (n == WHOLE_AFTER)
        assert len(fake.inflight) == 3  # per file
        assert min(fake.inflight) == 7  # from just past the last miss
        await _settle(fake, pf)
        assert sorted(fake.fetched) == list(range(20))
        assert pf.whole_files == 1 and not pf.jobs

    asyncio.run(go())


def test_a_file_larger_than_a_quarter_of_the_store_is_not_fetched_whole() -> None:
    async def go() -> None:
        fake = Fake()
        pf = Prefetcher(fake.fetch, fake.skip, lambda: 40 * MiB, budget=4, per_file=4)
        ds, info = _ds(8), FileInfo("data/f", 20 * MiB, "v1")
        for page in (17, 3, 11, 6, 9, 1):
            pf.on_read(ds, info, range(page, page + 1), True)
            await asyncio.sleep(0)
        assert not fake.inflight and pf.whole_files == 0

    asyncio.run(go())


def test_readahead_zero_fetches_nothing_ahead() -> None:
    async def go() -> None:
        fake = Fake()
        pf = Prefetcher(fake.fetch, fake.skip, lambda: 1 << 40)
        ds, info = _ds(0), FileInfo("data/f", 20 * MiB, "v1")
        for page in (0, 1, 2, 17, 3, 11, 6, 9):
            pf.on_read(ds, info, range(page, page + 1), True)
            await asyncio.sleep(0)
        assert not fake.inflight and not pf.jobs

    asyncio.run(go())

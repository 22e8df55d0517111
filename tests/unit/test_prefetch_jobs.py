"""The prefetcher's decisions with a fake fetch: a sequential reader's window stays full
on hits, a random reader's misses pull the whole file once, budgets hold (issue 16)."""

from __future__ import annotations

import asyncio

from shoal.core.types import CachePolicy, Dataset, FileInfo, Mount
from shoal.worker.prefetch import RUN_BYTES, WHOLE_AFTER, Prefetcher

MiB = 1 << 20


class Fake:
    """Pages ``fetched`` so far; fetches stay in flight until released."""

    def __init__(self) -> None:
        self.fetched: list[int] = []
        self.inflight: set[int] = set()
        self.gate = asyncio.Event()
        #: (first page, pages) of each fetch: one GET each
        self.calls: list[tuple[int, int]] = []

    async def fetch(self, ds: Dataset, info: FileInfo, index: int, count: int) -> None:
        pages = range(index, index + count)
        for i in pages:
            assert i not in self.fetched and i not in self.inflight, f"page {i} fetched twice"
        self.calls.append((index, count))
        self.inflight.update(pages)
        await self.gate.wait()
        self.inflight.difference_update(pages)
        self.fetched.extend(pages)

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


def test_adjacent_pages_due_are_fetched_in_one_get() -> None:
    """A window of pages ahead goes out as runs of up to RUN_BYTES, never across a page
    that is cached or in flight, and the bounds count pages, not GETs."""

    async def go() -> None:
        fake = Fake()
        pf = Prefetcher(fake.fetch, fake.skip, lambda: 1 << 40, budget=64, per_file=64)
        run = RUN_BYTES // MiB
        ds, info = _ds(4 * run), FileInfo("data/f", 100 * MiB, "v1")
        fake.fetched.append(3 * run)  # cached already: a run stops short of it
        pf.on_read(ds, info, range(0, 1), True)
        pf.on_read(ds, info, range(1, 2), True)
        for page in range(2, 6 * run):
            await _settle(fake, pf)
            pf.on_read(ds, info, range(page, page + 1), False)
        await _settle(fake, pf)
        assert max(n for _, n in fake.calls) == run  # runs, at most RUN_BYTES each
        assert all(not (i <= 3 * run < i + n) for i, n in fake.calls)
        assert sorted(fake.fetched) == list(range(1, max(fake.fetched) + 1))  # each page once
        # a small budget: at most that many pages in flight, whatever the run size
        fake2 = Fake()
        pf2 = Prefetcher(fake2.fetch, fake2.skip, lambda: 1 << 40, budget=3, per_file=64)
        pf2.on_read(ds, FileInfo("data/g", 100 * MiB, "v1"), range(0, 1), True)
        pf2.on_read(ds, FileInfo("data/g", 100 * MiB, "v1"), range(1, 2), True)
        await asyncio.sleep(0)
        assert 0 < len(fake2.inflight) <= 3
        await _settle(fake2, pf2)

    asyncio.run(go())

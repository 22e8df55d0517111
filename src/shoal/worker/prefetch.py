"""Fetching ahead of the readers of large files: what the loader starts in the
background so that a cold reader waits for under storage as little as the link allows.

Two shapes of reader, one mechanism (a :class:`Job` per file version, an *order* of its
pages and how much of that order may be issued now):

- a **sequential** reader gets a window of pages in flight ahead of it, kept full on
  every read that reaches the worker, hits (the fast path) included. The window used to
  be refilled only when a read missed, so the link went idle while the reader ate the
  window and every refill began with a stall: ~0.5x of the link cold (issue 16).
- a **random** reader of a file that fits the cap (``WHOLE_CAP`` and a quarter of the
  store) gets the whole file, in parallel ranged GETs from where it read, once it has
  missed ``WHOLE_AFTER`` times off any sequential run: one read per page at a time can
  never fill a link with a 4 ms round trip. A few scattered ranges (a parquet footer, a
  column chunk) still fetch only the pages they touch (issue 11 item 8).

Every page goes through the loader's fetch (``fetch``: single-flight per page, ranged
GETs conditioned on the version, the store's accounting), so nothing is fetched twice
and a reader that needs a page not yet issued fetches it itself at once, ahead of the
queue. Background GETs are bounded per file (``per_file``) and per worker (``budget``,
below the loader's own bound so that readers' own GETs always find room). A failed
background fetch (a changed version, a store error) ends the job: the reader's own
read meets the same error and handles it as without prefetch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from shoal.core.paging import READAHEAD_START, page_count
from shoal.core.types import Dataset, FileInfo

log = logging.getLogger("shoal.worker.prefetch")

#: the largest file a random reader's misses pull in whole
WHOLE_CAP = 1 << 30
#: misses off a sequential run before a file is fetched whole
WHOLE_AFTER = 4
#: files tracked at once (the oldest is forgotten first)
MAX_JOBS = 1024
#: bytes of adjacent pages fetched in one GET (per-request costs, the store's and the
#: worker's, paid once per run); the per-file and per-worker bounds count pages
RUN_BYTES = 4 << 20

#: fetch(ds, info, index, count): pages ``index .. index+count-1`` into the store, in
#: one ranged GET (the loader's, single-flight per page)
Fetch = Callable[[Dataset, FileInfo, int, int], Awaitable[object]]
#: skip(ds, info, index): whether the page is cached or already being fetched
Skip = Callable[[Dataset, FileInfo, int], bool]


@dataclass(slots=True, eq=False)
class Job:
    """One file version's background fetches: pages ``start, start+1, ..., total-1, 0,
    ..., start-1`` in that order, of which the first ``limit`` may be issued."""

    ds: Dataset
    info: FileInfo
    total: int
    start: int = 0
    issued: int = 0
    limit: int = 0
    #: pages a sequential reader gets ahead of it (grows as the kernel's readahead does)
    window: int = 0
    #: where the file's last sequential read ended
    stop: int = 0
    inflight: int = 0
    #: misses off any sequential run (random reads)
    misses: int = 0
    whole: bool = False

    def frontier(self) -> int:
        """The page after the last one issued in a sequential (unwrapped) order."""
        return self.start + self.issued


class Prefetcher:
    def __init__(
        self,
        fetch: Fetch,
        skip: Skip,
        room: Callable[[], int],
        budget: int = 16,
        per_file: int = 16,
    ) -> None:
        self._fetch = fetch
        self._skip = skip
        #: bytes the store can hold (a file fetched whole must fit a quarter of it)
        self._room = room
        self.budget = budget
        self.per_file = per_file
        self.jobs: dict[tuple[str, str], Job] = {}
        self.active = 0
        self._tasks: set[asyncio.Task[None]] = set()
        #: files fetched whole, and background page fetches issued (tests, metrics)
        self.whole_files = 0
        self.issued = 0

    def on_read(self, ds: Dataset, info: FileInfo, rng: range, miss: bool) -> None:
        """A read of pages ``rng`` of a large file reached the worker (``miss``: some
        page of it was not cached): keep its reader's pages coming."""
        limit = ds.policy.readahead
        if limit <= 0 or not rng:
            return
        key = (ds.name, info.path)
        job = self.jobs.get(key)
        if job is not None and (
            job.info.version != info.version or job.ds.policy.page_size != ds.policy.page_size
        ):
            del self.jobs[key]  # another version or layout: what it issued runs out alone
            job = None
        if job is None:
            if not miss:
                return
            total = page_count(info.size, ds.policy.page_size)
            job = Job(ds, info, total, stop=rng.stop)
            if len(self.jobs) >= MAX_JOBS:
                del self.jobs[next(iter(self.jobs))]
            self.jobs[key] = job
            if rng.start != 0:
                self._random(job, rng)
                return
            job.window = min(limit, max(READAHEAD_START, len(rng)))
            job.issued = rng.stop  # the reader fetches its own pages
        elif job.whole:
            return
        elif job.stop - 1 <= rng.start <= max(job.frontier(), job.stop + job.window):
            if not miss and job.window < 2 * READAHEAD_START:
                return  # a hit extends only a run that a second read proved sequential
            job.window = min(limit, max(READAHEAD_START, 2 * job.window, len(rng)))
            job.stop = max(job.stop, rng.stop)
        else:
            if miss:
                self._random(job, rng)
            return
        job.limit = max(job.limit, min(job.total, job.stop + job.window) - job.start)
        self._pump(job)

    def _random(self, job: Job, rng: range) -> None:
        job.misses += 1
        size = job.info.size
        if job.misses < WHOLE_AFTER or size > WHOLE_CAP or size > self._room() // 4:
            return
        # the whole file, from just past this read round to just before it
        job.whole = True
        job.start, job.issued, job.limit = rng.stop % job.total, 0, job.total
        self.whole_files += 1
        self._pump(job)

    def _pump(self, job: Job) -> None:
        while job.issued < job.limit and job.inflight < self.per_file and self.active < self.budget:
            i = (job.start + job.issued) % job.total
            job.issued += 1
            if self._skip(job.ds, job.info, i):
                continue
            # the pages after it that are due, not known and in the same order: one GET
            n = 1
            most = min(self.run_pages(job.ds), self.per_file - job.inflight,
                       self.budget - self.active, job.limit - job.issued + 1)  # fmt: skip
            while (
                n < most
                and i + n < job.total
                and (job.start + job.issued) % job.total == i + n
                and not self._skip(job.ds, job.info, i + n)
            ):
                job.issued += 1
                n += 1
            job.inflight += n
            self.active += n
            self.issued += n
            task = asyncio.get_running_loop().create_task(self._run(job, i, n))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if job.issued >= job.total and job.inflight == 0:
            self._drop(job)

    @staticmethod
    def run_pages(ds: Dataset) -> int:
        """Pages fetched in one GET: :data:`RUN_BYTES` of them (at least one)."""
        return max(1, RUN_BYTES // ds.policy.page_size)

    async def _run(self, job: Job, index: int, count: int) -> None:
        try:
            await self._fetch(job.ds, job.info, index, count)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # advisory: the reader meets the error on its own read
            log.debug("prefetch of %s pages %d+%d failed: %s", job.info.path, index, count, exc)
            job.limit = job.issued  # issue nothing more for this version
            self._drop(job)
        finally:
            job.inflight -= count
            self.active -= count
        self._pump(job)
        if self.active < self.budget:
            for other in list(self.jobs.values()):
                if other is not job and other.issued < other.limit:
                    self._pump(other)
                    if self.active >= self.budget:
                        break

    def _drop(self, job: Job) -> None:
        key = (job.ds.name, job.info.path)
        if self.jobs.get(key) is job:
            del self.jobs[key]

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.jobs.clear()

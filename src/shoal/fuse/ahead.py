"""Metadata ahead of the kernel: a directory whose files are looked up cold is listed
once, so the lookups of its other files are answered from the client's metadata
instead of one worker stat each.

Without a manifest, a cold LOOKUP costs a worker STAT, which costs the under storage a
HEAD, before the READ's GET: twice the store round trips of the Python client, which
reads without a stat (measured: 0.40x its cold rate). One LIST gives a thousand files'
metadata. A directory is listed from its second cold lookup on (a lone stat, say
``stat /mnt/ds/data/x``, never lists a large directory), the lookups that arrive
meanwhile wait for that listing (single flight, at most :data:`LIST_WAIT`: a huge
directory's listing takes long: after one timeout the others stat at once until it is
done) and then ask for their one file only if it did not answer for it.

The entries of every listing (a READDIR's or one started here) are kept here, by
directory, with when they were listed and the dataset generation they were listed at:
lookups are answered from them for as long as the staleness bound allows, whatever the
client still holds (its metadata is dropped with each new generation, and entries of
directories, which it never keeps). A sync (:meth:`Ahead.forget_dataset`) drops them,
and a listing that was in flight across it is not kept. A name missing from a listing is
still asked for (a stat), so an errno never comes from a listing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from shoal.client.aio import AsyncClient
from shoal.core.types import FileInfo
from shoal.errors import ShoalError
from shoal.fuse.nodes import Stats

log = logging.getLogger("shoal.fuse.ahead")

#: cold lookups in one directory before it is listed whole
LIST_AFTER = 2
#: seconds cold lookups wait for their directory's listing before they stat their file
#: (the stat would queue behind the same busy worker's store requests as the listing;
#: after one such timeout, lookups there stat at once until the listing is done)
LIST_WAIT = 5.0
#: directories remembered (listed, or with a cold lookup counted); oldest dropped first
MAX_DIRS = 65536
#: staleness bounds (seconds) below which listing ahead is pointless: the metadata it
#: brings expires before the lookups it is for
MIN_TTL = 1.0
#: listed entries kept over all directories; the oldest directories dropped first
MAX_ENTRIES = 1_000_000

#: a listing's entries: name -> metadata (the name as the entry's path)
Listing = dict[str, FileInfo]


class Ahead:
    """Listings of directories started by cold lookups: namespace path -> (task, when)."""

    def __init__(
        self,
        client: AsyncClient,
        stats: Stats,
        entry: Callable[[str, FileInfo], FileInfo] = lambda path, e: e,
        generation: Callable[[str], int | None] = lambda path: None,
    ) -> None:
        self.client = client
        self.stats = stats
        #: a listed entry as the mount shows it: (directory path, client entry) -> entry
        self._entry = entry
        #: the current generation of the dataset of a namespace path (None: unknown)
        self._generation = generation
        #: directory path -> (its entries, monotonic time listed, generation listed at)
        self._entries: OrderedDict[str, tuple[Listing, float, int | None]] = OrderedDict()
        self._held = 0
        #: dataset -> syncs seen: a listing in flight across one is not kept
        self._epoch: dict[str, int] = {}
        self._lists: OrderedDict[str, tuple[asyncio.Future[None], float]] = OrderedDict()
        self._cold: OrderedDict[str, int] = OrderedDict()
        #: directories whose listing outlasted LIST_WAIT: lookups do not wait for it
        self._slow: set[str] = set()
        self.listings = 0

    async def wait_listing(self, path: str, ttl: float) -> bool:
        """Before a cold lookup in directory ``path`` stats one file: list the whole
        directory (from its second cold lookup on, once per staleness bound ``ttl``) and
        wait for the listing, up to :data:`LIST_WAIT`. True if a listing was waited for
        (the caller looks at the listing's entries and the client's metadata again)."""
        if ttl < MIN_TTL:
            return False
        now = time.monotonic()
        hit = self._lists.get(path)
        if hit is not None and hit[0].done() and (now - hit[1] > ttl or path not in self._entries):
            # listed longer ago than the bound, or its entries were dropped (a new
            # generation, the bound on entries kept): list again
            del self._lists[path]
            hit = None
        if hit is None:
            seen = self._cold.pop(path, 0) + 1
            if seen < LIST_AFTER:
                self._cold[path] = seen
                _trim(self._cold)
                return False
            task: asyncio.Future[None] = asyncio.get_running_loop().create_task(self._list(path))
            hit = self._lists[path] = (task, now)
            _trim(self._lists)
        if not hit[0].done():
            if path in self._slow:
                return False  # a huge directory: stat, as before, until it is listed
            try:
                await asyncio.wait_for(asyncio.shield(hit[0]), LIST_WAIT)
            except TimeoutError:
                self._slow.add(path)
                hit[0].add_done_callback(lambda _: self._slow.discard(path))
        return True

    def epoch(self, path: str) -> tuple[int, int | None, float]:
        """What :meth:`listed` needs to know of a listing of ``path`` about to start."""
        return self._epoch.get(_dataset(path), 0), self._generation(path), time.monotonic()

    def listed(
        self, path: str, entries: list[FileInfo], started: tuple[int, int | None, float]
    ) -> None:
        """``path`` was listed (``entries`` named by name, as the mount shows them), in a
        listing that began at ``started`` (:meth:`epoch`): lookups are answered from it."""
        epoch, gen, at = started
        if self._epoch.get(_dataset(path), 0) != epoch:
            return  # a sync came meanwhile: the listing may predate it
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        self._lists.pop(path, None)  # (an in-flight task: its waiters hold it)
        self._lists[path] = (done, at)
        _trim(self._lists)
        old = self._entries.pop(path, None)
        if old is not None:
            self._held -= len(old[0])
        self._entries[path] = ({e.path: e for e in entries}, at, gen)
        self._held += len(entries)
        while self._held > MAX_ENTRIES and len(self._entries) > 1:
            self._held -= len(self._entries.popitem(last=False)[1][0])

    def entry(self, path: str, name: str, ttl: float) -> FileInfo | None:
        """``name``'s entry in the listing of directory ``path``, if one was taken within
        the staleness bound ``ttl`` and at the dataset's current generation."""
        hit = self._entries.get(path)
        if hit is None:
            return None
        entries, at, gen = hit
        if time.monotonic() - at > ttl or (gen is not None and gen != self._generation(path)):
            self._held -= len(entries)
            del self._entries[path]
            return None
        return entries.get(name)

    def forget_dataset(self, name: str) -> None:
        """A dataset changed (sync): its directories are listed again when looked in."""
        self._epoch[name] = self._epoch.get(name, 0) + 1
        prefix = "/" + name + "/"
        for table in (self._lists, self._cold, self._entries):
            for path in [p for p in table if p.startswith(prefix)]:
                if table is self._entries:
                    self._held -= len(self._entries[path][0])
                del table[path]

    async def _list(self, path: str) -> None:
        self.listings += 1
        self.stats.client_calls += 1
        started = self.epoch(path)
        try:
            listed = await self.client.ls(path)
        except (ShoalError, OSError) as exc:
            # the lookups go on with one stat each; a later cold lookup lists again
            log.debug("listing %s ahead of its lookups failed: %s", path, exc)
            self._lists.pop(path, None)
            return
        self.listed(path, [self._entry(path, e) for e in listed], started)


def _dataset(path: str) -> str:
    return path.split("/", 2)[1]


def _trim(table: OrderedDict[str, Any]) -> None:
    while len(table) > MAX_DIRS:
        table.popitem(last=False)

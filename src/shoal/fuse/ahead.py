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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any

from shoal.client.aio import AsyncClient
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


class Ahead:
    """Listings of directories started by cold lookups: namespace path -> (task, when)."""

    def __init__(self, client: AsyncClient, stats: Stats) -> None:
        self.client = client
        self.stats = stats
        self._lists: OrderedDict[str, tuple[asyncio.Future[None], float]] = OrderedDict()
        self._cold: OrderedDict[str, int] = OrderedDict()
        #: directories whose listing outlasted LIST_WAIT: lookups do not wait for it
        self._slow: set[str] = set()
        self.listings = 0

    async def wait_listing(self, path: str, ttl: float) -> bool:
        """Before a cold lookup in directory ``path`` stats one file: list the whole
        directory (from its second cold lookup on, once per staleness bound ``ttl``) and
        wait for the listing, up to :data:`LIST_WAIT`. True if a listing was waited for
        (the caller looks at the client's metadata again)."""
        if ttl < MIN_TTL:
            return False
        now = time.monotonic()
        hit = self._lists.get(path)
        if hit is not None and hit[0].done() and now - hit[1] > ttl:
            del self._lists[path]  # listed longer ago than the bound: list again
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

    def listed(self, path: str) -> None:
        """A READDIR listed ``path``: its files' metadata is held already."""
        if path not in self._lists:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            self._lists[path] = (done, time.monotonic())
            _trim(self._lists)

    def forget_dataset(self, name: str) -> None:
        """A dataset changed (sync): its directories are listed again when looked in."""
        prefix = "/" + name + "/"
        for table in (self._lists, self._cold):
            for path in [p for p in table if p.startswith(prefix)]:
                del table[path]

    async def _list(self, path: str) -> None:
        self.listings += 1
        self.stats.client_calls += 1
        try:
            await self.client.ls(path)  # the client keeps every entry's metadata
        except (ShoalError, OSError) as exc:
            # the lookups go on with one stat each; a later cold lookup lists again
            log.debug("listing %s ahead of its lookups failed: %s", path, exc)
            self._lists.pop(path, None)


def _trim(table: OrderedDict[str, Any]) -> None:
    while len(table) > MAX_DIRS:
        table.popitem(last=False)

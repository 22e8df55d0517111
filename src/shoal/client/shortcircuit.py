"""The short circuit's round trips: a worker on this host hands over descriptors of
its cached pages (LOCATE), of a directory's or a whole dataset's cached small files
(LOCATE_DIR), and the reads that follow are a ``pread`` in this process
(:mod:`shoal.client.local`, which also buffers the hits reported later with TOUCH).
Every knob of the short circuit is here or in :mod:`shoal.client.local` (the touch
flush) and :mod:`shoal.client.cache` (``DIR_RELOCATE``).

One part of :class:`~shoal.client.aio.AsyncClient`, built on its router (the round
trips) and hit book (the flush a fast read may start).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from shoal.client.cache import DIR_RELOCATE, WorkerAddr
from shoal.client.conn import TimedOut
from shoal.client.handover import (
    DATASET_LOCATE_AFTER,
    LOCATE_AHEAD,
    directories_to_locate,
    layout_moved,
    take_dir,
    take_locations,
)
from shoal.client.hits import HitBook
from shoal.client.local import TOUCH_EVERY, TOUCH_FLUSH, read_located, read_path, touches_due
from shoal.client.routing import Router
from shoal.core.types import NEVER, Dataset
from shoal.errors import ProtocolError, StaleLayout, Unavailable
from shoal.proto.messages import LocateDirRequest, LocateRequest

log = logging.getLogger("shoal.client")


__all__ = [
    "DATASET_LOCATE_AFTER",
    "DIR_RELOCATE",
    "LOCATE_AHEAD",
    "TOUCH_EVERY",
    "TOUCH_FLUSH",
    "ShortCircuit",
]


class ShortCircuit:
    """Located reads through ``router``'s local workers; hits go to ``hits``."""

    def __init__(self, router: Router, hits: HitBook) -> None:
        self.router = router
        self.hits = hits
        self.cache = router.cache

    def read_fast(self, path: str, offset: int = 0, length: int = -1) -> bytes | None:
        """The zero-round-trip read: bytes [offset, offset+length) of ``path``
        ("/<dataset>/<mount>/<path>" or "shoal://...") when its metadata and the
        locations of its pages on a local worker are already known, else None (then
        ``await read(...)`` it). Only a ``pread`` and a checksum: call it from any
        thread, first, before the async read. Hits are counted and reported to their
        workers in batches (a flush is started on this client's loop when one is due)."""
        data = read_path(self.cache, path, offset, length)
        if data is not None and touches_due(self.cache):
            loop = self.router.loop
            if loop is not None and not loop.is_closed():
                self.cache.touched_at = time.monotonic()
                asyncio.run_coroutine_threadsafe(self.hits.flush_touches(), loop)
        return data

    async def read_local(
        self, w: WorkerAddr, ds: Dataset, path: str, offset: int, length: int, version: str | None
    ) -> tuple[bytes | None, str | None]:
        """A read through a local worker's descriptors: (the bytes, None), or (None, the
        version it holds) when it handed over no usable locations (read it over the
        socket instead)."""
        if ds.policy.staleness == NEVER:
            directory = path.rpartition("/")[0]
            if self.cache.dir_due((w.id, ds.name, directory)):
                # a new reader (a fresh DataLoader worker) learns a whole directory's
                # cached files in one round trip instead of one per file
                await self._locate(w, ds, [directory])
                fast = read_located(self.cache, ds, path, offset, length)
                if fast is not None:
                    return fast, None
        ps = ds.policy.page_size
        loc = LocateRequest(
            ds.name, path, version, offset, length, False, LOCATE_AHEAD, ps, ds.generation, True
        )
        lresp = await self.router.send(w, loc, True)
        if layout_moved(self.cache, ds):
            for fd in lresp.fds:
                os.close(fd)
            raise StaleLayout(f"/{ds.name}: the page size changed during the read")
        m = lresp.reply
        data = take_locations(self.cache, w.id, ds, path, m, lresp.fds, offset, length)
        if data is not None:
            self.cache.counters.local += 1
            self.cache.counters.bytes_local += len(data)
            return data, None
        return None, lresp.reply.version

    async def _locate(self, w: WorkerAddr, ds: Dataset, directories: list[str]) -> None:
        """Learn the cached files of these directories from a local worker. A reader that
        goes on to a third directory is taken to read the dataset at large (a training
        epoch) and asks once for the whole dataset's instead, if it is small enough."""
        whole_first = directories_to_locate(self.cache, w.id, ds, directories)
        if whole_first and await self._locate_dir(w, ds, None):
            return
        await asyncio.gather(*(self._locate_dir(w, ds, d) for d in directories))

    async def locate_or_suspect(self, w: WorkerAddr, ds: Dataset, directories: list[str]) -> None:
        try:
            await self._locate(w, ds, directories)
        except TimedOut as exc:
            self.router.mark_suspect(w, exc)  # what it would have served goes elsewhere

    async def _locate_dir(self, w: WorkerAddr, ds: Dataset, directory: str | None) -> bool:
        """Install a LOCATE_DIR answer; whether it held every cached file asked for."""
        ps = ds.policy.page_size
        try:
            req = LocateDirRequest(ds.name, directory, ps, ds.generation, True)
            resp = await self.router.send(w, req, True)
        except TimedOut:
            raise  # a hung worker: the read goes on to the next owner now
        except (Unavailable, ProtocolError, StaleLayout) as exc:
            log.debug("LOCATE_DIR on %s failed: %s", w.id, exc)
            return False
        return take_dir(self.cache, w.id, ds, directory, resp.reply, resp.fds)

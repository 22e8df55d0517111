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

from shoal.client.cache import DIR_RELOCATE, PageLoc, WorkerAddr
from shoal.client.conn import Response, TimedOut
from shoal.client.hits import HitBook
from shoal.client.local import TOUCH_EVERY, TOUCH_FLUSH, read_located, read_path, touches_due
from shoal.client.routing import Router
from shoal.core.types import NEVER, Dataset, FileInfo
from shoal.errors import ProtocolError, StaleLayout, Unavailable
from shoal.proto.messages import LocateDirRequest, LocateReply, LocateRequest

log = logging.getLogger("shoal.client")

#: bytes of already cached pages past a located range a worker also hands over
LOCATE_AHEAD = 256 << 20
#: after this many directories located, a reader asks for the whole dataset's cached
#: files (one answer instead of one per directory: a training epoch reads them all)
DATASET_LOCATE_AFTER = 3

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
            ds.name, path, version, offset, length, False, LOCATE_AHEAD, ps, ds.generation
        )
        lresp = await self.router.send(w, loc, True)
        data = self._take_locations(w, ds, path, lresp, offset, length)
        if data is not None:
            self.cache.counters.local += 1
            self.cache.counters.bytes_local += len(data)
            return data, None
        return None, lresp.reply.version

    def _take_locations(
        self,
        w: WorkerAddr,
        ds: Dataset,
        path: str,
        resp: Response[LocateReply],
        offset: int,
        length: int,
    ) -> bytes | None:
        """Install handed-over descriptors and page locations; read the range with pread."""
        m = resp.reply
        c = self.cache
        ids = [(x[0], x[1]) for x in m.fds]
        moved = self.router.layout_moved(ds)
        if moved or len(resp.fds) != len(ids) or any(p[0] < 0 for p in m.pages):
            for fd in resp.fds:
                os.close(fd)
            if moved:
                raise StaleLayout(f"/{ds.name}: the page size changed during the read")
            c.remember(ds.name, FileInfo(path, m.size, m.version, m.mtime))
            return None
        c.remember(ds.name, FileInfo(path, m.size, m.version, m.mtime))
        for key, fd in zip(ids, resp.fds, strict=True):
            c.add_fd(key, fd)
        first = m.first
        stamps = m.stamps  # unchecked by decode: none (an older worker) or odd: check all
        if type(stamps) is not list or len(stamps) != len(ids):
            stamps = [0] * len(ids)
        verified = c.verified
        for i, (slot, off, n, ck) in enumerate(m.pages):
            lk = (ds.name, path, m.version, first + i)
            c.locs[lk] = PageLoc(ids[slot], off, n, ck, w.id, ds.policy.page_size)
            # checked by the worker at this ctime: trusted while the file keeps it
            # (shoal.client.local); else this process checks the page itself
            if stamps[slot]:
                verified[lk] = stamps[slot]
            else:
                verified.pop(lk, None)
        # the worker counted this read when it answered: no touch for it
        return read_located(c, ds, path, offset, length, touch=False)

    async def _locate(self, w: WorkerAddr, ds: Dataset, directories: list[str]) -> None:
        """Learn the cached files of these directories from a local worker. A reader that
        goes on to a third directory is taken to read the dataset at large (a training
        epoch) and asks once for the whole dataset's instead, if it is small enough."""
        c = self.cache
        now = time.monotonic()
        whole = (w.id, ds.name, None)
        asked = c.dir_asks.get((w.id, ds.name), 0) + len(directories)
        c.dir_asks[(w.id, ds.name)] = asked
        for d in directories:
            c.dirs_located[(w.id, ds.name, d)] = now
        if whole not in c.dirs_located and asked >= DATASET_LOCATE_AFTER:
            c.dirs_located[whole] = now
            if await self._locate_dir(w, ds, None):
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
            req = LocateDirRequest(ds.name, directory, ps, ds.generation)
            resp = await self.router.send(w, req, True)
        except TimedOut:
            raise  # a hung worker: the read goes on to the next owner now
        except (Unavailable, ProtocolError, StaleLayout) as exc:
            log.debug("LOCATE_DIR on %s failed: %s", w.id, exc)
            return False
        m = resp.reply
        ids = [(x[0], x[1]) for x in m.fds]
        c = self.cache
        if len(resp.fds) != len(ids) or self.router.layout_moved(ds):
            for fd in resp.fds:
                os.close(fd)
            return False
        keys = []
        for key, fd in zip(ids, resp.fds, strict=True):
            keys.append(c.add_fd(key, fd))
        meta, locs, name, wid = c.meta, c.locs, ds.name, w.id
        small, verified = c.dir_locs, c.verified
        for path, v, size, slot, off, n, ck in m.items:
            if n != size or size > ps:
                continue  # a whole small file, or nothing
            if verified:
                verified.pop((name, path, v, 0), None)  # a check of another location
            known = meta.get((name, path))
            if known is None:
                # kept raw until read (shoal.client.local): no records per file here
                small[(name, path)] = (keys[slot], off, n, ck, v, wid, ps)
            elif known[0].version == v:
                locs[(name, path, v, 0)] = PageLoc(keys[slot], off, n, ck, wid, ps)
            # else: this process already reads another version of it
        return m.full and (directory is not None or bool(m.items))

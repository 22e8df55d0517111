"""The parts of ``shoal://`` beside the filesystem: the fast paths on the caller's
thread (reads of pages located on the local worker, stats from the metadata cache and
manifest: no hop to fsspec's loop thread), the open file (its reads take them first),
the refusal of writes, and the AsyncClient of one (process, event loop), kept apart
from the filesystem so that a finalizer can close it without keeping the filesystem
alive.

Until a process has its AsyncClient, a read of a file cached on this host's worker is
served as the sync client's first reads are (:mod:`shoal.client.direct`: two GETs to
the master, a ``HELLO`` and a ``LOCATE_DIR`` on the worker's Unix socket, on the
caller's thread, with no asyncio in between): a fresh process -- a DataLoader worker,
a script -- then pays for its first byte what ``Client.read`` pays, not for building
the async client, its sessions and their connections on fsspec's loop first (a fresh
reader's first 1 MiB read of a cached file: ~20 ms before, as the sync client's
~5-6 ms after). ``open`` asks for the file's size first, and that stat is served
the same way (a ``STAT`` on the same socket) when no cache holds it. Anything that
path cannot serve, and everything once the AsyncClient exists, goes through fsspec's
loop as before."""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from fsspec.asyn import sync
from fsspec.spec import AbstractBufferedFile

from shoal.client import AsyncClient
from shoal.client.cache import FORKS, ClientCache
from shoal.client.direct import DirectReads
from shoal.client.local import TOUCH_FLUSH, read_path, stat_path
from shoal.config import ClientSettings
from shoal.core.types import FileInfo

if TYPE_CHECKING:
    from shoal.fsspec import ShoalFileSystem

log = logging.getLogger("shoal.fsspec")

#: seconds between flushes of hits started from the caller's thread
FLUSH_GAP = 0.1


def read_only(path: str) -> PermissionError:
    return PermissionError(
        errno.EROFS,
        "shoal is a read-only cache: write to the under storage the dataset mounts "
        "(the cache picks changes up on its next sync or revalidation)",
        path,
    )


def refuse_async(target: int) -> Any:
    async def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise read_only(str(args[target]))

    return refuse


def refuse(target: int) -> Any:
    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise read_only(str(args[target]))

    return refuse


class ClientConn:
    """One AsyncClient per (process, event loop): a new loop or a forked child gets a
    new one; the old one is dropped, never awaited from the wrong loop. Before a
    process has one, its blocking first reads (one DirectReads per process), handed
    over to the AsyncClient once it is made, as the sync client does."""

    def __init__(self) -> None:
        self.aio: AsyncClient | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        #: the process (its fork generation, FORKS) the AsyncClient was made in
        self.gen = FORKS[0]
        #: (process, the blocking first reads of that process) while it has no AsyncClient
        self._direct: tuple[int, DirectReads] | None = None
        self._lock = threading.Lock()

    def direct(self, settings: ClientSettings, cache: ClientCache) -> DirectReads | None:
        """The blocking reads of the local worker's pages (see the module docstring),
        for as long as this process has no AsyncClient; None once it has one."""
        gen = FORKS[0]  # on every fast-path hit: no getpid() system call
        if self.aio is not None and self.gen == gen:
            return None
        held = self._direct
        if held is not None and held[0] == gen:
            return held[1]
        if held is not None:
            self._lock = threading.Lock()  # forked: the parent's may have been held
        with self._lock:  # one per process, whichever thread reads first
            held = self._direct
            if held is not None and held[0] == gen:
                return held[1]
            if held is not None:
                held[1].abandon()  # the parent's connections: closed here, never used
            d = DirectReads(settings, cache)
            self._direct = (gen, d)
            return d

    def get(self, settings: ClientSettings, cache: ClientCache) -> AsyncClient:
        running = asyncio.get_running_loop()
        aio = self.aio
        if aio is not None and self.loop is running and self.gen == FORKS[0]:
            return aio
        if aio is not None:
            aio.abandon()  # bound to another loop or a parent process: drop, don't await
        self.aio = aio = AsyncClient(settings, cache)
        self.loop, self.gen = running, FORKS[0]
        held = self._direct
        if held is not None and held[0] == self.gen:
            held[1].hand_over()  # the AsyncClient's ticker reports the hits from now on
        return aio

    def close(self) -> None:
        held, self._direct = self._direct, None
        if held is not None and held[0] == FORKS[0]:
            held[1].close()  # sends the hits it holds, closes its connections
        aio, loop, self.aio = self.aio, self.loop, None
        if aio is None or loop is None or self.gen != FORKS[0]:
            return
        try:
            if not loop.is_running():
                aio.abandon()
            elif _running_loop() is loop:  # collected on the loop's own thread: can't wait
                loop.create_task(aio.close())
            else:
                asyncio.run_coroutine_threadsafe(aio.close(), loop).result(timeout=10)
        except Exception as exc:  # closing is best effort (interpreter exit, dead loop)
            log.debug("closing the shoal client failed: %s", exc)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class ShoalFile(AbstractBufferedFile):
    """A read-only file; a block cache (PatternCache by default) sits over ``_fetch_range``."""

    fs: ShoalFileSystem

    def _fetch_range(self, start: int, end: int) -> bytes:
        fs = self.fs
        data = read_here(fs, self.path, start, end - start)
        if data is not None:
            return data
        data = sync(fs.loop, fs._read, self.path, start, end)
        return bytes(data)


def read_here(fs: ShoalFileSystem, path: str, offset: int, length: int) -> bytes | None:
    """A read from pages already located on the local worker, on the caller's thread
    (the client's fast path: no hop to fsspec's loop thread), or while this process has
    no AsyncClient yet, the blocking first read of them (see the module docstring);
    None: ask the loop."""
    if fs.target_protocol is not None:
        return None
    p = fs._strip_protocol(path)
    if not p:
        return None
    c = fs.client_cache
    data = read_path(c, "/" + p, offset, length)
    direct = fs._conn.direct(fs.settings, c)
    if data is None:
        return None if direct is None else direct.read("/" + p, offset, length)
    if direct is not None:
        direct.touched()  # no AsyncClient (yet): its own thread reports the hits
    elif len(c.touch_log) >= TOUCH_FLUSH:
        _flush(fs)
    return data


def stat_here(fs: ShoalFileSystem, path: str) -> FileInfo | None:
    """A stat from the client's metadata cache or manifest, on the caller's thread, or
    while this process has no AsyncClient yet, the blocking ``STAT`` of a local owner
    (``open`` starts with a stat: a fresh reader's first read needs no loop either)."""
    if fs.target_protocol is not None:
        return None
    p = fs._strip_protocol(path)
    if not p:
        return None
    hit = stat_path(fs.client_cache, "/" + p)
    if hit is not None:
        return hit
    direct = fs._conn.direct(fs.settings, fs.client_cache)
    return None if direct is None else direct.stat("/" + p)


def _flush(fs: ShoalFileSystem) -> None:
    """Hits served on the caller's thread go to their workers with the client's ticker
    (every TOUCH_EVERY seconds); when many piled up before it ran, flush on the loop now."""
    conn, c = fs._conn, fs.client_cache
    aio, loop, now = conn.aio, conn.loop, time.monotonic()
    if now - c.touched_at < FLUSH_GAP:
        return  # one on its way already
    if aio is not None and loop is not None and loop.is_running() and conn.gen == FORKS[0]:
        c.touched_at = now
        asyncio.run_coroutine_threadsafe(aio.flush_touches(), loop)

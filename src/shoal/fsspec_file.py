"""The parts of ``shoal://`` beside the filesystem: the open file (its reads take the
client's fast path on the caller's thread first) and the AsyncClient of one (process,
event loop), kept apart from the filesystem so that a finalizer can close it without
keeping the filesystem alive."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from fsspec.asyn import sync
from fsspec.spec import AbstractBufferedFile

from shoal.client import AsyncClient
from shoal.client.cache import ClientCache
from shoal.client.local import read_path
from shoal.config import ClientSettings

if TYPE_CHECKING:
    from shoal.fsspec import ShoalFileSystem

log = logging.getLogger("shoal.fsspec")


class ClientConn:
    """One AsyncClient per (process, event loop): a new loop or a forked child gets a
    new one; the old one is dropped, never awaited from the wrong loop."""

    def __init__(self) -> None:
        self.aio: AsyncClient | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pid = os.getpid()

    def get(self, settings: ClientSettings, cache: ClientCache) -> AsyncClient:
        running = asyncio.get_running_loop()
        aio = self.aio
        if aio is not None and self.loop is running and self.pid == os.getpid():
            return aio
        if aio is not None:
            aio.abandon()  # bound to another loop or a parent process: drop, don't await
        self.aio = aio = AsyncClient(settings, cache)
        self.loop, self.pid = running, os.getpid()
        return aio

    def close(self) -> None:
        aio, loop, self.aio = self.aio, self.loop, None
        if aio is None or loop is None or self.pid != os.getpid():
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
        data = _read_here(fs, self.path, start, end - start)
        if data is not None:
            return data
        data = sync(fs.loop, fs._read, self.path, start, end)
        return bytes(data)


def _read_here(fs: ShoalFileSystem, path: str, offset: int, length: int) -> bytes | None:
    """A read from pages already located on the local worker, on the caller's thread."""
    if fs.target_protocol is not None:
        return None
    return read_path(fs.client_cache, "/" + fs._strip_protocol(path), offset, length)

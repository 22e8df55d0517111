"""Kernel passthrough of large files complete on the local worker: the OPEN that
registers the worker's data file as a backing file (FUSE_DEV_IOC_BACKING_OPEN), and the
registrations kept after the last release for the next open of the same version.

Kept registrations are dropped least recently used first once :data:`MAX_BACKING` are
held or the idle ones add up to :data:`MAX_IDLE_BYTES` (each pins its data file, also
after the worker evicted it). Dropping them all at once at a small limit made every
epoch over more large files than the limit register each file again: a worker round
trip and two ioctls per open, about half the warm mix's rate.

A large file's first open needs a descriptor of the worker's data file. The first open
in a directory asks the local workers for every such file of that directory at once
(AsyncClient.open_local_dir: one LOCATE_DIR per worker) and keeps the descriptors it
did not use yet for the directory's next opens, HANDED_FOR seconds at most; a file
left out of that answer is asked for by itself, and once such a file is found cached
(the directory was asked while a cold pass was caching it), the directory is asked
again at its next open. One round trip per file held the first
warm pass over a mixed dataset at about half the rate of the passes after it.

A mixin of :class:`shoal.fuse.ops.FileSystem`, which owns the state named below.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable

from shoal.client.aio import AsyncClient
from shoal.client.wholefile import KeptFds
from shoal.core.types import FileInfo
from shoal.errors import ShoalError
from shoal.fuse import protocol as p
from shoal.fuse.nodes import (
    HANDED_FOR,
    MAX_BACKING,
    MAX_DIRS_ASKED,
    MAX_IDLE_BYTES,
    PASSTHROUGH_WAIT,
    Node,
    Reply,
    Stats,
)

log = logging.getLogger("shoal.fuse.passthrough")


class PassthroughOps:
    client: AsyncClient
    stats: Stats
    backing_open: Callable[[int], int] | None
    backing_close: Callable[[int], None] | None
    #: nodes whose registration is kept while no open uses it, least recent first
    _idle: OrderedDict[int, tuple[Node, int]]
    _idle_bytes: int
    #: descriptors a directory's answer handed over, by path, until their files' opens
    _handed: KeptFds[str]
    #: directories asked (monotonic time, oldest first), and those being asked now
    _dirs_asked: OrderedDict[str, float]
    _dirs_asking: dict[str, asyncio.Future[None]]
    nodes: dict[int, Node]

    # defined by FileSystem
    async def _restat(self, n: Node) -> None:
        raise NotImplementedError

    def _large(self, n: Node) -> bool:
        raise NotImplementedError

    def _open_cached(self, n: Node) -> bytes:
        raise NotImplementedError

    @staticmethod
    def _backing_ok(n: Node) -> bool:
        """A registered backing file that holds the node's current version."""
        return bool(n.backing) and n.backing_version == n.version

    def _open_passthrough(self, n: Node) -> bytes:
        n.opens += 1
        n.passthrough_opens += 1
        self._unidle(n)
        self.stats.passthrough_opens += 1
        return p.encode_open(1, p.FOPEN_PASSTHROUGH | p.FOPEN_NOFLUSH, n.backing)

    async def _open_async(self, n: Node, stat: bool) -> Reply:
        if stat:
            await self._restat(n)
        if self.backing_open is None or not self._large(n) or (n.opens and not n.backing):
            return self._open_cached(n)
        if self._backing_ok(n):
            return self._open_passthrough(n)
        if n.backing:  # an old version's, still open by passthrough: read via the daemon
            return self._open_cached(n)
        got = await self._whole(n)
        if got is None:
            return self._open_cached(n)
        fd, info = got
        try:
            if n.backing or n.opens or (info.version, info.size) != (n.version, n.size):
                return self._open_cached(n)  # raced with another open, or changed
            while self._idle and self.stats.backing_files >= MAX_BACKING:
                self._drop_backing(next(iter(self._idle.values()))[0])
            n.backing = self.backing_open(fd)
            n.backing_version = n.version
            self.stats.backing_files += 1
        except OSError as exc:
            log.warning("passthrough refused for %s: %s", n.path, exc)
            return self._open_cached(n)
        finally:
            os.close(fd)
        return self._open_passthrough(n)

    async def _whole(self, n: Node) -> tuple[int, FileInfo] | None:
        """A descriptor of the local worker's data file that holds ``n`` whole (the
        caller closes it): handed over by its directory's answer, else asked for by
        itself. Cached only: an uncached file is read through the daemon (which caches
        it) instead of waiting for the worker to load all of it first."""
        d = n.path.rpartition("/")[0]
        got = self._handed.pop(n.path)
        if got is None and await self._ask_directory(d):
            got = self._handed.pop(n.path)
        if got is not None:
            return got
        self.stats.client_calls += 1
        try:
            one = await asyncio.wait_for(
                self.client.open_local(n.path, load=False), PASSTHROUGH_WAIT
            )
        except TimeoutError:
            return None
        if one is not None:
            # cached whole since the directory was asked (its first pass was cold): its
            # next open asks again, for the files cached since
            self._dirs_asked.pop(d, None)
        return one

    async def _ask_directory(self, d: str) -> bool:
        """Take the descriptors of directory ``d``'s whole files, unless it was asked
        lately (then False); an ask under way is waited for."""
        pending = self._dirs_asking.get(d)
        if pending is not None:
            await asyncio.shield(pending)
            return True
        now = time.monotonic()
        self._handed.expire(now)
        at = self._dirs_asked.get(d)
        if at is not None and now - at < HANDED_FOR:
            return False
        self._dirs_asked.pop(d, None)
        self._dirs_asked[d] = now
        while len(self._dirs_asked) > MAX_DIRS_ASKED:
            self._dirs_asked.popitem(last=False)
        done = self._dirs_asking[d] = asyncio.get_running_loop().create_future()
        self.stats.client_calls += 1
        got: dict[str, tuple[int, FileInfo]] = {}
        try:
            got = await asyncio.wait_for(self.client.open_local_dir(d), PASSTHROUGH_WAIT)
        except (TimeoutError, ShoalError, OSError) as exc:
            log.debug("descriptors of %s not handed over: %s", d, exc)
        finally:
            del self._dirs_asking[d]
            done.set_result(None)
        for path, (fd, info) in got.items():
            self._handed.put(path, fd, info, now)
        return True

    def _release_passthrough(self, n: Node) -> None:
        n.passthrough_opens -= 1
        if n.passthrough_opens > 0:
            return
        if not self._backing_ok(n):
            self._drop_backing(n)  # the version changed while it was open
            return
        # kept for the next open of this version (one worker round trip and ioctl fewer);
        # dropped on a new version, a forget, or when the idle ones are too many
        self._unidle(n)
        self._idle[n.ino] = (n, n.size)
        self._idle_bytes += n.size
        while self._idle and (
            self._idle_bytes > MAX_IDLE_BYTES or self.stats.backing_files > MAX_BACKING
        ):
            self._drop_backing(next(iter(self._idle.values()))[0])

    def _unidle(self, n: Node) -> None:
        hit = self._idle.get(n.ino)
        if hit is not None and hit[0] is n:
            del self._idle[n.ino]
            self._idle_bytes -= hit[1]

    def _drop_backing(self, n: Node) -> None:
        self._unidle(n)
        if not n.backing:
            return
        backing, n.backing = n.backing, 0
        n.backing_version = ""
        self.stats.backing_files -= 1
        if self.backing_close is not None:
            try:
                self.backing_close(backing)
            except OSError as exc:
                log.warning("closing backing id %d failed: %s", backing, exc)

    def close_backing(self) -> None:
        """Drop every passthrough registration and handed descriptor (on shutdown)."""
        self._handed.close()
        self._idle.clear()
        self._idle_bytes = 0
        for n in self.nodes.values():
            if n.backing and self.backing_close is not None:
                try:
                    self.backing_close(n.backing)
                except OSError:
                    pass
                n.backing = 0

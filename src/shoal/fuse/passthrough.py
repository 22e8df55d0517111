"""Kernel passthrough of large files complete on the local worker: the OPEN that
registers the worker's data file as a backing file (FUSE_DEV_IOC_BACKING_OPEN), and the
registrations kept after the last release for the next open of the same version.

Kept registrations are dropped least recently used first once :data:`MAX_BACKING` are
held or the idle ones add up to :data:`MAX_IDLE_BYTES` (each pins its data file, also
after the worker evicted it). Dropping them all at once at a small limit made every
epoch over more large files than the limit register each file again: a worker round
trip and two ioctls per open, about half the warm mix's rate.

A mixin of :class:`shoal.fuse.ops.FileSystem`, which owns the state named below.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Callable

from shoal.client.aio import AsyncClient
from shoal.fuse import protocol as p
from shoal.fuse.nodes import MAX_BACKING, MAX_IDLE_BYTES, PASSTHROUGH_WAIT, Node, Reply, Stats

log = logging.getLogger("shoal.fuse.passthrough")


class PassthroughOps:
    client: AsyncClient
    stats: Stats
    backing_open: Callable[[int], int] | None
    backing_close: Callable[[int], None] | None
    #: nodes whose registration is kept while no open uses it, least recent first
    _idle: OrderedDict[int, tuple[Node, int]]
    _idle_bytes: int
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
        self.stats.client_calls += 1
        try:
            # cached only: an uncached file is read through the daemon (which caches it)
            # instead of waiting for the worker to load all of it first
            got = await asyncio.wait_for(
                self.client.open_local(n.path, load=False), PASSTHROUGH_WAIT
            )
        except TimeoutError:
            got = None
        if got is None:
            return self._open_cached(n)
        fd, info = got
        try:
            if n.backing or n.opens or info.version != n.version:
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
        """Drop every passthrough registration (on shutdown)."""
        self._idle.clear()
        self._idle_bytes = 0
        for n in self.nodes.values():
            if n.backing and self.backing_close is not None:
                try:
                    self.backing_close(n.backing)
                except OSError:
                    pass
                n.backing = 0

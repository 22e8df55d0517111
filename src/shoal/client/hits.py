"""Bookkeeping of reads the workers did not serve themselves: short-circuit hits and
a front-end's own local reads (FUSE passthrough), reported to their workers in batches
(``TOUCH``) off the read path so that ``shoal report`` counts every read once, and
pages that failed their checksum here, reported (``DROP``) so the worker refetches them.

One part of :class:`~shoal.client.aio.AsyncClient`, built on its router (the owners,
and the round trips that carry the reports); the router's ticker flushes it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from shoal.client.handover import touch_batches
from shoal.client.local import touches_due
from shoal.client.routing import EXTRA_OWNERS, Router
from shoal.core.types import Dataset
from shoal.errors import ShoalError
from shoal.proto.messages import DropRequest

log = logging.getLogger("shoal.client")


class HitBook:
    """The hits and bad pages of ``router``'s client, sent through ``router``."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.settings = router.settings
        self.cache = router.cache
        router.on_tick(self._tick)

    async def _tick(self) -> None:
        if self.cache.touch_log:
            await self.flush_touches()

    def flush_touches_maybe(self) -> None:
        """Start a flush on this loop when one is due."""
        if touches_due(self.cache):
            self.cache.touched_at = time.monotonic()
            asyncio.get_running_loop().create_task(self.flush_touches())

    def note_local_read(self, path: str, nbytes: int) -> None:
        """Count ``nbytes`` of ``path`` as a local cache hit that this client did not
        serve itself (a FUSE passthrough read: the kernel read the worker's data file).
        Cheap and batched like short-circuit hits: no I/O here, any thread; sent with
        the next flush of hits. Paths that name no known dataset are ignored."""
        if nbytes <= 0:
            return
        p = path[8:] if path.startswith("shoal://") else path
        name, _, key = p.lstrip("/").partition("/")
        c = self.cache
        hit = c.datasets.get(name)
        if hit is None or "/" not in key:
            return
        ds = hit[0]
        known = c.meta.get((name, key))
        version = known[0].version if known is not None else ""
        wid = self.local_owner(ds, key)
        if wid is None:
            return
        c.counters.short_circuit += 1
        c.counters.bytes_short_circuit += nbytes
        c.touch_log.append((wid, name, key, version, 1 if version else 0, nbytes))

    def local_owner(self, ds: Dataset, key: str) -> str | None:
        """The worker on this host that serves ``key``: its first local ring owner, else
        any worker on this host; None if none is known."""
        c = self.cache
        ring = c.ring
        if ring is not None:
            for wid in ring.owners(f"{ds.name}/{key}", ds.policy.replicas + EXTRA_OWNERS):
                w = c.workers.get(wid)
                if w is not None and self.router.is_local(w):
                    return wid
        for w in c.workers.values():
            if w.node == self.settings.node and w.uds:
                return w.id
        return None

    async def report_bad_pages(self) -> None:
        """Tell workers about located pages that failed their checksum here, so that they
        drop and refetch them before this read asks again."""
        bad, self.cache.bad_pages = self.cache.bad_pages, []
        for wid, (dsname, path, version, index) in bad:
            w = self.cache.workers.get(wid)
            if w is None:
                continue
            log.warning(
                "bad checksum on /%s/%s page %d from %s; refetching", dsname, path, index, wid
            )
            try:
                await self.router.send(w, DropRequest(dsname, path, version, index))
            except ShoalError as exc:
                log.debug("could not report corrupt page: %s", exc)

    async def flush_touches(self) -> None:
        """Tell workers about hits served from their descriptors (stats and recency)."""
        for wid, req in touch_batches(self.cache):
            w = self.cache.workers.get(wid)
            if w is None:
                continue
            try:
                await self.router.send(w, req)
            except ShoalError as exc:
                log.debug("touch to %s failed: %s", wid, exc)

"""How the client reaches workers: what it knows of the cluster (dataset definitions,
the ring and its epoch, kept fresh in the background), a file's owners in order,
suspects (workers that failed to answer, skipped for a while), connection pools per
worker and way in (Unix socket or TCP), and failover to the next owner, looking at the
ring once more when every known address failed (a worker restarted on another port).

One part of :class:`~shoal.client.aio.AsyncClient`: built on its
:class:`~shoal.client.control.ControlPlane` (the master's answers), used by the hit
book, the short circuit and the reads for every round trip to a worker (:meth:`Router.send`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable

from shoal.client.cache import ClientCache, WorkerAddr
from shoal.client.conn import Pool, R, Response, TimedOut
from shoal.client.control import ControlPlane
from shoal.client.handover import layout_moved
from shoal.client.local import EXTRA_OWNERS, TOUCH_EVERY
from shoal.config import ClientSettings, tls_ca_for
from shoal.core.ring import Ring
from shoal.core.tls import client_context
from shoal.core.types import Dataset, NsPath, split_path
from shoal.errors import ShoalError, Unavailable
from shoal.proto.messages import Request

log = logging.getLogger("shoal.client")

#: seconds a worker that failed to answer is skipped
SUSPECT_FOR = 5.0
#: a read that finds every owner unreachable looks at the ring again, at most this often
RING_RECHECK_EVERY = 1.0
#: seconds between log lines about one worker's failovers, or one dataset's fallbacks
#: to under storage (the others are counted in the next line)
FAILOVER_LOG_EVERY = 10.0

#: the background tasks of a parent's loop, inherited through fork: kept, never
#: destroyed in the child ("Task was destroyed but it is pending" otherwise)
_DISOWNED: list[asyncio.Task[None]] = []


class Router:
    """Definitions, ring, owners and the connections to them, over ``control``."""

    def __init__(self, settings: ClientSettings, cache: ClientCache, control: ControlPlane) -> None:
        self.settings = settings
        self.cache = cache
        self.control = control
        self._pools: dict[tuple[str, bool], Pool] = {}
        self._suspect: dict[str, float] = {}
        #: kind of warning -> (occurrences not yet logged, when its last line was written)
        self._warned: dict[str, tuple[int, float]] = {}
        self._refreshing: asyncio.Task[None] | None = None
        #: when a read whose owners were all unreachable last fetched the ring
        self._rechecked_at = -RING_RECHECK_EVERY
        self._ticker: asyncio.Task[None] | None = None
        #: what the ticker runs besides the refresh (the hit book's flush)
        self._on_tick: list[Callable[[], Awaitable[None]]] = []
        #: the event loop this client's connections and tasks belong to (its first)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ring_datasets_gen: int | None = None
        #: the master's datasets_generation at the last refresh of the definitions
        self._datasets_gen: int | None = None
        self.cache.refresh_every = settings.ring_refresh
        self._ca_ctx: ssl.SSLContext | None = None
        self._ca_loaded = False

    # -- datasets and the ring ---------------------------------------------------------

    async def dataset(self, name: str, refresh: bool = False) -> Dataset:
        hit = self.cache.datasets.get(name)
        if hit is not None and not refresh:
            if time.monotonic() - self.cache.checked_at > self.settings.ring_refresh:
                self.refresh_soon()
            return hit[0]
        try:
            ds = await self.control.fetch_dataset(name)
        except Unavailable:
            if hit is not None:
                return hit[0]  # the master is down: keep serving what we know
            raise
        now = time.monotonic()
        self.control.install(ds, now)
        if not self.cache.checked_at:
            self.cache.checked_at = now  # a new client: what it just fetched is fresh
        return ds

    async def resolve(self, path: str) -> tuple[Dataset, NsPath]:
        """The dataset of ``path`` and the path split in it."""
        np = split_path(path)
        if self.cache.ring is None and np.dataset not in self.cache.datasets:
            # a new client: learn the dataset and the ring in one round trip's time
            ds, _ = await asyncio.gather(self.dataset(np.dataset), self.ring())
            return ds, np
        return await self.dataset(np.dataset), np

    async def refresh_ring(self) -> Ring:
        ring, workers, self._ring_datasets_gen = await self.control.fetch_ring()
        c = self.cache
        if c.ring is None or ring.epoch >= c.ring.epoch:
            c.workers.update(workers)
            c.ring = ring
        c.ring_at = time.monotonic()
        return c.ring

    def refresh_soon(self) -> None:
        """Refresh the ring (and the definitions, when they changed) in the background."""
        if self._refreshing is not None and not self._refreshing.done():
            return

        async def refresh() -> None:
            try:
                await self.refresh_ring()
                gen = self._ring_datasets_gen
                if gen is None or gen != self._datasets_gen:
                    # a sync or policy change: new definitions drop what they invalidate
                    await self.control.datasets()
                    self._datasets_gen = gen
            except ShoalError as exc:
                log.debug("background refresh failed: %s", exc)
            finally:
                # tried: the short circuit serves on (a master that is down must not
                # send every read the slow way) until the next refresh is due
                self.cache.checked_at = time.monotonic()

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called off the loop: the next read's ring check refreshes
            return
        self._refreshing = loop.create_task(refresh())

    def on_tick(self, job: Callable[[], Awaitable[None]]) -> None:
        """Run ``job`` on every tick of the background ticker (see :meth:`_tick_soon`)."""
        self._on_tick.append(job)

    def _tick_soon(self) -> None:
        """Start the background ticker of this loop, once: every TOUCH_EVERY seconds it
        runs the ``on_tick`` jobs (the hit book sends buffered hits: the short
        circuit's and note_local_read's) and keeps the dataset definitions fresh, so
        that neither waits for a read on the slow path."""
        if self._ticker is None or self._ticker.done():
            self.loop = loop = asyncio.get_running_loop()
            self._ticker = loop.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TOUCH_EVERY)
            for job in self._on_tick:
                try:
                    await job()
                except Exception as exc:  # advisory: the next tick tries again
                    log.debug("background job failed: %s", exc)
            if time.monotonic() - self.cache.checked_at > self.settings.ring_refresh:
                self.refresh_soon()

    async def ring(self) -> Ring:
        """The ring this client routes by (fetched once; refreshed in the background)."""
        self._tick_soon()
        c = self.cache
        if c.ring is None:
            return await self.refresh_ring()
        if time.monotonic() - c.ring_at > self.settings.ring_refresh:
            self.refresh_soon()
        return c.ring

    def _saw_epoch(self, epoch: int) -> None:
        ring = self.cache.ring
        if ring is not None and epoch > ring.epoch:
            self.refresh_soon()

    # -- owners, pools, failover ---------------------------------------------------------

    async def owners(self, ds: Dataset, path: str) -> list[WorkerAddr]:
        """Workers to try for a file, in order: ring owners, then a few more for failover."""
        ring = await self.ring()
        ids = ring.owners(f"{ds.name}/{path}", ds.policy.replicas + EXTRA_OWNERS)
        addrs = [self.cache.workers[i] for i in ids if i in self.cache.workers]
        if ds.policy.placement == "local":
            addrs.sort(key=lambda w: w.node != self.settings.node)
        now = time.monotonic()
        healthy = [w for w in addrs if self._suspect.get(w.id, 0.0) <= now]
        return healthy + [w for w in addrs if w not in healthy]

    def is_local(self, w: WorkerAddr) -> bool:
        """Whether ``w`` is reached over its Unix socket (a worker on this host)."""
        return self.settings.short_circuit and bool(w.uds) and w.node == self.settings.node

    def _ca(self) -> ssl.SSLContext | None:
        """The context TLS workers are checked with (None: no CA), loaded once."""
        if not self._ca_loaded:
            self._ca_ctx = client_context(tls_ca_for(self.settings.tls_ca, self.settings.master))
            self._ca_loaded = True
        return self._ca_ctx

    def _pool(self, w: WorkerAddr, local: bool) -> Pool:
        key = (w.id, local)
        pool = self._pools.get(key)
        addr: str | tuple[str, int] = w.uds if local else (w.host, w.port)
        # TLS exactly to the workers that registered it (an older master's ring does not
        # say: then to every worker when the client has a CA); the Unix socket is plain.
        # A TLS worker and no CA: plain, refused in one line saying what to pass
        ctx = None if local or w.tls is False else self._ca()
        if pool is None or pool.address != addr or pool.tls is not ctx:
            pool = self._pools[key] = Pool(
                addr,
                self.settings.pool_size,
                self.settings.request_timeout,
                w.id,
                self.control.api.token or "",
                ctx,
            )
        return pool

    async def send(self, w: WorkerAddr, req: Request[R], want_fds: bool = False) -> Response[R]:
        """One request to ``w``: its Unix socket when local (TCP when that fails)."""
        local = self.is_local(w)
        try:
            resp = await self._pool(w, local).call(req, want_fds)
        except TimedOut:
            raise  # the worker itself does not answer: its TCP port will not either
        except Unavailable:
            if local:  # the socket file may be stale; TCP is the other way in
                resp = await self._pool(w, False).call(req)
            else:
                raise
        self._saw_epoch(resp.epoch)
        return resp

    async def with_failover(self, ds: Dataset, np: NsPath, req: Request[R]) -> Response[R]:
        """``req`` to the file's owners in turn until one answers."""
        last: ShoalError | None = None
        tried: dict[str, WorkerAddr] = {}
        since = time.monotonic()
        owners = await self.owners(ds, np.key_path)
        for again in (False, True):
            for w in owners:
                tried[w.id] = w
                try:
                    return await self.send(w, req)
                except Unavailable as exc:
                    self.mark_suspect(w, exc)
                    last = exc
            if again or last is None:
                break
            owners = await self.moved_owners(ds, np.key_path, tried, since)
        raise last or Unavailable("no live workers in the ring")

    async def moved_owners(
        self, ds: Dataset, key: str, tried: dict[str, WorkerAddr], since: float
    ) -> list[WorkerAddr]:
        """Every owner tried was unreachable: the ring may have moved since this client
        last looked (a worker restarted on another port, another one took over). Unless
        the ring was fetched after this read began (``since``), look now and return the
        owners not tried yet at their current address. A refresh already on its way is
        awaited, not repeated, and these lookups come at most every RING_RECHECK_EVERY
        seconds, so an outage does not send every read to the master."""
        now = time.monotonic()
        if self.cache.ring_at < since:
            try:
                if self._refreshing is not None and not self._refreshing.done():
                    await asyncio.shield(self._refreshing)
                elif now - self._rechecked_at >= RING_RECHECK_EVERY:
                    self._rechecked_at = now
                    await self.refresh_ring()
            except ShoalError as exc:
                log.debug("ring refresh after every owner failed: %s", exc)
                return []
        return [w for w in await self.owners(ds, key) if tried.get(w.id) != w]

    def mark_suspect(self, w: WorkerAddr, exc: Exception) -> None:
        """``w`` failed to answer: skip it for SUSPECT_FOR seconds, look at the ring."""
        now = time.monotonic()
        self._suspect[w.id] = now + SUSPECT_FOR
        self.cache.counters.failovers += 1
        self.warn(
            f"failover {w.id}", "worker %s unavailable (%s); trying the next owner", w.id, exc
        )
        self.refresh_soon()

    def warn(self, kind: str, fmt: str, *args: object) -> None:
        """A warning that can come once per read (a failover, a fallback): the first of
        its kind at once, then at most one line per FAILOVER_LOG_EVERY with the count of
        the ones not shown (the last one's details)."""
        now = time.monotonic()
        n, since = self._warned.get(kind, (0, -FAILOVER_LOG_EVERY))
        n += 1
        if now - since >= FAILOVER_LOG_EVERY:
            if n > 1:
                fmt += " (%d times in %.0fs)"
                args = (*args, n, min(now - since, FAILOVER_LOG_EVERY))
            log.warning(fmt, *args)
            self._warned[kind] = (0, now)
        else:
            self._warned[kind] = (n, since)

    def layout_moved(self, ds: Dataset) -> bool:
        """Whether the dataset's page layout changed since ``ds`` was read (a reply in
        the old layout must not be installed next to the new one)."""
        return layout_moved(self.cache, ds)

    def close(self) -> None:
        """Close the connections and stop the background tasks."""
        self._close_pools()
        for task in (self._refreshing, self._ticker):
            if task is not None:
                task.cancel()

    def abandon(self) -> None:
        """Drop loop-bound resources without touching the loop (after fork)."""
        self._close_pools()
        _DISOWNED.extend(t for t in (self._refreshing, self._ticker) if t is not None)
        self._refreshing = None
        self._ticker = None

    def _close_pools(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

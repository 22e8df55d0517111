"""The client's side of the master's HTTP API: datasets, jobs, manifests, report.

One part of :class:`~shoal.client.aio.AsyncClient`, owned by it and handed to the
router (:mod:`shoal.client.routing`), which decides how definitions are cached; this
part owns the HTTP session. Nothing here is on the read path except the dataset and
ring lookups a new client makes.
"""

from __future__ import annotations

import os
import time
import weakref
from typing import TYPE_CHECKING, Any

from shoal.client.bootstrap import parse_ring
from shoal.client.cache import ClientCache, WorkerAddr
from shoal.config import ClientSettings, tls_ca_for
from shoal.core.manifest import Manifest
from shoal.core.ring import Ring
from shoal.core.tls import client_context
from shoal.core.types import NEVER, Dataset, Mount
from shoal.errors import ShoalError, Unavailable
from shoal.proto.lighthttp import LightHTTP
from shoal.proto.master_api import MasterAPI

if TYPE_CHECKING:
    import aiohttp


class ControlPlane:
    """Master calls through one :class:`~shoal.proto.master_api.MasterAPI`: GETs (all
    a reader sends) over a :class:`~shoal.proto.lighthttp.LightHTTP`, the rest over
    one aiohttp session, imported and created on first use (again after it was
    closed)."""

    def __init__(self, settings: ClientSettings, cache: ClientCache) -> None:
        self.settings = settings
        self.cache = cache
        self._http: aiohttp.ClientSession | None = None
        # the session's timeouts; https checked with the CA MasterAPI uses (one context)
        ca = client_context(tls_ca_for(settings.tls_ca, settings.master))
        self._light = LightHTTP(ca, total=30, connect=5)
        self.api = MasterAPI(
            settings.master,
            self._session,
            token=settings.token,
            tls_ca=settings.tls_ca,
            light=self._light,
        )
        _LIVE.add(self)

    def _session(self) -> aiohttp.ClientSession:
        import aiohttp  # only for what is not a GET: jobs, writes, dataset admin

        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30, connect=5))
        return self._http

    async def fetch_dataset(self, name: str) -> Dataset:
        """The dataset's definition from the master (no caching here)."""
        return Dataset.from_dict(dict(await self.api.dataset(name)))

    async def fetch_ring(self) -> tuple[Ring, dict[str, WorkerAddr], int | None]:
        """The master's ring, its workers' addresses and the datasets generation it
        was answered at (None from a master that does not say)."""
        return parse_ring(await self.api.ring())

    async def create_dataset(
        self, name: str, mounts: list[Mount], options: dict[str, str] | None = None
    ) -> Dataset:
        from shoal.core.types import CachePolicy

        ds = Dataset(name, tuple(mounts), CachePolicy().with_options(options or {}))
        return Dataset.from_dict(dict(await self.api.create_dataset(ds.to_dict())))

    async def update_dataset(self, name: str, options: dict[str, str]) -> Dataset:
        current = await self.fetch_dataset(name)
        self.install(current, time.monotonic())
        policy = current.policy.with_options(options)
        return Dataset.from_dict(dict(await self.api.update_dataset(name, policy.to_dict())))

    async def delete_dataset(self, name: str) -> None:
        await self.api.delete_dataset(name)
        self.cache.datasets.pop(name, None)

    async def datasets(self) -> list[Dataset]:
        out = [Dataset.from_dict(dict(d)) for d in await self.api.datasets()]
        now = time.monotonic()
        for ds in out:
            self.install(ds, now)
        return out

    def install(self, ds: Dataset, now: float) -> None:
        """Keep a definition fetched at ``now``; a new generation drops what it may
        have made stale."""
        old = self.cache.datasets.get(ds.name)
        if old is not None and old[0].generation != ds.generation:
            self.cache.forget_dataset(ds.name)  # a sync or policy change: metadata may be stale
        self.cache.datasets[ds.name] = (ds, now)

    # -- jobs -----------------------------------------------------------------------

    async def submit_job(self, spec: dict[str, Any], schedule: str | None = None) -> dict[str, Any]:
        return await self.api.submit_job(spec, schedule)

    async def jobs(self) -> dict[str, Any]:
        return await self.api.jobs()

    async def job(self, job_id: str, wait: float = 0.0) -> dict[str, Any]:
        return await self.api.job(job_id, wait)

    async def stop_job(self, job_id: str) -> dict[str, Any]:
        return await self.api.stop_job(job_id)

    async def resume_job(self, job_id: str) -> dict[str, Any]:
        return await self.api.resume_job(job_id)

    async def manifest(self, ds: Dataset) -> Manifest | None:
        """The dataset's manifest (fetched once per manifest id), if it has one within
        its staleness bound."""
        if not ds.manifest:
            return None
        hit = self.cache.manifests.get(ds.name)
        if hit is None or hit[0] != ds.manifest:
            try:
                got = await self.api.manifest(ds.name)
            except Unavailable:
                # the master is down: serve on with the manifest we have, if any
                return hit[1] if hit is not None else None
            except ShoalError:
                return None  # no usable manifest: reads look in under storage instead
            if got is None:
                return None
            hit = self.cache.manifests[ds.name] = (got[0] or ds.manifest, got[1])
        man = hit[1]
        bound = ds.policy.staleness
        if bound != NEVER and time.time() - man.built_at > bound:
            return None
        return man

    async def report(self) -> dict[str, Any]:
        return dict(await self.api.report())

    async def watch(self, since: int, timeout: float, watcher: str) -> int:
        """Long-poll the master until its datasets generation is above ``since`` (or
        ``timeout`` seconds, at most 60, have passed) and return it. Polling again with
        the returned generation acknowledges that this watcher has applied the change:
        see the contract in :mod:`shoal.proto.control`."""
        return await self.api.watch(since, timeout, watcher)

    async def health(self) -> dict[str, Any]:
        return dict(await self.api.health())

    async def close(self) -> None:
        await self._light.close()
        if self._http is not None:
            await self._http.close()

    def abandon(self) -> None:
        """Forget the connections without touching their loop (after fork: the parent's)."""
        self._light.abandon()
        http, self._http = self._http, None
        if http is not None:
            _disown(http)


#: sessions inherited through fork, kept so that no finalizer ever runs on them
_DISOWNED: list[Any] = []
#: every ControlPlane of this process (a forked child disowns their sessions at once)
_LIVE: weakref.WeakSet[ControlPlane] = weakref.WeakSet()


def _disown_all() -> None:
    """In a forked child: every session is the parent's. Disowned now, not at the
    client's next use, so a child that never uses an inherited client (a DataLoader
    worker of a process holding one) exits without the aiohttp noise."""
    for c in list(_LIVE):
        c.abandon()


os.register_at_fork(after_in_child=_disown_all)


def _disown(http: Any) -> None:
    """Forget an aiohttp session that belongs to another process's event loop (the
    parent's, after fork) without the "Unclosed client session" / "Unclosed connector"
    noise its finalizers print: its connections are the parent's, so closing them here
    is not ours to do, and the loop they need does not run in this process."""
    try:
        connector = http.connector
        http.detach()  # the session is closed; the connector is left alone
    except Exception:  # an aiohttp without these: the worst is a warning at exit
        return
    if connector is not None:
        connector._closed = True  # its finalizer must not close the parent's sockets
        _DISOWNED.append(connector)

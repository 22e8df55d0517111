"""The client's side of the master's HTTP API: datasets, jobs, manifests, report.

Kept apart from :class:`~shoal.client.aio.AsyncClient` (the data path), which builds on
it; nothing here is on the read path except the dataset lookups a new client makes.
"""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from shoal.client.cache import ClientCache
from shoal.config import ClientSettings
from shoal.core.manifest import Manifest
from shoal.core.types import NEVER, Dataset, Mount
from shoal.errors import ProtocolError, Unavailable, from_code
from shoal.proto import control as api
from shoal.proto.control import WATCH, WATCH_MAX_TIMEOUT


class ControlPlane:
    """Master calls over one aiohttp session (created on first use)."""

    def __init__(self, settings: ClientSettings, cache: ClientCache) -> None:
        self.settings = settings
        self.cache = cache
        self._http: aiohttp.ClientSession | None = None

    async def dataset(self, name: str, refresh: bool = False) -> Dataset:
        raise NotImplementedError  # the data path decides how datasets are cached

    async def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30, connect=5))
        return self._http

    async def _master(self, method: str, path: str, body: Any = None) -> Any:
        http = await self._session()
        url = self.settings.master + path
        try:
            async with http.request(method, url, json=body) as r:
                status, reason = r.status, r.reason
                raw = await r.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise Unavailable(f"master at {self.settings.master} unreachable: {exc}") from None
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            raise ProtocolError(f"master at {self.settings.master} sent non-JSON") from None
        if status >= 400:
            err = data.get("error", {}) if isinstance(data, dict) else {}
            raise from_code(str(err.get("code", "io")), str(err.get("message", reason)))
        return data

    async def create_dataset(
        self, name: str, mounts: list[Mount], options: dict[str, str] | None = None
    ) -> Dataset:
        from shoal.core.types import CachePolicy

        ds = Dataset(name, tuple(mounts), CachePolicy().with_options(options or {}))
        return Dataset.from_dict(await self._master("POST", api.DATASETS, ds.to_dict()))

    async def update_dataset(self, name: str, options: dict[str, str]) -> Dataset:
        current = await self.dataset(name, refresh=True)
        policy = current.policy.with_options(options)
        d = await self._master("PATCH", api.dataset_path(name), {"policy": policy.to_dict()})
        return Dataset.from_dict(d)

    async def delete_dataset(self, name: str) -> None:
        await self._master("DELETE", api.dataset_path(name))
        self.cache.datasets.pop(name, None)

    async def datasets(self) -> list[Dataset]:
        data = await self._master("GET", api.DATASETS)
        out = [Dataset.from_dict(d) for d in data["datasets"]]
        now = time.monotonic()
        for ds in out:
            self._install(ds, now)
        return out

    def _install(self, ds: Dataset, now: float) -> None:
        old = self.cache.datasets.get(ds.name)
        if old is not None and old[0].generation != ds.generation:
            self.cache.forget_dataset(ds.name)  # a sync or policy change: metadata may be stale
        self.cache.datasets[ds.name] = (ds, now)

    # -- jobs -----------------------------------------------------------------------

    async def submit_job(self, spec: dict[str, Any], schedule: str | None = None) -> dict[str, Any]:
        body = {"spec": spec, "schedule": schedule}
        return await self._master("POST", api.JOBS, body)

    async def jobs(self) -> dict[str, Any]:
        return await self._master("GET", api.JOBS)

    async def job(self, job_id: str) -> dict[str, Any]:
        return await self._master("GET", api.job_path(job_id))

    async def stop_job(self, job_id: str) -> dict[str, Any]:
        return await self._master("POST", api.job_path(job_id, "stop"))

    async def resume_job(self, job_id: str) -> dict[str, Any]:
        return await self._master("POST", api.job_path(job_id, "resume"))

    async def manifest(self, ds: Dataset) -> Manifest | None:
        """The dataset's manifest (fetched once per manifest id), if it has one within
        its staleness bound."""
        if not ds.manifest:
            return None
        hit = self.cache.manifests.get(ds.name)
        if hit is None or hit[0] != ds.manifest:
            http = await self._session()
            url = f"{self.settings.master}{api.dataset_path(ds.name)}/manifest"
            try:
                async with http.get(url) as r:
                    if r.status != 200:
                        return None
                    raw = await r.read()
                    mid = r.headers.get("X-Shoal-Manifest", ds.manifest)
            except (aiohttp.ClientError, OSError, TimeoutError):
                return hit[1] if hit is not None else None
            hit = self.cache.manifests[ds.name] = (mid, Manifest.from_bytes(raw))
        man = hit[1]
        bound = ds.policy.staleness
        if bound != NEVER and time.time() - man.built_at > bound:
            return None
        return man

    async def report(self) -> dict[str, Any]:
        return await self._master("GET", api.REPORT)

    async def watch(self, since: int, timeout: float, watcher: str) -> int:
        """Long-poll the master until its datasets generation is above ``since`` (or
        ``timeout`` seconds, at most 60, have passed) and return it. Polling again with
        the returned generation acknowledges that this watcher has applied the change:
        see the contract in :mod:`shoal.proto.control`."""
        http = await self._session()
        wait = min(max(0.0, timeout), WATCH_MAX_TIMEOUT)
        params = {"since": str(int(since)), "timeout": repr(wait), "watcher": watcher}
        try:
            async with http.get(
                self.settings.master + WATCH,
                params=params,
                # the poll is held open on purpose: longer than the session's default
                timeout=aiohttp.ClientTimeout(total=wait + 15, connect=5),
            ) as r:
                status, reason = r.status, r.reason
                raw = await r.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise Unavailable(f"master at {self.settings.master} unreachable: {exc}") from None
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            raise ProtocolError(f"master at {self.settings.master} sent non-JSON") from None
        if status >= 400:
            err = data.get("error", {}) if isinstance(data, dict) else {}
            raise from_code(str(err.get("code", "io")), str(err.get("message", reason)))
        if not isinstance(data, dict) or not isinstance(data.get("datasets_generation"), int):
            raise ProtocolError("master sent a watch answer without datasets_generation")
        return int(data["datasets_generation"])

    async def health(self) -> dict[str, Any]:
        return await self._master("GET", api.HEALTH)

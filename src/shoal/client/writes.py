"""Write-through of whole objects to a dataset's under storage, then making the new
version visible through the cache.

shoal caches datasets that are mostly immutable; the writes it has are checkpoints and
similar whole objects that front-ends (the S3 gateway) pass through. A write goes:

1. the bytes (a local spool file) to the mount's under store, through its fsspec
   filesystem (``put_file``: the driver chooses single or multipart upload);
2. a ``sync`` job of exactly that key, run by the master and the key's workers, and
   awaited: the manifest and every worker drop the old version (without it they
   would serve the old ETag for up to the dataset's staleness bound);
3. the key forgotten in this client's metadata cache and the dataset definition
   (with its new manifest id) fetched again, so the next read here is the new bytes.

Step 2 is most of a write's cost beyond the upload (a job round trip, about tens of
milliseconds on an idle local cluster; see docs/gateways.md): the writer long-polls the
master for the job's end (``GET /api/v1/jobs/{id}?wait=S``), so it learns of it when it
happens rather than at its next poll. With a manifest the next listing or stat fetches
the new manifest once.

Writes go only to drivers built on fsspec (s3, file, webhdfs and the generic one);
another driver is an InvalidArgument naming its scheme.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from shoal.core.jobs import ENDED
from shoal.core.types import FileInfo, Mount, split_path
from shoal.errors import (
    InvalidArgument,
    IsADirectory,
    NotFound,
    ShoalError,
    StoreError,
    Unavailable,
)
from shoal.ufs.fsspec_driver import FsspecStore
from shoal.ufs.registry import open_store

if TYPE_CHECKING:
    from shoal.client.aio import AsyncClient

__all__ = ["SYNC_TIMEOUT", "Writer"]

log = logging.getLogger("shoal.client.writes")

#: seconds a write waits for its sync job before it is reported as failed
SYNC_TIMEOUT = 120.0
#: deletes of one DeleteObjects request in flight at once
DELETE_CONCURRENCY = 16
#: seconds the master holds one wait for a job's end
_WAIT = 10.0


class Writer:
    """Writes through one AsyncClient; keeps one under store per mount."""

    def __init__(self, client: AsyncClient, sync_timeout: float = SYNC_TIMEOUT) -> None:
        self.client = client
        self.sync_timeout = sync_timeout
        self._stores: dict[tuple[str, str, str], FsspecStore] = {}
        #: seconds spent in the last write's upload and sync (for metrics and docs)
        self.last_upload_s = 0.0
        self.last_sync_s = 0.0

    async def _store(self, path: str) -> tuple[str, str, FsspecStore]:
        np = split_path(path)
        if not np.rel:
            raise IsADirectory(f"{np}: a write needs /<dataset>/<mount>/<path>")
        ds = await self.client.dataset(np.dataset)
        mount: Mount = ds.mount(np.mount)
        key = (ds.name, mount.name, mount.uri)
        store = self._stores.get(key)
        if store is None:
            opened = open_store(mount)
            if not isinstance(opened, FsspecStore):
                raise InvalidArgument(f"mount {mount.name}: writes need an fsspec-based store")
            store = self._stores[key] = opened
        return ds.name, np.key_path, store

    async def put_file(self, path: str, local: str) -> FileInfo:
        """Upload the local file ``local`` as ``path`` ('/<dataset>/<mount>/<rel>') and
        return the new version's FileInfo once reads through the cache see it."""
        ds, key, store = await self._store(path)
        rel = key.partition("/")[2]
        t0 = time.monotonic()
        await store._fs_call(rel, "put_file", local, store._full(rel))
        self.last_upload_s = time.monotonic() - t0
        info = await self._publish(ds, [key], path)
        log.debug(
            "wrote /%s/%s: upload %.3fs, sync %.3fs", ds, key, self.last_upload_s, self.last_sync_s
        )
        return info

    async def delete(self, path: str) -> None:
        """Remove ``path`` from under storage (a missing one is not an error)."""
        ds, key, store = await self._store(path)
        await self._remove(store, key)
        await self._publish(ds, [key])

    async def delete_many(self, paths: list[str]) -> dict[str, ShoalError | None]:
        """Remove several paths of one dataset from under storage (missing ones are not
        errors), then make it visible with one sync job for all of them. Each path's
        outcome: None (gone) or the error that kept it. The paths go out
        :data:`DELETE_CONCURRENCY` at a time."""
        out: dict[str, ShoalError | None] = {}
        gone: dict[str, list[str]] = {}
        slots = asyncio.Semaphore(DELETE_CONCURRENCY)

        async def one(path: str) -> None:
            async with slots:
                try:
                    ds, key, store = await self._store(path)
                    await self._remove(store, key)
                except ShoalError as exc:
                    out[path] = exc
                else:
                    out[path] = None
                    gone.setdefault(ds, []).append(key)

        await asyncio.gather(*(one(p) for p in dict.fromkeys(paths)))
        for ds, keys in gone.items():
            await self._publish(ds, keys)
        return out

    @staticmethod
    async def _remove(store: FsspecStore, key: str) -> None:
        rel = key.partition("/")[2]
        try:
            await store._fs_call(rel, "rm_file", store._full(rel))
        except NotFound:
            pass

    async def _publish(self, ds: str, keys: list[str], path: str | None = None) -> FileInfo:
        """Sync exactly ``keys`` and forget them here; the new FileInfo of ``path`` (the
        one key written), or an empty one after deletes."""
        t0 = time.monotonic()
        view = await self.client.submit_job({"kind": "sync", "dataset": ds, "files": keys})
        # after a delete the file is "missing" in under storage: the job counts it as
        # failed, yet it has dropped it from the manifest and the workers
        await self._wait(str(view["id"]), view, gone_ok=path is None)
        for key in keys:
            self.client.cache.forget(ds, key)
        await self.client.dataset(ds, refresh=True)
        self.last_sync_s = time.monotonic() - t0
        if path is None:
            return FileInfo(keys[0] if keys else "", 0, "")
        return await self.client.stat(path)

    async def _wait(self, job_id: str, view: dict[str, Any], gone_ok: bool) -> None:
        deadline = time.monotonic() + self.sync_timeout
        while view.get("state") not in ENDED:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unavailable(f"sync job {job_id} did not finish in {self.sync_timeout:.0f}s")
            view = await self.client.job(job_id, wait=min(left, _WAIT))
        if gone_ok and view.get("state") in ("done", "failed"):
            return
        if view.get("state") != "done" or view.get("files_failed"):
            raise StoreError(f"sync job {job_id} after the write ended {view.get('state')}")

    async def close(self) -> None:
        stores, self._stores = list(self._stores.values()), {}
        for s in stores:
            await s.close()

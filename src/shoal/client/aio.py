"""AsyncClient: the implementation of the client library.

A read goes: dataset definition and file metadata from the local cache (no master, no
worker round trip within the staleness bound) -> the file's owners on the ring -> the
first owner that answers. A worker on this host is asked over its Unix socket for the
*location* of the pages (LOCATE) and hands over descriptors; later reads of those pages
are a ``pread`` in the caller's process. Every page is checked against its checksum. A
dead worker is skipped for a while and the next owner tried; when no owner can serve,
the read falls back to under storage, counted and logged, for classified errors only.

AsyncClient is a facade over parts that it builds and owns, each handed what it uses:
:class:`~shoal.client.control.ControlPlane` (the master's API; owns the HTTP session),
:class:`~shoal.client.routing.Router` (definitions, ring, owners, suspects, pools,
failover; over the control plane), :class:`~shoal.client.hits.HitBook` (TOUCH and DROP
reports; over the router), :class:`~shoal.client.shortcircuit.ShortCircuit` (LOCATE,
LOCATE_DIR, located reads, ``read_fast``; over the router and hit book) and
:class:`~shoal.client.meta.Metadata` (``stat``, ``ls``); :mod:`~shoal.client.batch` is
``cat_many``. Here: the reads that tie them together and the counted fallback to under
storage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import xxhash

from shoal.client import batch, wholefile
from shoal.client.ahead import AHEAD, Ahead
from shoal.client.cache import ClientCache, WorkerAddr
from shoal.client.control import ControlPlane
from shoal.client.hits import HitBook
from shoal.client.local import read_located, stat_path
from shoal.client.meta import Metadata
from shoal.client.routing import FAILOVER_LOG_EVERY, RING_RECHECK_EVERY, SUSPECT_FOR, Router
from shoal.client.shortcircuit import DATASET_LOCATE_AFTER, LOCATE_AHEAD, ShortCircuit
from shoal.config import ClientSettings
from shoal.core.manifest import Manifest
from shoal.core.ring import Ring
from shoal.core.types import Dataset, FileInfo, Mount, NsPath, split_path
from shoal.errors import (
    CorruptData,
    DatasetNotFound,
    IsADirectory,
    NotFound,
    PathOutsideDataset,
    ShoalError,
    StaleLayout,
    StaleVersion,
    Unavailable,
)
from shoal.proto.master_api import MasterAPI
from shoal.proto.messages import DropRequest, ReadRequest

if TYPE_CHECKING:
    from shoal.ufs.base import UnderStore

log = logging.getLogger("shoal.client")


class AsyncClient:
    """The client: reads, metadata and the master's API over its parts."""

    def __init__(self, settings: ClientSettings, cache: ClientCache | None = None) -> None:
        self.settings = settings
        self.cache = cache if cache is not None else ClientCache()
        self.control = ControlPlane(settings, self.cache)
        self.router = Router(settings, self.cache, self.control)
        self.hits = HitBook(self.router)
        self.short = ShortCircuit(self.router, self.hits)
        self.meta = Metadata(self.router, self.control)
        self._ufs: dict[tuple[str, str], UnderStore] = {}
        #: sequential readers over TCP (shoal.client.ahead)
        self._ahead = Ahead(self.cache)

    @property
    def api(self) -> MasterAPI:
        """The master's API."""
        return self.control.api

    # -- the master's API (the control plane) and the cluster (the router) -------------

    async def dataset(self, name: str, refresh: bool = False) -> Dataset:
        """A dataset's definition: cached, or from the master (``refresh``: always)."""
        return await self.router.dataset(name, refresh)

    async def datasets(self) -> list[Dataset]:
        return await self.control.datasets()

    async def fetch_dataset(self, name: str) -> Dataset:
        return await self.control.fetch_dataset(name)

    async def create_dataset(
        self, name: str, mounts: list[Mount], options: dict[str, str] | None = None
    ) -> Dataset:
        return await self.control.create_dataset(name, mounts, options)

    async def update_dataset(self, name: str, options: dict[str, str]) -> Dataset:
        return await self.control.update_dataset(name, options)

    async def delete_dataset(self, name: str) -> None:
        await self.control.delete_dataset(name)

    async def manifest(self, ds: Dataset) -> Manifest | None:
        return await self.control.manifest(ds)

    async def submit_job(self, spec: dict[str, Any], schedule: str | None = None) -> dict[str, Any]:
        return await self.control.submit_job(spec, schedule)

    async def jobs(self) -> dict[str, Any]:
        return await self.control.jobs()

    async def job(self, job_id: str, wait: float = 0.0) -> dict[str, Any]:
        """A job's view; with ``wait``, once it has ended or after ``wait`` seconds."""
        return await self.control.job(job_id, wait)

    async def stop_job(self, job_id: str) -> dict[str, Any]:
        return await self.control.stop_job(job_id)

    async def resume_job(self, job_id: str) -> dict[str, Any]:
        return await self.control.resume_job(job_id)

    async def report(self) -> dict[str, Any]:
        return await self.control.report()

    async def watch(self, since: int, timeout: float, watcher: str) -> int:
        """See :meth:`ControlPlane.watch <shoal.client.control.ControlPlane.watch>`."""
        return await self.control.watch(since, timeout, watcher)

    async def health(self) -> dict[str, Any]:
        return await self.control.health()

    async def fetch_ring(self) -> tuple[Ring, dict[str, WorkerAddr], int | None]:
        return await self.control.fetch_ring()

    async def refresh_ring(self) -> Ring:
        return await self.router.refresh_ring()

    async def owners(self, ds: Dataset, path: str) -> list[WorkerAddr]:
        """Workers to try for a file, in order: ring owners, then a few more for failover."""
        return await self.router.owners(ds, path)

    def is_local(self, w: WorkerAddr) -> bool:
        return self.router.is_local(w)

    # -- hits and the short circuit -----------------------------------------------------

    def note_local_read(self, path: str, nbytes: int) -> None:
        """See :meth:`HitBook.note_local_read <shoal.client.hits.HitBook.note_local_read>`."""
        self.hits.note_local_read(path, nbytes)

    async def flush_touches(self) -> None:
        """Tell workers about hits served from their descriptors (stats and recency)."""
        await self.hits.flush_touches()

    def read_fast(self, path: str, offset: int = 0, length: int = -1) -> bytes | None:
        """See :meth:`ShortCircuit.read_fast <shoal.client.shortcircuit.ShortCircuit.read_fast>`."""
        return self.short.read_fast(path, offset, length)

    # -- metadata -------------------------------------------------------------------

    async def stat(self, path: str) -> FileInfo:
        return await self.meta.stat(path)

    def stat_fast(self, path: str) -> FileInfo | None:
        """The zero-round-trip stat: what :meth:`stat` would answer from this process's
        metadata cache or the dataset's manifest, on any thread; else None (then
        ``await stat(...)``). See :func:`shoal.client.local.stat_path`."""
        return stat_path(self.cache, path)

    async def ls(self, path: str) -> list[FileInfo]:
        return await self.meta.ls(path)

    # -- data -----------------------------------------------------------------------

    async def cat(self, path: str) -> bytes:
        return await self.read(path, 0, -1)

    async def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        """Bytes [offset, offset+length) of a file (length -1: to the end).

        Never a short read: what is returned has the length the file's size and the range
        imply, or an error is raised. A worker that serves another page layout (the
        dataset's page size changed) answers StaleLayout: the dataset is refreshed and
        the read tried once more in the new layout."""
        ds, np = await self.router.resolve(path)
        if not np.rel:
            raise IsADirectory(str(np))
        ds.mount(np.mount)
        fast = read_located(self.cache, ds, np.key_path, offset, length)
        if fast is not None:
            self.hits.flush_touches_maybe()
            return fast
        await self.hits.report_bad_pages()
        ahead, key = self._ahead, np.key_path
        got = ahead.take(ds, key, offset, length)
        if got is not None:
            return got
        ask = length
        if ahead.wanted(ds, key, offset, length) and not self._served_here(ds, key):
            ask = AHEAD  # a sequential reader over TCP: one request for the next reads
        ahead.begin(ds, key)
        try:
            data = await self._read_laid_out(ds, np, offset, ask)
        finally:
            ahead.end(ds, key, offset, length)
        if ask == length or len(data) <= length:
            return data
        ahead.keep(ds, key, offset, data)
        return data[:length]

    async def _read_laid_out(self, ds: Dataset, np: NsPath, offset: int, length: int) -> bytes:
        try:
            return await self._read(ds, np, offset, length, False)
        except StaleLayout:
            ds = await self.dataset(ds.name, refresh=True)
            ds.mount(np.mount)
            return await self._read(ds, np, offset, length, True)

    def _served_here(self, ds: Dataset, key: str) -> bool:
        """Whether a worker on this host owns ``key`` (its reads are preads here)."""
        return self.hits.local_owner(ds, key) is not None and self.settings.short_circuit

    def read_ahead_fast(self, path: str, offset: int, length: int) -> bytes | None:
        """What a sequential reader's next read finds read ahead, on any thread (the sync
        client's caller's: no hop to the loop); None: ask :meth:`read`."""
        try:
            np = split_path(path)
        except ShoalError:
            return None
        hit = self.cache.datasets.get(np.dataset)
        if hit is None or not np.rel:
            return None
        return self._ahead.take(hit[0], np.key_path, offset, length)

    async def _read(
        self, ds: Dataset, np: NsPath, offset: int, length: int, refreshed: bool
    ) -> bytes:
        last: ShoalError | None = None
        tried: dict[str, WorkerAddr] = {}
        since = time.monotonic()
        owners = await self.router.owners(ds, np.key_path)
        for again in (False, True):
            for w in owners:
                tried[w.id] = w
                for _attempt in range(3):
                    try:
                        return await self._read_from(w, ds, np.key_path, offset, length)
                    except StaleVersion:
                        self.cache.forget(ds.name, np.key_path)
                    except CorruptData as exc:
                        last = exc
                    except StaleLayout as exc:
                        if not refreshed:
                            raise
                        last = exc  # this worker has not caught up: the next one may have
                        break
                    except Unavailable as exc:
                        self.router.mark_suspect(w, exc)
                        last = exc
                        break
            if again or not isinstance(last, Unavailable):
                break
            owners = await self.router.moved_owners(ds, np.key_path, tried, since)
        if isinstance(last, Unavailable | CorruptData | StaleLayout) or last is None:
            return await self._fallback(ds, np, offset, length, last)
        raise last

    async def _read_from(
        self, w: WorkerAddr, ds: Dataset, path: str, offset: int, length: int
    ) -> bytes:
        info = self.cache.info(ds, path)
        version = info.version if info is not None else None
        local = self.router.is_local(w)
        if local:
            data, version = await self.short.read_local(w, ds, path, offset, length, version)
            if data is not None:
                return data
        ps = ds.policy.page_size
        req = ReadRequest(ds.name, path, offset, length, version, ps, ds.generation)
        resp = await self.router.send(w, req)
        m = resp.reply
        if self.router.layout_moved(ds):
            raise StaleLayout(f"/{ds.name}: the page size changed during the read")
        self.cache.remember(ds.name, FileInfo(path, m.size, m.version, m.mtime))
        view = memoryview(resp.data)
        pos = 0
        for i, (n, ck) in enumerate(m.pages):
            if len(view[pos : pos + n]) != n or xxhash.xxh3_64_intdigest(view[pos : pos + n]) != ck:
                await self._report_corrupt(w, ds, path, m.version, m.first + i)
            pos += n
        c = self.cache.counters
        if local:
            c.local += 1
            c.bytes_local += len(resp.data)
        else:
            c.remote += 1
            c.bytes_remote += len(resp.data)
        out = _slice(resp.data, m.first, ps, offset, length)
        want = _expected_len(m.size, offset, length)
        if pos != len(resp.data) or len(out) != want:
            # a reply that does not cover the range in this layout is never returned
            raise CorruptData(
                f"/{ds.name}/{path}: worker {w.id} returned {len(out)} bytes for a range of {want}"
            )
        return out

    async def _report_corrupt(
        self, w: WorkerAddr, ds: Dataset, path: str, version: str, index: int
    ) -> None:
        self.cache.counters.corrupt += 1
        self.cache.locs.pop((ds.name, path, version, index), None)
        self.cache.runs.pop((ds.name, path, version), None)
        log.warning(
            "bad checksum on /%s/%s page %d from %s; refetching", ds.name, path, index, w.id
        )
        try:
            await self.router.send(w, DropRequest(ds.name, path, version, index))
        except ShoalError as exc:
            log.debug("could not report corrupt page: %s", exc)
        raise CorruptData(f"/{ds.name}/{path} page {index} failed its checksum")

    async def _fallback(
        self, ds: Dataset, np: NsPath, offset: int, length: int, cause: ShoalError | None
    ) -> bytes:
        if not self.settings.ufs_fallback:
            raise cause or Unavailable("no worker can serve the read")
        key = (ds.name, np.mount)
        ufs = self._ufs.get(key)
        if ufs is None:
            # here, not at the top: shoal.ufs imports aiohttp and the fsspec drivers,
            # which a reader that never falls back should not pay for at its first read
            from shoal.ufs.registry import open_store

            ufs = self._ufs[key] = open_store(ds.mount(np.mount))
        c = self.cache.counters
        c.ufs_fallback += 1
        why = cause.code if cause is not None else "no_worker"
        c.fallback_causes[why] = c.fallback_causes.get(why, 0) + 1
        self.router.warn(
            f"fallback {ds.name}",
            "no worker could serve %s (%s); reading under storage directly",
            np,
            cause,
        )
        info = await ufs.info(np.rel)
        end = info.size if length < 0 else min(info.size, offset + length)
        data = await ufs.read(np.rel, offset, end) if end > offset else b""
        want = _expected_len(info.size, offset, length)
        if len(data) != want:
            raise StaleVersion(f"{np}: under storage returned {len(data)} of {want} bytes")
        c.bytes_ufs += len(data)
        return data

    async def open_local(self, path: str, load: bool = True) -> tuple[int, FileInfo] | None:
        """A new descriptor holding the whole file at offset 0, when a worker on this
        host has every page of it in one data file (a complete large file); else None.
        With ``load=False`` the worker answers from its cache only and never fetches.
        The caller owns (and closes) the descriptor. For FUSE passthrough and mmap."""
        return await wholefile.open_local(self, path, load)

    async def open_local_dir(self, path: str) -> dict[str, tuple[int, FileInfo]]:
        """What :meth:`open_local` (``load=False``) would hand over for each file of
        directory ``path``, in one round trip per local worker: by namespace path. The
        caller owns every descriptor. See :mod:`shoal.client.wholefile`."""
        return await wholefile.open_local_dir(self, path)

    async def cat_many(self, paths: Iterable[str]) -> dict[str, bytes | ShoalError]:
        """Whole files, batched: one request per worker for the files it owns."""
        return await batch.cat_many(self, paths)

    async def close(self) -> None:
        try:
            await self.hits.flush_touches()
        except Exception as exc:  # closing is best effort
            log.debug("flush on close failed: %s", exc)
        self.router.close()
        await self.control.close()
        for ufs in self._ufs.values():
            await ufs.close()
        self._ufs.clear()
        self.cache.drop_locations()  # the handed-over descriptors

    def abandon(self) -> None:
        """Drop loop-bound resources without touching the loop (after fork): the
        parent's event loop does not run here, so nothing can be closed through it."""
        self.router.abandon()
        self.control.abandon()
        self._ufs.clear()


def _expected_len(size: int, offset: int, length: int) -> int:
    """How many bytes a read of [offset, offset+length) of a file of ``size`` returns."""
    end = size if length < 0 else min(size, offset + length)
    return max(0, end - offset)


def _slice(data: bytes, first: int, page_size: int, offset: int, length: int) -> bytes:
    start = offset - first * page_size
    if start == 0 and (length < 0 or length >= len(data)):
        return data
    end = len(data) if length < 0 else start + length
    return data[start:end]


__all__ = [
    "DATASET_LOCATE_AFTER",
    "FAILOVER_LOG_EVERY",
    "LOCATE_AHEAD",
    "RING_RECHECK_EVERY",
    "SUSPECT_FOR",
    "AsyncClient",
    "DatasetNotFound",
    "IsADirectory",
    "NotFound",
    "PathOutsideDataset",
    "read_located",
]

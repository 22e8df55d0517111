"""AsyncClient: the implementation of the client library.

A read goes: dataset definition and file metadata from the local cache (no master, no
worker round trip within the staleness bound) -> the file's owners on the ring -> the
first owner that answers. A worker on this host is asked over its Unix socket for the
*location* of the pages (LOCATE) and hands over descriptors; later reads of those pages
are a ``pread`` in the caller's process. Every page is checked against its checksum. A
dead worker is skipped for a while and the next owner tried; when no owner can serve,
the read falls back to under storage, counted and logged, for classified errors only.

The parts, each a module: :mod:`~shoal.client.routing` (definitions, ring, owners,
suspects, pools, failover), :mod:`~shoal.client.shortcircuit` (LOCATE, LOCATE_DIR,
located reads, ``read_fast``), :mod:`~shoal.client.batch` (``cat_many``); here, the
reads that tie them together and the counted fallback to under storage.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections.abc import Iterable
from typing import Any

import xxhash

from shoal.client import batch
from shoal.client.ahead import AHEAD, Ahead
from shoal.client.cache import ClientCache, WorkerAddr
from shoal.client.local import read_located, stat_path
from shoal.client.routing import FAILOVER_LOG_EVERY, RING_RECHECK_EVERY, SUSPECT_FOR
from shoal.client.shortcircuit import DATASET_LOCATE_AFTER, LOCATE_AHEAD, ShortCircuit
from shoal.config import ClientSettings
from shoal.core.types import Dataset, FileInfo, NsPath, split_path
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
from shoal.proto.messages import DropRequest, ListRequest, LocateRequest, ReadRequest, StatRequest
from shoal.ufs.base import UnderStore
from shoal.ufs.registry import open_store

log = logging.getLogger("shoal.client")


class AsyncClient(ShortCircuit):
    def __init__(self, settings: ClientSettings, cache: ClientCache | None = None) -> None:
        super().__init__(settings, cache)
        self._ufs: dict[tuple[str, str], UnderStore] = {}
        #: directories being listed for stats that missed (see _stat_by_listing)
        self._listing: dict[tuple[str, str], asyncio.Task[None]] = {}
        #: sequential readers over TCP (shoal.client.ahead)
        self._ahead = Ahead(self.cache)
        _LIVE.add(self)

    # -- metadata -------------------------------------------------------------------

    async def stat(self, path: str) -> FileInfo:
        ds, np = await self._resolve(path)
        if not np.mount:
            return FileInfo(str(np), 0, "", 0.0, True)
        if not np.rel:
            ds.mount(np.mount)
            return FileInfo(str(np), 0, "", 0.0, True)
        info = _complete(self.cache.info(ds, np.key_path))
        man = await self.manifest(ds) if info is None else None
        if man is not None:
            e = man.get(np.key_path)
            if e is not None:
                info = e.info()
                self.cache.remember(ds.name, info)
            elif man.is_dir(np.key_path):
                return FileInfo(str(np), 0, "", 0.0, True)
        if info is None and man is None:
            info = await self._stat_by_listing(ds, np)
        if info is None:
            req = StatRequest(ds.name, np.key_path, ds.generation)
            info = (await self._with_failover(ds, np, req)).reply.info
            if not info.is_dir:
                self.cache.remember(ds.name, info)
        return FileInfo(str(np), info.size, info.version, info.mtime, info.is_dir)

    def stat_fast(self, path: str) -> FileInfo | None:
        """The zero-round-trip stat: what :meth:`stat` would answer from this process's
        metadata cache or the dataset's manifest, on any thread; else None (then
        ``await stat(...)``). See :func:`shoal.client.local.stat_path`."""
        return stat_path(self.cache, path)

    async def _stat_by_listing(self, ds: Dataset, np: NsPath) -> FileInfo | None:
        """A stat that missed: when others missed in the same directory before, list it
        once (one round trip for every file in it, single-flight across concurrent
        stats) and answer from that; None when the directory is not listed now or the
        file is not in it (then it is a stat)."""
        directory = np.key_path.rpartition("/")[0]
        if not self.cache.list_due(ds, directory):
            return None
        key = (ds.name, directory)
        task = self._listing.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._list_for_stats(ds, directory))
            self._listing[key] = task
            task.add_done_callback(lambda _: self._listing.pop(key, None))
        await asyncio.shield(task)
        return _complete(self.cache.info(ds, np.key_path))

    async def _list_for_stats(self, ds: Dataset, directory: str) -> None:
        self.cache.dirs_listed[(ds.name, directory)] = time.monotonic()
        np = split_path(f"/{ds.name}/{directory}")
        try:
            resp = await self._with_failover(ds, np, ListRequest(ds.name, directory, ds.generation))
        except ShoalError as exc:  # the stat asks for itself
            log.debug("listing /%s/%s for stats failed: %s", ds.name, directory, exc)
            return
        now = self.cache.datasets.get(ds.name)
        if now is None or now[0].generation != ds.generation:
            return  # a sync or policy change meanwhile: what it listed may be stale
        for e in resp.reply.entries:
            if not e.is_dir:
                self.cache.remember(ds.name, e)

    async def ls(self, path: str) -> list[FileInfo]:
        if split_path_or_root(path) is None:
            return [FileInfo("/" + d.name, 0, "", 0.0, True) for d in await self.datasets()]
        ds, np = await self._resolve(path)
        if not np.mount:
            return [FileInfo(f"/{ds.name}/{m.name}", 0, "", 0.0, True) for m in ds.mounts]
        ds.mount(np.mount)
        man = await self.manifest(ds)
        if man is not None:
            entry = man.get(np.key_path)
            if man.is_dir(np.key_path):
                entries = man.ls(np.key_path)
            elif entry is not None:
                entries = [entry.info()]
            else:
                entries = None
        if man is not None and entries is not None:
            return [
                FileInfo(f"/{ds.name}/{e.path}", e.size, e.version, e.mtime, e.is_dir)
                for e in entries
            ]
        resp = await self._with_failover(ds, np, ListRequest(ds.name, np.key_path, ds.generation))
        out = []
        for e in resp.reply.entries:
            if not e.is_dir:
                self.cache.remember(ds.name, e)
            out.append(FileInfo(f"/{ds.name}/{e.path}", e.size, e.version, e.mtime, e.is_dir))
        return out

    # -- data -----------------------------------------------------------------------

    async def cat(self, path: str) -> bytes:
        return await self.read(path, 0, -1)

    async def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        """Bytes [offset, offset+length) of a file (length -1: to the end).

        Never a short read: what is returned has the length the file's size and the range
        imply, or an error is raised. A worker that serves another page layout (the
        dataset's page size changed) answers StaleLayout: the dataset is refreshed and
        the read tried once more in the new layout."""
        ds, np = await self._resolve(path)
        if not np.rel:
            raise IsADirectory(str(np))
        ds.mount(np.mount)
        fast = read_located(self.cache, ds, np.key_path, offset, length)
        if fast is not None:
            self._flush_touches_maybe()
            return fast
        await self._report_bad_pages()
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
        return self._local_owner(ds, key) is not None and self.settings.short_circuit

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
        owners = await self.owners(ds, np.key_path)
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
                        self._mark_suspect(w, exc)
                        last = exc
                        break
            if again or not isinstance(last, Unavailable):
                break
            owners = await self._moved_owners(ds, np.key_path, tried, since)
        if isinstance(last, Unavailable | CorruptData | StaleLayout) or last is None:
            return await self._fallback(ds, np, offset, length, last)
        raise last

    async def _read_from(
        self, w: WorkerAddr, ds: Dataset, path: str, offset: int, length: int
    ) -> bytes:
        info = self.cache.info(ds, path)
        version = info.version if info is not None else None
        local = self.is_local(w)
        if local:
            data, version = await self._read_local(w, ds, path, offset, length, version)
            if data is not None:
                return data
        ps = ds.policy.page_size
        req = ReadRequest(ds.name, path, offset, length, version, ps, ds.generation)
        resp = await self._send(w, req)
        m = resp.reply
        if self._layout_moved(ds):
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
        log.warning(
            "bad checksum on /%s/%s page %d from %s; refetching", ds.name, path, index, w.id
        )
        try:
            await self._send(w, DropRequest(ds.name, path, version, index))
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
            ufs = self._ufs[key] = open_store(ds.mount(np.mount))
        c = self.cache.counters
        c.ufs_fallback += 1
        why = cause.code if cause is not None else "no_worker"
        c.fallback_causes[why] = c.fallback_causes.get(why, 0) + 1
        self._warn(
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
        ds, np = await self._resolve(path)
        if not np.rel:
            raise IsADirectory(str(np))
        ds.mount(np.mount)
        for w in await self.owners(ds, np.key_path):
            if not self.is_local(w):
                continue
            try:
                try:
                    resp = await self._send(w, _whole_file(ds, np.key_path, load), True)
                except StaleLayout:
                    ds = await self.dataset(ds.name, refresh=True)
                    resp = await self._send(w, _whole_file(ds, np.key_path, load), True)
            except Unavailable as exc:
                self._mark_suspect(w, exc)
                continue
            m = resp.reply
            if m.miss:
                return None
            info = FileInfo(str(np), m.size, m.version, m.mtime)
            self.cache.remember(ds.name, FileInfo(np.key_path, m.size, m.version, m.mtime))
            pages = m.pages
            whole = (
                len(resp.fds) == 1
                and all(p[0] == 0 for p in pages)
                and all(p[1] == (m.first + i) * ds.policy.page_size for i, p in enumerate(pages))
                and pages[0][1] == 0
            )
            for fd in resp.fds[1:] if whole else resp.fds:
                os.close(fd)
            return (resp.fds[0], info) if whole else None
        return None

    async def cat_many(self, paths: Iterable[str]) -> dict[str, bytes | ShoalError]:
        """Whole files, batched: one request per worker for the files it owns."""
        return await batch.cat_many(self, paths)

    async def close(self) -> None:
        try:
            await self.flush_touches()
        except Exception as exc:  # closing is best effort
            log.debug("flush on close failed: %s", exc)
        self._close_pools()
        for task in (self._refreshing, self._ticker):
            if task is not None:
                task.cancel()
        if self._http is not None:
            await self._http.close()
        for ufs in self._ufs.values():
            await ufs.close()
        self._ufs.clear()

    def abandon(self) -> None:
        """Drop loop-bound resources without touching the loop (after fork): the
        parent's event loop does not run here, so nothing can be closed through it."""
        self._close_pools()
        http, self._http = self._http, None
        if http is not None:
            _disown(http)
        self._ufs.clear()
        # the parent loop's tasks: kept, never destroyed here ("Task was destroyed but it
        # is pending" otherwise)
        _DISOWNED.extend(t for t in (self._refreshing, self._ticker) if t is not None)
        self._refreshing = None
        self._ticker = None


#: sessions inherited through fork, kept so that no finalizer ever runs on them
_DISOWNED: list[Any] = []
#: every AsyncClient of this process (a forked child disowns their sessions at once)
_LIVE: weakref.WeakSet[AsyncClient] = weakref.WeakSet()


def _disown_all() -> None:
    """In a forked child: every client's HTTP session is the parent's. Disowned now, not
    at the client's next use, so a child that never uses an inherited client (a
    DataLoader worker of a process holding one) exits without the aiohttp noise."""
    for c in list(_LIVE):
        http, c._http = c._http, None
        if http is not None:
            _disown(http)


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


def split_path_or_root(path: str) -> NsPath | None:
    p = path[len("shoal://") :] if path.startswith("shoal://") else path
    if p.strip("/") == "":
        return None
    return split_path(path)


def _complete(info: FileInfo | None) -> FileInfo | None:
    """Cached metadata a stat can answer with: not what LOCATE_DIR taught (a located
    small file's size and version, without its mtime)."""
    return info if info is not None and (info.mtime_ns or info.mtime) else None


def _expected_len(size: int, offset: int, length: int) -> int:
    """How many bytes a read of [offset, offset+length) of a file of ``size`` returns."""
    end = size if length < 0 else min(size, offset + length)
    return max(0, end - offset)


def _whole_file(ds: Dataset, key: str, load: bool) -> LocateRequest:
    """LOCATE of a whole file (``load=False``: cached only, never fetched)."""
    return LocateRequest(ds.name, key, None, 0, -1, not load, 0, ds.policy.page_size, ds.generation)


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

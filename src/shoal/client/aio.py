"""AsyncClient: the implementation of the client library.

A read goes: dataset definition and file metadata from the local cache (no master, no
worker round trip within the staleness bound) -> the file's owners on the ring -> the
first owner that answers. A worker on this host is asked over its Unix socket for the
*location* of the pages (LOCATE) and hands over descriptors; later reads of those pages
are a ``pread`` in the caller's process. Every page is checked against its checksum. A
dead worker is skipped for a while and the next owner tried; when no owner can serve,
the read falls back to under storage, counted and logged, for classified errors only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable
from typing import Any

import xxhash

from shoal.client.cache import ClientCache, PageLoc, WorkerAddr
from shoal.client.conn import Pool, Response, TimedOut
from shoal.client.hits import EXTRA_OWNERS, HitBook
from shoal.client.local import TOUCH_EVERY, read_located
from shoal.config import ClientSettings
from shoal.core.ring import Ring
from shoal.core.types import NEVER, Dataset, FileInfo, NsPath, split_path
from shoal.errors import (
    CorruptData,
    DatasetNotFound,
    IsADirectory,
    NotFound,
    PathOutsideDataset,
    ProtocolError,
    ShoalError,
    StaleLayout,
    StaleVersion,
    Unavailable,
    from_code,
)
from shoal.proto.wire import MAX_BATCH, Op
from shoal.ufs.base import UnderStore
from shoal.ufs.registry import open_store

log = logging.getLogger("shoal.client")

#: bytes of already cached pages past a located range a worker also hands over
LOCATE_AHEAD = 256 << 20
#: after this many directories located, a reader asks for the whole dataset's cached
#: files (one answer instead of one per directory: a training epoch reads them all)
DATASET_LOCATE_AFTER = 3
#: seconds a worker that failed to answer is skipped
SUSPECT_FOR = 5.0
#: a read that finds every owner unreachable looks at the ring again, at most this often
RING_RECHECK_EVERY = 1.0
#: seconds between log lines about one worker's failovers, or one dataset's fallbacks
#: to under storage (the others are counted in the next line)
FAILOVER_LOG_EVERY = 10.0


class AsyncClient(HitBook):
    def __init__(self, settings: ClientSettings, cache: ClientCache | None = None) -> None:
        super().__init__(settings, cache or ClientCache())
        self._pools: dict[tuple[str, bool], Pool] = {}
        self._suspect: dict[str, float] = {}
        #: kind of warning -> (occurrences not yet logged, when its last line was written)
        self._warned: dict[str, tuple[int, float]] = {}
        self._ufs: dict[tuple[str, str], UnderStore] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._ring_datasets_gen: int | None = None
        #: the master's datasets_generation at the last refresh of the definitions
        self._datasets_gen: int | None = None
        self.cache.refresh_every = settings.ring_refresh

    # -- datasets -------------------------------------------------------------------

    async def dataset(self, name: str, refresh: bool = False) -> Dataset:
        hit = self.cache.datasets.get(name)
        if hit is not None and not refresh:
            if time.monotonic() - self.cache.checked_at > self.settings.ring_refresh:
                self._refresh_soon()
            return hit[0]
        try:
            ds = await self.fetch_dataset(name)
        except Unavailable:
            if hit is not None:
                return hit[0]  # the master is down: keep serving what we know
            raise
        now = time.monotonic()
        self._install(ds, now)
        if not self.cache.checked_at:
            self.cache.checked_at = now  # a new client: what it just fetched is fresh
        return ds

    # -- ring -----------------------------------------------------------------------

    async def refresh_ring(self) -> Ring:
        ring, workers, self._ring_datasets_gen = await self.fetch_ring()
        c = self.cache
        if c.ring is None or ring.epoch >= c.ring.epoch:
            c.workers.update(workers)
            c.ring = ring
        c.ring_at = time.monotonic()
        return c.ring

    def _refresh_soon(self) -> None:
        if self._refreshing is not None and not self._refreshing.done():
            return

        async def refresh() -> None:
            try:
                await self.refresh_ring()
                gen = self._ring_datasets_gen
                if gen is None or gen != self._datasets_gen:
                    # a sync or policy change: new definitions drop what they invalidate
                    await self.datasets()
                    self._datasets_gen = gen
            except ShoalError as exc:
                log.debug("background refresh failed: %s", exc)
            finally:
                # tried: the short circuit serves on (a master that is down must not
                # send every read the slow way) until the next refresh is due
                self.cache.checked_at = time.monotonic()

        self._refreshing = asyncio.get_running_loop().create_task(refresh())

    def _tick_soon(self) -> None:
        """Start the background ticker of this loop, once: it sends buffered hits (the
        short circuit's and note_local_read's) every TOUCH_EVERY seconds and keeps the
        dataset definitions fresh, so that neither waits for a read on the slow path."""
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TOUCH_EVERY)
            if self.cache.touch_log:
                try:
                    await self.flush_touches()
                except Exception as exc:  # advisory: the next tick tries again
                    log.debug("touch flush failed: %s", exc)
            if time.monotonic() - self.cache.checked_at > self.settings.ring_refresh:
                self._refresh_soon()

    async def _ring(self) -> Ring:
        self._tick_soon()
        c = self.cache
        if c.ring is None:
            return await self.refresh_ring()
        if time.monotonic() - c.ring_at > self.settings.ring_refresh:
            self._refresh_soon()
        return c.ring

    def _saw_epoch(self, epoch: int) -> None:
        ring = self.cache.ring
        if ring is not None and epoch > ring.epoch:
            self._refresh_soon()

    async def owners(self, ds: Dataset, path: str) -> list[WorkerAddr]:
        """Workers to try for a file, in order: ring owners, then a few more for failover."""
        ring = await self._ring()
        ids = ring.owners(f"{ds.name}/{path}", ds.policy.replicas + EXTRA_OWNERS)
        addrs = [self.cache.workers[i] for i in ids if i in self.cache.workers]
        if ds.policy.placement == "local":
            addrs.sort(key=lambda w: w.node != self.settings.node)
        now = time.monotonic()
        healthy = [w for w in addrs if self._suspect.get(w.id, 0.0) <= now]
        return healthy + [w for w in addrs if w not in healthy]

    def _pool(self, w: WorkerAddr, local: bool) -> Pool:
        key = (w.id, local)
        pool = self._pools.get(key)
        if pool is None or pool.address != (w.uds if local else (w.host, w.port)):
            addr: str | tuple[str, int] = w.uds if local else (w.host, w.port)
            pool = self._pools[key] = Pool(
                addr, self.settings.pool_size, self.settings.request_timeout
            )
        return pool

    async def _call(
        self, w: WorkerAddr, op: Op, args: list[Any], want_fds: bool = False
    ) -> Response:
        local = self.is_local(w)
        try:
            resp = await self._pool(w, local).call(op, args, want_fds)
        except TimedOut:
            raise  # the worker itself does not answer: its TCP port will not either
        except Unavailable:
            if local:  # the socket file may be stale; TCP is the other way in
                resp = await self._pool(w, False).call(op, args)
            else:
                raise
        self._saw_epoch(resp.epoch)
        return resp

    # -- metadata -------------------------------------------------------------------

    async def _resolve(self, path: str) -> tuple[Dataset, NsPath]:
        np = split_path(path)
        if self.cache.ring is None and np.dataset not in self.cache.datasets:
            # a new client: learn the dataset and the ring in one round trip's time
            ds, _ = await asyncio.gather(self.dataset(np.dataset), self._ring())
            return ds, np
        return await self.dataset(np.dataset), np

    async def stat(self, path: str) -> FileInfo:
        ds, np = await self._resolve(path)
        if not np.mount:
            return FileInfo(str(np), 0, "", 0.0, True)
        if not np.rel:
            ds.mount(np.mount)
            return FileInfo(str(np), 0, "", 0.0, True)
        info = self.cache.info(ds, np.key_path)
        man = await self.manifest(ds) if info is None else None
        if man is not None:
            e = man.get(np.key_path)
            if e is not None:
                info = e.info()
                self.cache.remember(ds.name, info)
            elif man.is_dir(np.key_path):
                return FileInfo(str(np), 0, "", 0.0, True)
        if info is None:
            resp = await self._with_failover(ds, np, Op.STAT, [ds.name, np.key_path, ds.generation])
            info = FileInfo.from_wire(resp.meta)
            if not info.is_dir:
                self.cache.remember(ds.name, info)
        return FileInfo(str(np), info.size, info.version, info.mtime, info.is_dir)

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
        resp = await self._with_failover(ds, np, Op.LIST, [ds.name, np.key_path, ds.generation])
        out = []
        for w in resp.meta:
            e = FileInfo.from_wire(w)
            if not e.is_dir:
                self.cache.remember(ds.name, e)
            out.append(FileInfo(f"/{ds.name}/{e.path}", e.size, e.version, e.mtime, e.is_dir))
        return out

    async def _with_failover(self, ds: Dataset, np: NsPath, op: Op, args: list[Any]) -> Response:
        last: ShoalError | None = None
        tried: dict[str, WorkerAddr] = {}
        owners = await self.owners(ds, np.key_path)
        for again in (False, True):
            for w in owners:
                tried[w.id] = w
                try:
                    return await self._call(w, op, args)
                except Unavailable as exc:
                    self._mark_suspect(w, exc)
                    last = exc
            if again or last is None:
                break
            owners = await self._moved_owners(ds, np.key_path, tried)
        raise last or Unavailable("no live workers in the ring")

    async def _moved_owners(
        self, ds: Dataset, key: str, tried: dict[str, WorkerAddr]
    ) -> list[WorkerAddr]:
        """Every owner tried was unreachable: the ring may have moved since this client
        last looked (a worker restarted on another port, another one took over). Look
        now, once, and return the owners not tried yet at their current address. (The
        ring is fetched at most every RING_RECHECK_EVERY seconds this way, so an outage
        does not send every read to the master.)"""
        if time.monotonic() - self.cache.ring_at >= RING_RECHECK_EVERY:
            try:
                await self.refresh_ring()
            except ShoalError as exc:
                log.debug("ring refresh after every owner failed: %s", exc)
                return []
        return [w for w in await self.owners(ds, key) if tried.get(w.id) != w]

    def _mark_suspect(self, w: WorkerAddr, exc: Exception) -> None:
        now = time.monotonic()
        self._suspect[w.id] = now + SUSPECT_FOR
        self.cache.counters.failovers += 1
        self._warn(
            f"failover {w.id}", "worker %s unavailable (%s); trying the next owner", w.id, exc
        )
        self._refresh_soon()

    def _warn(self, kind: str, fmt: str, *args: object) -> None:
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
        try:
            return await self._read(ds, np, offset, length, False)
        except StaleLayout:
            ds = await self.dataset(ds.name, refresh=True)
            ds.mount(np.mount)
            return await self._read(ds, np, offset, length, True)

    async def _read(
        self, ds: Dataset, np: NsPath, offset: int, length: int, refreshed: bool
    ) -> bytes:
        last: ShoalError | None = None
        tried: dict[str, WorkerAddr] = {}
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
            owners = await self._moved_owners(ds, np.key_path, tried)
        if isinstance(last, Unavailable | CorruptData | StaleLayout) or last is None:
            return await self._fallback(ds, np, offset, length, last)
        raise last

    def _layout_moved(self, ds: Dataset) -> bool:
        """Whether the dataset's page layout changed since ``ds`` was read (a reply in
        the old layout must not be installed next to the new one)."""
        hit = self.cache.datasets.get(ds.name)
        return hit is not None and hit[0].policy.page_size != ds.policy.page_size

    async def _read_from(
        self, w: WorkerAddr, ds: Dataset, path: str, offset: int, length: int
    ) -> bytes:
        info = self.cache.info(ds, path)
        version = info.version if info is not None else None
        local = self.is_local(w)
        if local and ds.policy.staleness == NEVER:
            directory = path.rpartition("/")[0]
            if self.cache.dir_due((w.id, ds.name, directory)):
                # a new reader (a fresh DataLoader worker) learns a whole directory's
                # cached files in one round trip instead of one per file
                await self._locate(w, ds, [directory])
                fast = read_located(self.cache, ds, path, offset, length)
                if fast is not None:
                    return fast
        ps = ds.policy.page_size
        if local:
            args = [ds.name, path, version, offset, length, False, LOCATE_AHEAD, ps, ds.generation]
            resp = await self._call(w, Op.LOCATE, args, True)
            data = self._take_locations(w, ds, path, resp, offset, length)
            if data is not None:
                self.cache.counters.local += 1
                self.cache.counters.bytes_local += len(data)
                return data
            version = resp.meta["v"]
        resp = await self._call(
            w, Op.READ, [ds.name, path, offset, length, version, ps, ds.generation]
        )
        m = resp.meta
        if self._layout_moved(ds):
            raise StaleLayout(f"/{ds.name}: the page size changed during the read")
        self.cache.remember(ds.name, FileInfo(path, m["size"], m["v"], m.get("mt", 0.0)))
        view = memoryview(resp.data)
        pos = 0
        for i, (n, ck) in enumerate(m["pages"]):
            if len(view[pos : pos + n]) != n or xxhash.xxh3_64_intdigest(view[pos : pos + n]) != ck:
                await self._report_corrupt(w, ds, path, m["v"], m["first"] + i)
            pos += n
        c = self.cache.counters
        if local:
            c.local += 1
            c.bytes_local += len(resp.data)
        else:
            c.remote += 1
            c.bytes_remote += len(resp.data)
        out = _slice(resp.data, m, ps, offset, length)
        want = _expected_len(m["size"], offset, length)
        if pos != len(resp.data) or len(out) != want:
            # a reply that does not cover the range in this layout is never returned
            raise CorruptData(
                f"/{ds.name}/{path}: worker {w.id} returned {len(out)} bytes for a range of {want}"
            )
        return out

    def _take_locations(
        self, w: WorkerAddr, ds: Dataset, path: str, resp: Response, offset: int, length: int
    ) -> bytes | None:
        """Install handed-over descriptors and page locations; read the range with pread."""
        m = resp.meta
        c = self.cache
        ids = [tuple(x) for x in m.get("fds", [])]
        moved = self._layout_moved(ds)
        if moved or len(resp.fds) != len(ids) or any(p[0] < 0 for p in m["pages"]):
            for fd in resp.fds:
                os.close(fd)
            if moved:
                raise StaleLayout(f"/{ds.name}: the page size changed during the read")
            c.remember(ds.name, FileInfo(path, m["size"], m["v"], m.get("mt", 0.0)))
            return None
        c.remember(ds.name, FileInfo(path, m["size"], m["v"], m.get("mt", 0.0)))
        for key, fd in zip(ids, resp.fds, strict=True):
            c.add_fd(key, fd)
        first = m["first"]
        for i, (slot, off, n, ck) in enumerate(m["pages"]):
            c.locs[(ds.name, path, m["v"], first + i)] = PageLoc(
                ids[slot], off, n, ck, w.id, ds.policy.page_size
            )
        # the worker counted this read when it answered: no touch for it
        return read_located(c, ds, path, offset, length, touch=False)

    async def _locate(self, w: WorkerAddr, ds: Dataset, directories: list[str]) -> None:
        """Learn the cached files of these directories from a local worker. A reader that
        goes on to a third directory is taken to read the dataset at large (a training
        epoch) and asks once for the whole dataset's instead, if it is small enough."""
        c = self.cache
        now = time.monotonic()
        whole = (w.id, ds.name, None)
        asked = c.dir_asks.get((w.id, ds.name), 0) + len(directories)
        c.dir_asks[(w.id, ds.name)] = asked
        for d in directories:
            c.dirs_located[(w.id, ds.name, d)] = now
        if whole not in c.dirs_located and asked >= DATASET_LOCATE_AFTER:
            c.dirs_located[whole] = now
            if await self._locate_dir(w, ds, None):
                return
        await asyncio.gather(*(self._locate_dir(w, ds, d) for d in directories))

    async def _locate_or_suspect(self, w: WorkerAddr, ds: Dataset, directories: list[str]) -> None:
        try:
            await self._locate(w, ds, directories)
        except TimedOut as exc:
            self._mark_suspect(w, exc)  # what it would have served goes elsewhere

    async def _locate_dir(self, w: WorkerAddr, ds: Dataset, directory: str | None) -> bool:
        """Install a LOCATE_DIR answer; whether it held every cached file asked for."""
        ps = ds.policy.page_size
        try:
            resp = await self._call(w, Op.LOCATE_DIR, [ds.name, directory, ps, ds.generation], True)
        except TimedOut:
            raise  # a hung worker: the read goes on to the next owner now
        except (Unavailable, ProtocolError, StaleLayout) as exc:
            log.debug("LOCATE_DIR on %s failed: %s", w.id, exc)
            return False
        m = resp.meta
        ids = [tuple(x) for x in m.get("fds", [])]
        c = self.cache
        if len(resp.fds) != len(ids) or self._layout_moved(ds):
            for fd in resp.fds:
                os.close(fd)
            return False
        keys = []
        for key, fd in zip(ids, resp.fds, strict=True):
            keys.append(c.add_fd(key, fd))
        meta, locs, name, wid, now = c.meta, c.locs, ds.name, w.id, time.monotonic()
        for path, v, size, slot, off, n, ck in m["items"]:
            if n != size or size > ps:
                continue  # a whole small file, or nothing
            mk = (name, path)
            known = meta.get(mk)
            if known is None:
                meta.put(mk, (FileInfo(path, size, v), now))
            elif known[0].version != v:
                continue  # this process already reads another version of it
            locs[(name, path, v, 0)] = PageLoc(keys[slot], off, n, ck, wid, ps)
        return bool(m.get("full", True)) and (directory is not None or bool(m["items"]))

    async def _report_corrupt(
        self, w: WorkerAddr, ds: Dataset, path: str, version: str, index: int
    ) -> None:
        self.cache.counters.corrupt += 1
        self.cache.locs.pop((ds.name, path, version, index), None)
        log.warning(
            "bad checksum on /%s/%s page %d from %s; refetching", ds.name, path, index, w.id
        )
        try:
            await self._call(w, Op.DROP, [ds.name, path, version, index])
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
                args = [ds.name, np.key_path, None, 0, -1, not load, 0]
                try:
                    resp = await self._call(
                        w, Op.LOCATE, [*args, ds.policy.page_size, ds.generation], True
                    )
                except StaleLayout:
                    ds = await self.dataset(ds.name, refresh=True)
                    resp = await self._call(
                        w, Op.LOCATE, [*args, ds.policy.page_size, ds.generation], True
                    )
            except Unavailable as exc:
                self._mark_suspect(w, exc)
                continue
            m = resp.meta
            if m.get("miss"):
                return None
            info = FileInfo(str(np), m["size"], m["v"], m.get("mt", 0.0))
            self.cache.remember(ds.name, FileInfo(np.key_path, m["size"], m["v"], m.get("mt", 0.0)))
            pages = m["pages"]
            whole = (
                len(resp.fds) == 1
                and all(p[0] == 0 for p in pages)
                and all(p[1] == (m["first"] + i) * ds.policy.page_size for i, p in enumerate(pages))
                and pages[0][1] == 0
            )
            for fd in resp.fds[1:] if whole else resp.fds:
                os.close(fd)
            return (resp.fds[0], info) if whole else None
        return None

    async def cat_many(self, paths: Iterable[str]) -> dict[str, bytes | ShoalError]:
        """Whole files, batched: one request per worker for the files it owns."""
        out: dict[str, bytes | ShoalError] = {}
        groups: dict[tuple[str, str], list[tuple[str, NsPath]]] = {}
        for p in paths:
            try:
                ds, np = await self._resolve(p)
                if not np.rel:
                    raise IsADirectory(str(np))
                ds.mount(np.mount)
            except ShoalError as exc:
                out[p] = exc
                continue
            fast = read_located(self.cache, ds, np.key_path, 0, -1)
            if fast is not None:
                out[p] = fast
                continue
            owners = await self.owners(ds, np.key_path)
            if not owners:
                out[p] = Unavailable("no live workers in the ring")
                continue
            groups.setdefault((ds.name, owners[0].id), []).append((p, np))
        await self._locate_dirs(groups, out)
        self._flush_touches_maybe()
        # a worker takes at most MAX_BATCH paths per BATCH: larger groups go in chunks
        await asyncio.gather(
            *(
                self._batch(ds, wid, items[i : i + MAX_BATCH], out)
                for (ds, wid), items in groups.items()
                for i in range(0, len(items), MAX_BATCH)
            )
        )
        return out

    async def _locate_dirs(
        self,
        groups: dict[tuple[str, str], list[tuple[str, NsPath]]],
        out: dict[str, bytes | ShoalError],
    ) -> None:
        """For local workers: learn the cached files of the batch's directories (once per
        process), then serve what that covers with pread and leave the rest to BATCH."""
        todo: list[tuple[WorkerAddr, Dataset, list[str]]] = []
        for (dsname, wid), items in groups.items():
            w = self.cache.workers.get(wid)
            hit = self.cache.datasets.get(dsname)
            if w is None or hit is None or not self.is_local(w) or hit[0].policy.staleness != NEVER:
                continue
            dirs = {np.key_path.rpartition("/")[0] for _, np in items}
            due = [d for d in dirs if self.cache.dir_due((wid, dsname, d))]
            if due:
                todo.append((w, hit[0], due))
        if not todo:
            return
        await asyncio.gather(*(self._locate_or_suspect(w, ds, dirs) for w, ds, dirs in todo))
        for (dsname, _), items in groups.items():
            dset = self.cache.datasets[dsname][0]
            rest = []
            for p, np in items:
                fast = read_located(self.cache, dset, np.key_path, 0, -1)
                if fast is None:
                    rest.append((p, np))
                else:
                    out[p] = fast
            items[:] = rest

    async def _batch(
        self,
        dsname: str,
        wid: str,
        items: list[tuple[str, NsPath]],
        out: dict[str, bytes | ShoalError],
    ) -> None:
        ds = await self.dataset(dsname)
        w = self.cache.workers[wid]
        retry: list[str] = []
        try:
            resp = await self._call(
                w, Op.BATCH, [ds.name, [np.key_path for _, np in items], ds.generation]
            )
        except Unavailable as exc:
            self._mark_suspect(w, exc)
            retry = [p for p, _ in items]
        else:
            view = memoryview(resp.data)
            pos = 0
            for (p, _), (kp, code, v, size, ck) in zip(items, resp.meta["items"], strict=True):
                if code == "":
                    chunk = view[pos : pos + size]
                    pos += size
                    if len(chunk) != size or xxhash.xxh3_64_intdigest(chunk) != ck:
                        retry.append(p)
                        continue
                    self.cache.remember(ds.name, FileInfo(kp, size, v))
                    out[p] = bytes(chunk)
                elif code == "large":
                    retry.append(p)
                else:
                    out[p] = from_code(code, v)
            c = self.cache.counters
            if self.is_local(w):
                c.local += 1
                c.bytes_local += len(resp.data)
            else:
                c.remote += 1
                c.bytes_remote += len(resp.data)

        async def one(p: str) -> None:
            try:
                out[p] = await self.read(p)
            except ShoalError as exc:
                out[p] = exc

        await asyncio.gather(*(one(p) for p in retry))

    async def close(self) -> None:
        try:
            await self.flush_touches()
        except Exception as exc:  # closing is best effort
            log.debug("flush on close failed: %s", exc)
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
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
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
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


def _expected_len(size: int, offset: int, length: int) -> int:
    """How many bytes a read of [offset, offset+length) of a file of ``size`` returns."""
    end = size if length < 0 else min(size, offset + length)
    return max(0, end - offset)


def _slice(data: bytes, meta: dict[str, Any], page_size: int, offset: int, length: int) -> bytes:
    start = offset - meta["first"] * page_size
    if start == 0 and (length < 0 or length >= len(data)):
        return data
    end = len(data) if length < 0 else start + length
    return data[start:end]


__all__ = ["AsyncClient", "DatasetNotFound", "IsADirectory", "NotFound", "PathOutsideDataset"]

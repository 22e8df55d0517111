"""Read-through loading: metadata within the staleness bound, pages from the store or,
on a miss, from under storage with exactly one fetch per page (single-flight), bounded
parallelism, and fetching ahead of the readers of large files (a sequential reader's
window, a random reader's whole file: see :mod:`shoal.worker.prefetch`).

A read is always of one file *version*: pages are keyed by it and ranged fetches are
conditioned on it, so a reader can never get a mix of two versions.

A read is also always of one page *layout* (the dataset's page size). A page size change
keeps what is cached: a small file is stored whole, the same in every layout where it is
small, and stays valid; a stored page of another geometry (a large file cached under the
old page size) is a miss here (``fits``) and is replaced when the file is fetched again,
so the old layout simply ages out and nothing is refetched up front.

A miss asks the file's previous owners first (``peers``, set by the worker: see
:mod:`shoal.worker.peers`): after the ring moved, a new owner gets the moved files from
the worker that cached them, checked, instead of from under storage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shoal.core.manifest import Manifest
from shoal.core.paging import is_small, page_count, page_len, pages_for_range
from shoal.core.singleflight import SingleFlight
from shoal.core.types import NEVER, Dataset, FileInfo, FileKey, PageKey
from shoal.errors import CorruptData, IsADirectory, ShoalError, StaleVersion, StoreError
from shoal.store.base import CacheStore, Location, PutMeta
from shoal.worker import batchload
from shoal.worker.datasets import DatasetTable
from shoal.worker.peers import Peers
from shoal.worker.prefetch import Prefetcher

#: files whose metadata the loader remembers beyond the manifest (oldest first out): a
#: load of a million files kept an entry each (~330 bytes) for files nobody reads; a
#: forgotten entry costs only a manifest lookup (or, within a bound, a revalidation)
META_MAX = 65_536

log = logging.getLogger("shoal.worker.loader")

#: a page as served: where it lies in the store, or its bytes when it could not be stored
Piece = Location | bytes


def fits(loc: Location, size: int, page_size: int, index: int) -> bool:
    """Whether a stored page is page ``index`` of a ``size``-byte file in the layout of
    ``page_size``: its length, and for a large file's data file its offset, match (a
    page stored under another page size never does)."""
    if loc.length != page_len(size, page_size, index):
        return False
    return index == 0 or loc.offset == index * page_size


@dataclass(slots=True)
class Pages:
    info: FileInfo
    first: int
    pieces: list[Piece]
    #: bytes that had to come from under storage for this read
    ufs_bytes: int = 0


class Loader:
    def __init__(
        self,
        store: CacheStore,
        table: DatasetTable,
        concurrency: int = 32,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.table = table
        self.clock = clock
        self.concurrency = concurrency
        self._sem: asyncio.Semaphore | None = None
        self._meta: OrderedDict[tuple[str, str], tuple[FileInfo, float]] = OrderedDict()
        self._lists: dict[tuple[str, str], tuple[list[FileInfo], float]] = {}
        self._heads: SingleFlight[tuple[FileInfo, bytes | None]] = SingleFlight()
        self._pages: SingleFlight[Piece] = SingleFlight()
        #: versions under storage no longer has (the manifest may still name them)
        self._dead: set[tuple[str, str, str]] = set()
        #: moves whenever ``_dead`` does
        self.dead_changes = 0
        #: dataset -> (manifest id, manifest) as the worker last fetched it
        self.manifests: dict[str, tuple[str, Manifest]] = {}
        #: readahead and whole-file fetches in the background (below our own bound,
        #: so that a reader's own GETs always find room)
        self.prefetch = Prefetcher(
            self._run_of_pages,
            self._known,
            lambda: self.store.usage().capacity,
            budget=max(1, concurrency // 2),
        )
        #: under-storage GETs issued (for tests and metrics)
        self.ufs_gets = 0
        #: previous owners to ask on a miss before under storage (None: ask nobody)
        self.peers: Peers | None = None
        #: files (their first page) and bytes that came from previous owners
        self.moved_files = 0
        self.moved_bytes = 0

    # -- metadata -------------------------------------------------------------------

    def _fresh(self, ds: Dataset, fetched_at: float) -> bool:
        bound = ds.policy.staleness
        return bound == NEVER or self.clock() - fetched_at <= bound

    def cached_info(self, ds: Dataset, path: str) -> FileInfo | None:
        hit = self._meta.get((ds.name, path))
        if hit is not None and self._fresh(ds, hit[1]):
            return hit[0]
        return None

    def _remember(self, ds: Dataset, path: str, info: FileInfo) -> None:
        old = self._meta.get((ds.name, path))
        self._meta[(ds.name, path)] = (info, self.clock())
        if len(self._meta) > META_MAX:
            self._meta.popitem(last=False)
        if old is not None and old[0].version != info.version:
            # the object changed: its old pages can never be served again
            self.store.delete(FileKey(ds.name, path, old[0].version))

    def forget(self, dataset: str) -> None:
        self.manifests.pop(dataset, None)
        self._dead = {d for d in self._dead if d[0] != dataset}
        self.dead_changes += 1
        for cache in (self._meta, self._lists):
            for k in [k for k in cache if k[0] == dataset]:
                del cache[k]

    async def stat(self, dataset: str, path: str) -> FileInfo:
        ds, ufs, rel = self.table.resolve(dataset, path)
        info = self.cached_info(ds, path) or self.manifest_info(ds, path)
        if info is not None:
            return info
        man = self.manifests.get(ds.name)
        if man is not None and man[0] == ds.manifest and man[1].is_dir(path):
            return FileInfo(path, 0, "", 0.0, True)
        info = await ufs.info(rel)
        info = _rebase(info, path)
        if not info.is_dir:
            self._remember(ds, path, info)
        return info

    async def ls(self, dataset: str, path: str) -> list[FileInfo]:
        ds, ufs, rel = self.table.resolve(dataset, path)
        hit = self._lists.get((ds.name, path))
        if hit is not None and self._fresh(ds, hit[1]):
            return hit[0]
        man = self.manifests.get(ds.name)
        if man is not None and man[0] == ds.manifest and self._fresh(ds, man[1].built_at):
            listed = man[1].ls(path)
            if listed or man[1].is_dir(path):
                return listed
        entries = [_rebase(e, f"{path}/{e.path.rsplit('/', 1)[-1]}") for e in await ufs.ls(rel)]
        self._lists[(ds.name, path)] = (entries, self.clock())
        for e in entries:
            if not e.is_dir:
                self._remember(ds, e.path, e)
        return entries

    def current(self, ds: Dataset, path: str) -> FileInfo | None:
        """The version this worker would serve now without asking anyone, if it knows."""
        info = self.cached_info(ds, path) or self.manifest_info(ds, path)
        if info is not None:
            return info
        held = self.store.versions(ds.name, path)
        if len(held) == 1 and ds.policy.staleness == NEVER:
            v, size = next(iter(held.items()))
            return FileInfo(path, size, v)
        return None

    def manifest_info(self, ds: Dataset, path: str) -> FileInfo | None:
        """The file as the dataset's manifest lists it, if the manifest is within the bound."""
        man = self.manifests.get(ds.name)
        if man is None or man[0] != ds.manifest:
            return None
        bound = ds.policy.staleness
        if bound != NEVER and self.clock() - man[1].built_at > bound:
            return None
        e = man[1].get(path)
        if e is None or (ds.name, path, e.version) in self._dead:
            return None
        return e.info()

    async def resolve(
        self, ds: Dataset, path: str, version: str | None
    ) -> tuple[FileInfo, bytes | None]:
        """The file's info at ``version`` (or at whatever is current within the bound),
        plus page 0's bytes when this call had to fetch them to learn the info.

        Cheapest first: metadata within the bound (cache, then manifest); else versions
        the store holds (a restarted worker), trusted under "never revalidate" and
        otherwise revalidated with one metadata request; else one GET that brings info
        and page 0 together.
        """
        info = self.cached_info(ds, path) or self.manifest_info(ds, path)
        if info is not None and (version is None or info.version == version):
            if (ds.name, path) not in self._meta:
                self._remember(ds, path, info)
            return info, None
        held = self.store.versions(ds.name, path)
        if version is not None and version in held:
            candidate: str | None = version
        elif version is None and len(held) == 1:
            candidate = next(iter(held))
        else:
            candidate = None
        page0: bytes | None = None
        if candidate is not None:
            if ds.policy.staleness == NEVER:
                info = FileInfo(path, held[candidate], candidate)
                self._remember(ds, path, info)
                return info, None
            _, ufs, rel = self.table.resolve(ds.name, path)
            info = _rebase(await ufs.info(rel), path)
            self._remember(ds, path, info)
        else:
            info, page0 = await self._head(ds, path)
        if info.is_dir:
            raise IsADirectory(f"/{ds.name}/{path} is a directory")
        if version is not None and info.version != version:
            raise StaleVersion(f"/{ds.name}/{path} changed in under storage")
        return info, page0

    async def _head(self, ds: Dataset, path: str) -> tuple[FileInfo, bytes | None]:
        """Fetch info and page 0 in one request; page 0 goes into the store."""

        async def fetch() -> tuple[FileInfo, bytes | None]:
            _, ufs, rel = self.table.resolve(ds.name, path)
            moved = await self._from_peer(ds, path, None, 0)
            if moved is not None:
                info, data = moved
                self._remember(ds, path, info)
                self._put(ds, info, FileKey(ds.name, path, info.version).page(0), data)
                return info, data
            async with self._slot():
                self.ufs_gets += 1
                info, data = await ufs.read_head(rel, ds.policy.page_size)
            info = _rebase(info, path)
            self._remember(ds, path, info)
            key = FileKey(ds.name, path, info.version).page(0)
            if len(data) == page_len(info.size, ds.policy.page_size, 0):
                self._put(ds, info, key, data)
                return info, data
            return info, None

        return await self._heads.do((ds.name, path), fetch)

    # -- pages ----------------------------------------------------------------------

    def _slot(self) -> asyncio.Semaphore:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.concurrency)
        return self._sem

    def _put_meta(self, ds: Dataset, info: FileInfo) -> PutMeta:
        p = ds.policy
        return PutMeta(
            file_size=info.size,
            page_size=p.page_size,
            pin=p.pin,
            expires_at=self.clock() + p.ttl if p.ttl else 0.0,
            tiers=p.tiers,
            eviction=p.eviction,
        )

    def _put(self, ds: Dataset, info: FileInfo, key: PageKey, data: bytes) -> None:
        if (
            ds.name in self.table
            and self.table.get(ds.name).policy.page_size != ds.policy.page_size
        ):
            return  # fetched for the layout before a page-size change: serve, do not keep
        old = self.store.peek(key)
        if old is not None and not fits(old, info.size, ds.policy.page_size, key.index):
            # cached under another page size: that version's old layout goes now (the
            # store would otherwise take the old page for this one)
            self.store.delete(key.file)
        self.store.put(key, data, self._put_meta(ds, info))

    def try_cached(
        self, dataset: str, path: str, version: str | None, offset: int, length: int
    ) -> Pages | None:
        """The synchronous fast path: everything already known and cached, or None."""
        ds = self.table.get(dataset)
        info = self.cached_info(ds, path) or self.manifest_info(ds, path)
        if info is None or (version is not None and info.version != version):
            return None
        ps = ds.policy.page_size
        rng = pages_for_range(info.size, ps, offset, length)
        fk = FileKey(ds.name, path, info.version)
        pieces: list[Piece] = []
        for i in rng:
            loc = self.store.locate(fk.page(i))
            if loc is None or not fits(loc, info.size, ps, i):
                return None
            pieces.append(loc)
        if self.prefetch.jobs and (ds.name, path) in self.prefetch.jobs:
            self.prefetch.on_read(ds, info, rng, False)  # keep a sequential reader's window full
        return Pages(info, rng.start, pieces)

    def located(
        self, ds: Dataset, info: FileInfo, index: int, peek: bool = False
    ) -> Location | None:
        """Where page ``index`` of this version is stored in the dataset's current layout;
        None on a miss or when what is stored has another geometry."""
        key = FileKey(ds.name, info.path, info.version).page(index)
        loc = self.store.peek(key) if peek else self.store.locate(key)
        if loc is None or not fits(loc, info.size, ds.policy.page_size, index):
            return None
        return loc

    async def read(
        self, dataset: str, path: str, version: str | None, offset: int, length: int
    ) -> Pages:
        ds = self.table.get(dataset)
        info, page0 = await self.resolve(ds, path, version)
        ps = ds.policy.page_size
        rng = pages_for_range(info.size, ps, offset, length)
        pieces: list[Piece | None] = [self.located(ds, info, i) for i in rng]
        ufs_bytes = 0
        if page0 is not None and 0 in rng:
            ufs_bytes += len(page0)
            if pieces[0] is None:
                pieces[0] = page0  # the store would not keep it; serve it anyway
        missing = [i for i, p in zip(rng, pieces, strict=True) if p is None]
        if rng and not is_small(info.size, ps):
            # before this read's own fetches: what comes next is in flight alongside
            self.prefetch.on_read(ds, info, rng, bool(missing) or page0 is not None)
        if missing:
            got = await asyncio.gather(*(self._page(ds, info, i) for i in missing))
            for i, piece in zip(missing, got, strict=True):
                pieces[i - rng.start] = piece
                ufs_bytes += page_len(info.size, ps, i)
        return Pages(info, rng.start, [p for p in pieces if p is not None], ufs_bytes)

    async def _page(self, ds: Dataset, info: FileInfo, index: int) -> Piece:
        """One page of one version: from the store, else one ranged GET (single-flight)."""
        key = FileKey(ds.name, info.path, info.version).page(index)

        async def fetch() -> Piece:
            loc = self.located(ds, info, index)
            if loc is not None:
                return loc
            _, ufs, rel = self.table.resolve(ds.name, info.path)
            ps = ds.policy.page_size
            start = index * ps
            moved = await self._from_peer(ds, info.path, info.version, index)
            if moved is not None:
                self._put(ds, info, key, moved[1])
                return self.located(ds, info, index) or moved[1]
            async with self._slot():
                self.ufs_gets += 1
                try:
                    data = await ufs.read(
                        rel, start, start + page_len(info.size, ps, index), info.version
                    )
                except StaleVersion:
                    self._version_gone(ds, info)
                    raise
            self._put(ds, info, key, data)
            return self.located(ds, info, index) or data

        # one fetch per page *of a layout*: a fetch begun under the old page size must
        # not answer a reader of the new one
        return await self._pages.do((key, ds.policy.page_size), fetch)

    async def _run_of_pages(self, ds: Dataset, info: FileInfo, first: int, count: int) -> None:
        """Pages ``first .. first+count-1`` of one version in ONE ranged GET (the
        prefetcher's: per-request costs of the store and of this worker are paid once
        per run, not per page), each page single-flight as :meth:`_page` fetches it. A
        run of one page, or one whose pages a previous owner may hold, is :meth:`_page`."""
        if count == 1 or (self.peers is not None and self.peers.may_hold(ds, info.path)):
            await asyncio.gather(*(self._page(ds, info, i) for i in range(first, first + count)))
            return
        ps = ds.policy.page_size
        fk = FileKey(ds.name, info.path, info.version)
        keys: list[Hashable] = [(fk.page(i), ps) for i in range(first, first + count)]

        async def fetch() -> list[Piece]:
            _, ufs, rel = self.table.resolve(ds.name, info.path)
            start = first * ps
            end = min(info.size, (first + count) * ps)
            async with self._slot():
                self.ufs_gets += 1
                try:
                    data = await ufs.read(rel, start, end, info.version)
                except StaleVersion:
                    self._version_gone(ds, info)
                    raise
            if len(data) != end - start:
                raise StoreError(f"{info.path}: {len(data)} bytes for a range of {end - start}")
            view = memoryview(data)
            out: list[Piece] = []
            for i in range(first, first + count):
                part = bytes(view[(i - first) * ps : (i - first + 1) * ps])
                self._put(ds, info, fk.page(i), part)
                out.append(self.located(ds, info, i) or part)
            return out

        await self._pages.do_many(keys, fetch)

    def _known(self, ds: Dataset, info: FileInfo, index: int) -> bool:
        """Whether page ``index`` is cached or being fetched (no background fetch then)."""
        key = FileKey(ds.name, info.path, info.version).page(index)
        if (key, ds.policy.page_size) in self._pages:
            return True
        return self.located(ds, info, index, peek=True) is not None

    def _version_gone(self, ds: Dataset, info: FileInfo) -> None:
        """That version is gone from under storage: it can never be completed, so forget
        it (metadata and pages); the reader retries and sees the new one."""
        self._meta.pop((ds.name, info.path), None)
        self.store.delete(FileKey(ds.name, info.path, info.version))
        self._dead.add((ds.name, info.path, info.version))
        self.dead_changes += 1

    async def _from_peer(
        self, ds: Dataset, path: str, version: str | None, index: int
    ) -> tuple[FileInfo, bytes] | None:
        """Page ``index`` from a previous owner of the file, if one has it."""
        if self.peers is None:
            return None
        got = await self.peers.page(ds, path, version, index)
        if got is None:
            return None
        info, data = got
        info = replace(info, path=path)
        if index == 0:
            self.moved_files += 1
        self.moved_bytes += len(data)
        return info, data

    async def load(
        self, dataset: str, path: str, size: int, version: str, verify: bool
    ) -> tuple[bool, int]:
        """Preload one file version: (True, bytes fetched), or (False, 0) when every page
        was already cached (an incremental load skips it)."""
        ds = self.table.get(dataset)
        info = FileInfo(path, size, version)
        fk = FileKey(ds.name, path, version)
        ps = ds.policy.page_size
        n = page_count(size, ps)
        missing = [i for i in range(n) if self.located(ds, info, i, peek=True) is None]
        if (ds.name, path) not in self._meta or self.cached_info(ds, path) != info:
            self._remember(ds, path, info)
        if missing:
            await asyncio.gather(*(self._page(ds, info, i) for i in missing))
            if not all(self.store.contains(fk.page(i)) for i in missing):
                # fetched but not kept (the store refused the put): not loaded
                raise ShoalError(f"not cached: {self.store.refusal() or 'cache full'}")
        if verify:
            for i in range(n):
                if self.store.get(fk.page(i)) is None:
                    raise CorruptData(f"page {i} failed verification after loading")
        return bool(missing), sum(page_len(size, ps, i) for i in missing)

    def batchable(
        self, dataset: str, items: Sequence[Sequence[Any]]
    ) -> tuple[list[int], list[int]]:
        """The indexes of ``items`` ([path, size, version] each) whose loads may share
        under-storage calls (:meth:`load_many`), and those of the rest."""
        return batchload.split(self, dataset, items)

    async def load_many(
        self, dataset: str, items: Sequence[Sequence[Any]], verify: bool
    ) -> list[batchload.Outcome]:
        """Load each [path, size, version] as :meth:`load` would, batching the reads of
        small files (see :mod:`shoal.worker.batchload`); one outcome per item."""
        return await batchload.load_many(self, dataset, items, verify)

    def forget_path(self, dataset: str, path: str) -> None:
        self._meta.pop((dataset, path), None)
        parent = path.rpartition("/")[0]
        self._lists.pop((dataset, parent), None)

    async def close(self) -> None:
        await self.prefetch.close()


def _rebase(info: FileInfo, path: str) -> FileInfo:
    """Under-storage paths are mount-relative; keys use '<mount>/<rel>'."""
    return replace(info, path=path)  # keeps mtime_ns and link

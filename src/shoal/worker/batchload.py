"""The loader's batched path for loads of many small files (split out of
:mod:`shoal.worker.loader`, whose internals it uses).

A load job of tiny files from a fast source is bound by per-file overhead, not by the
source: a thread hop, a retry wrapper, a single-flight entry and an asyncio task per
file cost more than reading the file. :func:`load_many` loads a group of small files
with one call to the mount's ``read_many`` (one thread hop for the group, each file
still opened, checked inside the root and checked at its version before and after
the read), then stores the pages one after the other on the loop.

What a file loaded this way gets is what :meth:`~shoal.worker.loader.Loader.load`
gives it: a file already cached at its version is skipped; a file whose version
changed is StaleVersion, its version forgotten and dropped; a page the store refused
is an error, never counted done; ``verify`` reads every page back. Files that cannot
go this way (a large file, a mount without ``read_many``, a page some reader is
fetching right now, a previous owner that might hold it) and files whose batched read
failed with a retryable error go through ``Loader.load`` instead, which retries by
the mount's policy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shoal.core.paging import is_small
from shoal.core.types import Dataset, FileInfo, FileKey, PageKey
from shoal.errors import CorruptData, RetryableStoreError, ShoalError, StaleVersion
from shoal.store.base import PutMeta

if TYPE_CHECKING:
    from shoal.worker.loader import Loader

#: the outcome of loading one file: (fetched, bytes fetched), or the error that failed it
Outcome = tuple[bool, int] | ShoalError


def _can_read_many(ufs: object) -> bool:
    return callable(getattr(ufs, "read_many", None))


def _no_peer_to_ask(ld: Loader, ds: Dataset, path: str) -> bool:
    """True when asking previous owners for this file would find none without any I/O
    (what :meth:`~shoal.worker.peers.Peers.page` concludes then: no earlier ring, and
    this worker owns the file in the ring it knows)."""
    peers = ld.peers
    if peers is None or ds.policy.placement == "local":
        return True
    view = peers.view
    ring = view.ring
    if ring is None:
        return False
    # an earlier ring matters only where someone else held the dataset then (a worker
    # that was expired and came back is its own only holder: its loads stay batched)
    if any(ds.name in v for _, h in view.past for m, v in h.items() if m != view.me):
        return False
    if ring.members == (view.me,):
        return True  # the only member owns every file
    return view.me in ring.owners(f"{ds.name}/{path}", ds.policy.replicas)


class _Mounts:
    """Which mounts of one dataset can read many files in one call (``read_many``),
    looked up once per mount (opening a mount's driver is not free)."""

    def __init__(self, ld: Loader, ds: Dataset) -> None:
        self.ld, self.ds = ld, ds
        self._can: dict[str, bool] = {}

    def batchable(self, path: str, size: int, peers: bool = True) -> bool:
        """Whether loading this file may go through the batched read (``peers``: and
        no previous owner might hold it)."""
        ds = self.ds
        if not is_small(size, ds.policy.page_size):
            return False
        mount = path.partition("/")[0]
        can = self._can.get(mount)
        if can is None:
            try:
                can = bool(mount) and _can_read_many(self.ld.table.ufs(ds, mount))
            except ShoalError:
                can = False  # Loader.load reports it
            self._can[mount] = can
        return can and (not peers or _no_peer_to_ask(self.ld, ds, path))


def split(ld: Loader, dataset: str, items: Sequence[Sequence[Any]]) -> tuple[list[int], list[int]]:
    """The indexes of ``items`` ([path, size, version] each) that :func:`load_many` may
    read together, and those of the rest."""
    mounts = _Mounts(ld, ld.table.get(dataset))
    batched: list[int] = []
    rest: list[int] = []
    for i, it in enumerate(items):
        (batched if mounts.batchable(str(it[0]), int(it[1])) else rest).append(i)
    return batched, rest


async def load_many(
    ld: Loader, dataset: str, items: Sequence[Sequence[Any]], verify: bool
) -> list[Outcome]:
    """Load ``items`` ([path, size, version] each) as :meth:`Loader.load` would, one
    outcome per item in order; small files of a mount with ``read_many`` are read in
    one call per mount.

    Whether a previous owner might hold a file is :func:`split`'s to decide, per file,
    not asked again here: a ring that changed since means at worst that a file is read
    from under storage instead of moved from that owner (the same bytes, checked at
    the same version)."""
    ds = ld.table.get(dataset)
    ps = ds.policy.page_size
    mounts = _Mounts(ld, ds)
    out: list[Outcome | None] = [None] * len(items)
    alone: list[int] = []  # through Loader.load, one by one
    #: per mount: (item, info, page key, relative path)
    reads: dict[str, list[tuple[int, FileInfo, PageKey, str]]] = {}
    for j, (path, size, version) in enumerate(items):
        info = FileInfo(path, int(size), str(version))
        key = FileKey(ds.name, info.path, info.version).page(0)
        if (key, ps) in ld._pages or not mounts.batchable(info.path, info.size, peers=False):
            alone.append(j)  # a reader is fetching it now: Loader.load joins that fetch
            continue
        cached = ld.store.contains(key) and ld.located(ds, info, 0, peek=True) is not None
        if (ds.name, info.path) not in ld._meta or ld.cached_info(ds, info.path) != info:
            ld._remember(ds, info.path, info)
        if cached:
            out[j] = _verified(ld, key, verify) or (False, 0)
            continue
        mount, _, rel = info.path.partition("/")
        reads.setdefault(mount, []).append((j, info, key, rel))
    for mount, want in reads.items():
        ufs = ld.table.ufs(ds, mount)
        async with ld._slot():
            ld.ufs_gets += len(want)
            got = await ufs.read_many(  # type: ignore[attr-defined]
                [(rel, 0, info.size, info.version) for _, info, _, rel in want]
            )
        fetched: list[tuple[int, FileInfo, PageKey, bytes]] = []
        for (j, info, key, _), data in zip(want, got, strict=True):
            if isinstance(data, RetryableStoreError):
                alone.append(j)  # again on its own, with the mount's retries
            elif isinstance(data, ShoalError):
                if isinstance(data, StaleVersion):
                    ld._version_gone(ds, info)
                out[j] = data
            else:
                fetched.append((j, info, key, data))
        if fetched:
            _store(ld, ds, fetched, out, verify)

    async def one(j: int) -> None:
        path, size, version = items[j]
        try:
            out[j] = await ld.load(dataset, str(path), int(size), str(version), verify)
        except ShoalError as exc:
            out[j] = exc

    if alone:
        await asyncio.gather(*(one(j) for j in alone))
    return [o if o is not None else ShoalError("not loaded") for o in out]


def _store(
    ld: Loader,
    ds: Dataset,
    fetched: list[tuple[int, FileInfo, PageKey, bytes]],
    out: list[Outcome | None],
    verify: bool,
) -> None:
    """Put fetched small files as one run (as :meth:`Loader._put` would each); their
    outcomes into ``out``."""
    ps = ds.policy.page_size
    now = ds.name in ld.table and ld.table.get(ds.name).policy.page_size == ps
    if now:  # not fetched for the layout before a page-size change (those are not kept)
        store = ld.store
        for _, info, key, _ in fetched:
            if store.contains(key):
                old = store.peek(key)
                # a small file's page 0 fits the layout when it holds the whole file
                # (loader.fits); else it is page 0 of the file cached as a large one
                if old is not None and old.length != info.size:
                    store.delete(key.file)  # cached under another page size: goes now
        m = ld._put_meta(ds, fetched[0][1])
        kept = store.put_many(
            [
                (key, data, PutMeta(info.size, ps, m.pin, m.expires_at, m.tiers, m.eviction))
                for _, info, key, data in fetched
            ]
        )
    else:
        kept = [False] * len(fetched)
    for (j, _, key, data), ok in zip(fetched, kept, strict=True):
        if not ok:
            # fetched but not kept (the store refused the put): not loaded
            out[j] = ShoalError(f"not cached: {ld.store.refusal() or 'cache full'}")
        else:
            out[j] = _verified(ld, key, verify) or (True, len(data))


def _verified(ld: Loader, key: PageKey, verify: bool) -> ShoalError | None:
    if verify and ld.store.get(key) is None:
        return CorruptData("page 0 failed verification after loading")
    return None

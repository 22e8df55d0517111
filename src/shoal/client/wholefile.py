"""Whole cached files handed over as descriptors, for FUSE passthrough and mmap: a file
of several pages that a worker on this host keeps whole in a data file of its own,
from offset 0, so that the data file *is* the file's bytes.

One file at a time (:func:`open_local`: a LOCATE of the whole file), or every such
file of a directory at once (:func:`open_local_dir`: one LOCATE_DIR with runs per
local worker). A mount's first open of each large file of a directory would otherwise
cost one round trip to the worker per file: about 0.6 ms each, most of it in the
mount's own single thread, which held the first warm pass over a mixed dataset at
about half the rate of the passes after it. And kept a few seconds for the next reads
of the same version (:class:`LocalFiles`): even answered from the file's run (the
worker's fast path for a whole-file ask), a LOCATE of a 1 GiB file costs a few
milliseconds, and asking for it per ranged read would cost that per part.

Neither path checks the bytes itself: the kernel reads a passthrough file with no
checksum, as it reads any local file. The worker checks the pages it hands over in
the background (shoal.worker.handover.Verified) and drops those found bad.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

from shoal.client.handover import RUN_TYPES
from shoal.core.paging import page_count
from shoal.core.types import NEVER, Dataset, FileInfo
from shoal.errors import IsADirectory, ProtocolError, StaleLayout, Unavailable
from shoal.proto.messages import LocateDirReply, LocateDirRequest, LocateReply, LocateRequest

if TYPE_CHECKING:
    from shoal.client.aio import AsyncClient
    from shoal.client.cache import WorkerAddr

log = logging.getLogger("shoal.client")

#: a descriptor and the file it holds whole
Whole = tuple[int, FileInfo]
K = TypeVar("K")

#: seconds a kept descriptor serves further reads of its file version (LocalFiles)
KEEP_FOR = 10.0
#: descriptors kept at once (each holds its data file, also after the worker evicted it)
KEEP_FDS = 64


async def open_local(client: AsyncClient, path: str, load: bool) -> Whole | None:
    """A new descriptor holding the whole file at offset 0, when a worker on this host
    has every page of it in one data file (a complete large file); else None. With
    ``load=False`` the worker answers from its cache only and never fetches. The caller
    owns (and closes) the descriptor."""
    router = client.router
    ds, np = await router.resolve(path)
    if not np.rel:
        raise IsADirectory(str(np))
    ds.mount(np.mount)
    for w in await router.owners(ds, np.key_path):
        if not router.is_local(w):
            continue
        try:
            try:
                resp = await router.send(w, _whole_file(ds, np.key_path, load), True)
            except StaleLayout:
                ds = await router.dataset(ds.name, refresh=True)
                resp = await router.send(w, _whole_file(ds, np.key_path, load), True)
        except Unavailable as exc:
            router.mark_suspect(w, exc)
            continue
        m = resp.reply
        if m.miss:
            return None
        info = FileInfo(str(np), m.size, m.version, m.mtime)
        client.cache.remember(ds.name, FileInfo(np.key_path, m.size, m.version, m.mtime))
        whole = len(resp.fds) == 1 and _whole(m, ds.policy.page_size)
        for fd in resp.fds[1:] if whole else resp.fds:
            os.close(fd)
        return (resp.fds[0], info) if whole else None
    return None


def _whole(m: LocateReply, ps: int) -> bool:
    """Whether LOCATE answer ``m`` hands over its file whole from offset 0 of its one
    descriptor: as one run (what a worker answers when the file is kept whole), or as
    that descriptor's pages in order from offset 0."""
    run = m.run
    if run:
        return (
            type(run) is list
            and len(run) == 4
            and run[:3] == [0, 0, 0]
            and run[3] == page_count(m.size, ps)
        )
    pages = m.pages
    return (
        bool(pages)
        and m.first == 0
        and all(p[0] == 0 and p[1] == i * ps for i, p in enumerate(pages))
        and len(pages) == page_count(m.size, ps)
    )


async def open_local_dir(client: AsyncClient, path: str) -> dict[str, Whole]:
    """Descriptors of the files of directory ``path`` that :func:`open_local` would
    hand over (``load=False``), by namespace path: those the workers on this host keep
    whole, in one round trip per local worker. Only for datasets that are never
    revalidated (else, and with no local worker, empty: ask :func:`open_local` per
    file). Best effort: a worker that fails is skipped. The caller owns every
    descriptor."""
    router = client.router
    ds, np = await router.resolve(path)
    if ds.policy.staleness != NEVER or not np.mount:
        return {}
    ds.mount(np.mount)
    await router.ring()
    local = [w for w in client.cache.workers.values() if router.is_local(w)]
    asks = [asyncio.ensure_future(_dir_runs(client, w, ds, np.key_path)) for w in local]
    try:
        answers = await asyncio.gather(*asks)
    except BaseException:
        # cancelled (the caller's time limit) or failed: the answers that came, or come
        # still, hold descriptors nobody will take
        for t in asks:
            t.cancel()
            t.add_done_callback(_close_answer)
        raise
    out: dict[str, Whole] = {}
    for got in answers:
        for p, (fd, info) in got.items():
            if p in out:
                os.close(fd)  # a replica's copy: one descriptor is enough
            else:
                out[p] = (fd, info)
    return out


def _close_answer(t: asyncio.Future[dict[str, Whole]]) -> None:
    if not t.cancelled() and t.exception() is None:
        for fd, _info in t.result().values():
            os.close(fd)


async def _dir_runs(client: AsyncClient, w: WorkerAddr, ds: Dataset, key: str) -> dict[str, Whole]:
    """One local worker's files of directory ``key`` kept whole from offset 0."""
    try:
        req = LocateDirRequest(ds.name, key, ds.policy.page_size, ds.generation, True)
        resp = await client.router.send(w, req, True)
    except (Unavailable, ProtocolError, StaleLayout) as exc:
        log.debug("LOCATE_DIR of %s on %s failed: %s", key, w.id, exc)
        return {}
    fds = resp.fds
    try:
        return _whole_runs(ds, key, resp.reply, fds)
    finally:
        for fd in fds:
            if fd >= 0:
                os.close(fd)


def _whole_runs(ds: Dataset, key: str, m: LocateDirReply, fds: list[int]) -> dict[str, Whole]:
    """The runs of answer ``m`` that start a data file of their own, each taking its
    descriptor out of ``fds`` (set to -1 there); anything malformed is left out."""
    ps = ds.policy.page_size
    runs = m.runs
    if type(runs) is not list or len(fds) != len(m.fds) or ps <= 0:
        return {}
    prefix = f"{key}/" if key else ""
    out: dict[str, Whole] = {}
    for r in runs:
        if type(r) is not list or len(r) != 6 or not all(map(isinstance, r, RUN_TYPES)):
            return out
        path, version, size, mtime, slot, offset = r
        if (
            offset != 0
            or not 0 <= slot < len(fds)
            or fds[slot] < 0
            or not path.startswith(prefix)
            or "/" in path[len(prefix) :]
            or page_count(size, ps) < 2
        ):
            continue
        full = f"/{ds.name}/{path}"
        out[full] = (fds[slot], FileInfo(full, size, version, mtime))
        fds[slot] = -1
    return out


class KeptFds(Generic[K]):
    """Descriptors of whole files kept a while for their next use, each with the file
    it holds (its :class:`FileInfo`) and the monotonic time it came; oldest first. Each
    holds its data file open, also after the worker evicted it: none is kept past
    ``keep_for`` seconds or beyond ``limit`` at once."""

    def __init__(self, keep_for: float, limit: int) -> None:
        self.keep_for = keep_for
        self.limit = limit
        self._kept: OrderedDict[K, tuple[int, FileInfo, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def __iter__(self) -> Iterator[K]:
        return iter(self._kept)

    def put(self, key: K, fd: int, info: FileInfo, now: float) -> None:
        """Keep ``fd`` (now this object's) under ``key``, closing the one it replaces
        and the oldest beyond the limit."""
        old = self._kept.pop(key, None)
        if old is not None:
            os.close(old[0])
        self._kept[key] = (fd, info, now)
        while len(self._kept) > self.limit:
            os.close(self._kept.popitem(last=False)[1][0])

    def get(self, key: K) -> Whole | None:
        """The kept descriptor and its file (still this object's), if any."""
        hit = self._kept.get(key)
        return None if hit is None else (hit[0], hit[1])

    def pop(self, key: K) -> Whole | None:
        """The kept descriptor and its file, now the caller's (who closes it)."""
        hit = self._kept.pop(key, None)
        return None if hit is None else (hit[0], hit[1])

    def expire(self, now: float) -> None:
        """Close those kept ``keep_for`` seconds or more."""
        kept = self._kept
        while kept:
            fd, _, at = next(iter(kept.values()))
            if now - at < self.keep_for:
                return
            kept.popitem(last=False)
            os.close(fd)

    def close(self) -> None:
        for fd, _, _ in self._kept.values():
            os.close(fd)
        self._kept.clear()


class LocalFiles:
    """Descriptors from :func:`open_local` (``load=False``) kept ``keep_for`` seconds
    for the next reads of the same file version. A gateway serves a large object as
    many ranged GETs (boto3's transfer manager: 8 MiB parts, 16 at once), and each
    asked the worker for the whole file: then a lookup per page of the file every
    time, 7.5 ms of the worker's CPU per part of a 1 GiB file, 1.1 s per GiB read.
    Now one ask per file version and ``keep_for``; concurrent asks for one version
    share one."""

    def __init__(self, client: AsyncClient, keep_for: float = KEEP_FOR, limit: int = KEEP_FDS):
        self._client = client
        #: by (path, version), each with the time it was asked
        self._kept: KeptFds[tuple[str, str]] = KeptFds(keep_for, limit)
        self._asking: dict[tuple[str, str], asyncio.Future[None]] = {}

    async def open(self, path: str, version: str, size: int) -> int | None:
        """A new descriptor (the caller closes it) of the data file of a worker on this
        host that holds ``path`` at ``version`` (of ``size`` bytes) whole; else None."""
        key = (path, version)
        self._kept.expire(time.monotonic())
        if self._kept.get(key) is None:
            pending = self._asking.get(key)
            if pending is not None:
                await asyncio.shield(pending)
            else:
                await self._ask(key, size)
        hit = self._kept.get(key)
        if hit is None or hit[1].size != size:
            return None
        return os.dup(hit[0])

    async def _ask(self, key: tuple[str, str], size: int) -> None:
        done = self._asking[key] = asyncio.get_running_loop().create_future()
        try:
            got = await self._client.open_local(key[0], load=False)
        finally:
            del self._asking[key]
            done.set_result(None)
        if got is None:
            return
        fd, info = got
        if (info.version, info.size) != (key[1], size):
            os.close(fd)  # another version than the caller serves
            return
        self._kept.put(key, fd, info, time.monotonic())

    def close(self) -> None:
        self._kept.close()


def _whole_file(ds: Dataset, key: str, load: bool) -> LocateRequest:
    """LOCATE of a whole file (``load=False``: cached only, never fetched)."""
    ps, gen = ds.policy.page_size, ds.generation
    return LocateRequest(ds.name, key, None, 0, -1, not load, 0, ps, gen, True)

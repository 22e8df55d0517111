"""Whole cached files handed over as descriptors, for FUSE passthrough and mmap: a file
of several pages that a worker on this host keeps whole in a data file of its own,
from offset 0, so that the data file *is* the file's bytes.

One file at a time (:func:`open_local`: a LOCATE of the whole file), or every such
file of a directory at once (:func:`open_local_dir`: one LOCATE_DIR with runs per
local worker). A mount's first open of each large file of a directory would otherwise
cost one round trip to the worker per file: about 0.6 ms each, most of it in the
mount's own single thread, which held the first warm pass over a mixed dataset at
about half the rate of the passes after it.

Neither path checks the bytes itself: the kernel reads a passthrough file with no
checksum, as it reads any local file. The worker checks the pages it hands over in
the background (shoal.worker.handover.Verified) and drops those found bad.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from shoal.core.paging import page_count
from shoal.core.types import NEVER, Dataset, FileInfo
from shoal.errors import IsADirectory, ProtocolError, StaleLayout, Unavailable
from shoal.proto.messages import LocateDirReply, LocateDirRequest, LocateRequest

if TYPE_CHECKING:
    from shoal.client.aio import AsyncClient
    from shoal.client.cache import WorkerAddr

log = logging.getLogger("shoal.client")

#: a descriptor and the file it holds whole
Whole = tuple[int, FileInfo]


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
    answers = await asyncio.gather(*(_dir_runs(client, w, ds, np.key_path) for w in local))
    out: dict[str, Whole] = {}
    for got in answers:
        for p, (fd, info) in got.items():
            if p in out:
                os.close(fd)  # a replica's copy: one descriptor is enough
            else:
                out[p] = (fd, info)
    return out


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
        if type(r) is not list or len(r) != 6:
            return out
        path, version, size, mtime, slot, offset = r
        if (
            type(path) is not str
            or type(version) is not str
            or type(size) is not int
            or not isinstance(mtime, (int, float))
            or type(slot) is not int
            or offset != 0
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


def _whole_file(ds: Dataset, key: str, load: bool) -> LocateRequest:
    """LOCATE of a whole file (``load=False``: cached only, never fetched)."""
    return LocateRequest(ds.name, key, None, 0, -1, not load, 0, ds.policy.page_size, ds.generation)

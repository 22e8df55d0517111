"""Batched reads of whole small files (``cat_many``): what the short circuit already
holds is read here, a local worker is asked once per directory for what it has cached
(LOCATE_DIR), and the rest goes in one BATCH per owner (at most ``wire.MAX_BATCH`` paths
each); a file a batch does not carry (larger than a page, or a bad checksum) is read on
its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

import xxhash

from shoal.client.cache import WorkerAddr
from shoal.client.local import read_located
from shoal.core.types import NEVER, Dataset, FileInfo, NsPath
from shoal.errors import IsADirectory, ShoalError, Unavailable
from shoal.proto.messages import BatchRequest, ItemStatus
from shoal.proto.wire import MAX_BATCH

if TYPE_CHECKING:
    from shoal.client.aio import AsyncClient

Groups = dict[tuple[str, str], list[tuple[str, NsPath]]]


async def cat_many(client: AsyncClient, paths: Iterable[str]) -> dict[str, bytes | ShoalError]:
    """Whole files, batched: one request per worker for the files it owns."""
    out: dict[str, bytes | ShoalError] = {}
    groups: Groups = {}
    for p in paths:
        try:
            ds, np = await client.router.resolve(p)
            if not np.rel:
                raise IsADirectory(str(np))
            ds.mount(np.mount)
        except ShoalError as exc:
            out[p] = exc
            continue
        fast = read_located(client.cache, ds, np.key_path, 0, -1)
        if fast is not None:
            out[p] = fast
            continue
        owners = await client.router.owners(ds, np.key_path)
        if not owners:
            out[p] = Unavailable("no live workers in the ring")
            continue
        groups.setdefault((ds.name, owners[0].id), []).append((p, np))
    await _locate_dirs(client, groups, out)
    client.hits.flush_touches_maybe()
    # a worker takes at most MAX_BATCH paths per BATCH: larger groups go in chunks
    await asyncio.gather(
        *(
            _batch(client, ds, wid, items[i : i + MAX_BATCH], out)
            for (ds, wid), items in groups.items()
            for i in range(0, len(items), MAX_BATCH)
        )
    )
    return out


async def _locate_dirs(
    client: AsyncClient,
    groups: Groups,
    out: dict[str, bytes | ShoalError],
) -> None:
    """For local workers: learn the cached files of the batch's directories (once per
    process), then serve what that covers with pread and leave the rest to BATCH."""
    todo: list[tuple[WorkerAddr, Dataset, list[str]]] = []
    router = client.router
    for (dsname, wid), items in groups.items():
        w = client.cache.workers.get(wid)
        hit = client.cache.datasets.get(dsname)
        if w is None or hit is None or not router.is_local(w) or hit[0].policy.staleness != NEVER:
            continue
        dirs = {np.key_path.rpartition("/")[0] for _, np in items}
        due = [d for d in dirs if client.cache.dir_due((wid, dsname, d))]
        if due:
            todo.append((w, hit[0], due))
    if not todo:
        return
    await asyncio.gather(*(client.short.locate_or_suspect(w, ds, dirs) for w, ds, dirs in todo))
    for (dsname, _), items in groups.items():
        dset = client.cache.datasets[dsname][0]
        rest = []
        for p, np in items:
            fast = read_located(client.cache, dset, np.key_path, 0, -1)
            if fast is None:
                rest.append((p, np))
            else:
                out[p] = fast
        items[:] = rest


async def _batch(
    client: AsyncClient,
    dsname: str,
    wid: str,
    items: list[tuple[str, NsPath]],
    out: dict[str, bytes | ShoalError],
) -> None:
    ds = await client.router.dataset(dsname)
    w = client.cache.workers[wid]
    retry: list[str] = []
    try:
        req = BatchRequest(ds.name, tuple(np.key_path for _, np in items), ds.generation)
        resp = await client.router.send(w, req)
    except Unavailable as exc:
        client.router.mark_suspect(w, exc)
        retry = [p for p, _ in items]
    else:
        view = memoryview(resp.data)
        pos = 0
        for (p, _), it in zip(items, resp.reply.items, strict=True):
            if it.status == ItemStatus.OK:
                size = it.size
                chunk = view[pos : pos + size]
                pos += size
                if len(chunk) != size or xxhash.xxh3_64_intdigest(chunk) != it.checksum:
                    retry.append(p)
                    continue
                client.cache.remember(ds.name, FileInfo(it.path, size, it.version))
                out[p] = bytes(chunk)
            elif it.status == ItemStatus.NOT_SMALL:
                retry.append(p)  # larger than a page: read it in pages
            else:
                out[p] = it.error()
        c = client.cache.counters
        if client.router.is_local(w):
            c.local += 1
            c.bytes_local += len(resp.data)
        else:
            c.remote += 1
            c.bytes_remote += len(resp.data)

    async def one(p: str) -> None:
        try:
            out[p] = await client.read(p)
        except ShoalError as exc:
            out[p] = exc

    await asyncio.gather(*(one(p) for p in retry))

"""File metadata for the client: ``stat`` and ``ls`` from this process's metadata
cache, the dataset's manifest, what this host's other client processes listed
(:mod:`shoal.client.hostmeta`: a fresh process's first stats need no round trip),
a listing of the directory (once for many stats that missed in it) or, last, a
worker's answer. Every listing got from a worker goes to the host's cache too.

One part of :class:`~shoal.client.aio.AsyncClient`, built on its router (owners and
failover) and control plane (manifests, the list of datasets).
"""

from __future__ import annotations

import asyncio
import logging
import time

from shoal.client.control import ControlPlane
from shoal.client.hostmeta import HostMeta, Space
from shoal.client.routing import Router
from shoal.config import token_for
from shoal.core.types import NEVER, Dataset, FileInfo, NsPath, split_path
from shoal.errors import ShoalError
from shoal.proto.messages import ListRequest, StatRequest

log = logging.getLogger("shoal.client")


class Metadata:
    """``stat`` and ``ls`` through ``router`` and ``control``."""

    def __init__(self, router: Router, control: ControlPlane) -> None:
        self.router = router
        self.control = control
        self.cache = router.cache
        #: directories being listed for stats that missed (see _stat_by_listing)
        self._listing: dict[tuple[str, str], asyncio.Task[None]] = {}
        settings = router.settings
        self.host = HostMeta(
            settings.master, token=lambda: settings.token or token_for(settings.master)
        )
        self.cache.host = self.host

    async def stat(self, path: str) -> FileInfo:
        ds, np = await self.router.resolve(path)
        if not np.mount:
            return FileInfo(str(np), 0, "", 0.0, True)
        if not np.rel:
            ds.mount(np.mount)
            return FileInfo(str(np), 0, "", 0.0, True)
        info = _complete(self.cache.info(ds, np.key_path))
        man = await self.control.manifest(ds) if info is None else None
        if man is not None:
            e = man.get(np.key_path)
            if e is not None:
                info = e.info()
                self.cache.remember(ds.name, info)
            elif man.is_dir(np.key_path):
                return FileInfo(str(np), 0, "", 0.0, True)
        if info is None and man is None:
            info = self._from_host(ds, np.key_path)
        if info is None and man is None:
            info = await self._stat_by_listing(ds, np)
        if info is None:
            req = StatRequest(ds.name, np.key_path, ds.generation)
            info = (await self.router.with_failover(ds, np, req)).reply.info
            if not info.is_dir:
                self.cache.remember(ds.name, info)
        return FileInfo(str(np), info.size, info.version, info.mtime, info.is_dir)

    def _from_host(self, ds: Dataset, path: str) -> FileInfo | None:
        """A stat that missed: what another process on this host listed, if within the
        bound. The host's listings are read at the first miss in a dataset, and looked
        at again (RECHECK apart) at later misses; once read, they answer on the
        caller's thread too (ClientCache.meta)."""
        spaces = self.cache.meta.spaces
        space: Space | None = spaces.get(ds.name)
        if space is None:
            space = self.host.space(ds)
            if space is None:
                return None
            spaces[ds.name] = space
        elif space.due():
            space.refresh()
        got = space.lookup(path)
        if got is None:
            return None
        info, at = got
        bound = ds.policy.staleness
        if bound != NEVER and time.monotonic() - at > bound:
            return None
        self.cache.remember(ds.name, info, at)  # a located small file: its page record
        return _complete(info)

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
        self.cache.walking.add(ds.name)
        np = split_path(f"/{ds.name}/{directory}")
        req = ListRequest(ds.name, directory, ds.generation)
        try:
            resp = await self.router.with_failover(ds, np, req)
        except ShoalError as exc:  # the stat asks for itself
            log.debug("listing /%s/%s for stats failed: %s", ds.name, directory, exc)
            return
        now = self.cache.datasets.get(ds.name)
        if now is None or now[0].generation != ds.generation:
            return  # a sync or policy change meanwhile: what it listed may be stale
        for e in resp.reply.entries:
            if not e.is_dir:
                self.cache.remember(ds.name, e)
        self.host.put(ds, directory, resp.reply.entries)

    async def ls(self, path: str) -> list[FileInfo]:
        if split_path_or_root(path) is None:
            return [FileInfo("/" + d.name, 0, "", 0.0, True) for d in await self.control.datasets()]
        ds, np = await self.router.resolve(path)
        if not np.mount:
            return [FileInfo(f"/{ds.name}/{m.name}", 0, "", 0.0, True) for m in ds.mounts]
        ds.mount(np.mount)
        man = await self.control.manifest(ds)
        if man is not None:
            if man.is_dir(np.key_path):
                return man.ls(np.key_path, f"/{ds.name}/")
            entry = man.get(np.key_path)
            if entry is not None:
                e = entry.info()
                return [FileInfo(f"/{ds.name}/{e.path}", e.size, e.version, e.mtime, e.is_dir)]
        req = ListRequest(ds.name, np.key_path, ds.generation)
        resp = await self.router.with_failover(ds, np, req)
        out = []
        for e in resp.reply.entries:
            if not e.is_dir:
                self.cache.remember(ds.name, e)
            out.append(FileInfo(f"/{ds.name}/{e.path}", e.size, e.version, e.mtime, e.is_dir))
        now = self.cache.datasets.get(ds.name)
        if now is not None and now[0].generation == ds.generation:  # else a sync meanwhile
            self.host.put(ds, np.key_path, resp.reply.entries)
        return out


def split_path_or_root(path: str) -> NsPath | None:
    p = path[len("shoal://") :] if path.startswith("shoal://") else path
    if p.strip("/") == "":
        return None
    return split_path(path)


def _complete(info: FileInfo | None) -> FileInfo | None:
    """Cached metadata a stat can answer with: not what LOCATE_DIR taught (a located
    small file's size and version, without its mtime)."""
    return info if info is not None and (info.mtime_ns or info.mtime) else None

"""``shoal://`` for fsspec: a read-only AsyncFileSystem over :class:`AsyncClient`.

Two ways in. ``shoal://<dataset>/<mount>/<path>`` names the unified namespace; the
chained form ``shoal::s3://bucket/key`` keeps a user's original URL and maps it to the
dataset whose mount URI is its longest prefix (the master's dataset list, fetched once).
Whole-file reads of many paths (``cat``) are one batched request per worker; byte
ranges of files known to be small ride the same batch, the rest are ranged reads.
Opened files read through :class:`~shoal.readahead.PatternCache` (readahead for
sequential reads, exact fetches after a seek) unless a ``cache_type`` is given, and a
block already on the local worker is a ``pread`` on the caller's thread.

Storage options: shoal's own (``master``, ``client_options`` or any ClientSettings
field, ``unmounted``), fsspec's standard ones (``block_size``, ``cache_type``,
``cache_options``, ``use_listings_cache``, ``listings_expiry_time``, ``max_paths``,
``skip_instance_cache``, ...), honoured; keys meant for other filesystems, which
frameworks pass to every filesystem (Hugging Face's ``hf``, ``client_kwargs``), are
ignored as fsspec's built-in filesystems do; a near miss of one of ours is an error.

A chained URL that no dataset mounts (``shoal::s3://other-bucket/key``) is read
through the underlying fsspec filesystem with the caller's own options and
credentials, uncached, logged once per bucket and counted in ``unmounted_stats``
(``unmounted="raise"``: FileNotFoundError); see shoal.fsspec_unmounted for why.

Instances pickle to their constructor arguments (with the master resolved) and
survive ``fork``: the AsyncClient is bound to one (process, event loop) pair and is
rebuilt for another, keeping the client cache (metadata, ring, descriptors).
Writes raise ``PermissionError(EROFS)``: shoal is a cache; write to under storage.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import fsspec
from fsspec.asyn import AsyncFileSystem, get_loop, sync
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.spec import make_instance

from shoal import fsspec_options as options
from shoal.client.aio import AsyncClient
from shoal.client.cache import ClientCache
from shoal.config import ClientSettings, master_from_env
from shoal.core.types import FileInfo, split_path
from shoal.errors import ShoalError
from shoal.fsspec_file import (
    ClientConn,
    ShoalFile,
    read_here,
    read_only,
    refuse,
    refuse_async,
    stat_here,
)
from shoal.fsspec_unmounted import Underlying, UnmountedStats
from shoal.proto import wire
from shoal.readahead import PatternCache

log = logging.getLogger("shoal.fsspec")

#: default block for opened files: the most a sequential reader fetches ahead at once
DEFAULT_BLOCK = 4 << 20
#: default cache of opened files (see shoal.readahead)
DEFAULT_CACHE = PatternCache.name
#: a byte range of a file at most this big is served from a batched whole-file read
SMALL_FILE = 1 << 20


def _strip_uri(uri: str) -> str:
    return uri.split("://", 1)[-1].strip("/")


class ShoalFileSystem(AsyncFileSystem, ChainedFileSystem):
    """fsspec filesystem over a shoal cluster.

    ``master``: the master URL (default: ``$SHOAL_MASTER``). ``client_options`` (or the
    same keys at the top): further :class:`~shoal.config.ClientSettings` fields
    (``short_circuit``, ``request_timeout``, ...). ``block_size``, ``cache_type`` and
    ``cache_options``: defaults for opened files. ``unmounted``: ``"read"`` (a chained
    URL no dataset mounts is read through the underlying filesystem) or ``"raise"``.
    ``target_protocol``/``target_options``/``fo`` are set by fsspec for a chained URL
    (``shoal::s3://...``); the target's options serve only unmounted URLs, since the
    workers read under storage with their own credentials.
    """

    protocol: ClassVar[str | tuple[str, ...]] = ("shoal",)
    root_marker = ""
    # one instance serves every file of a chained URL, not one per file
    _strip_tokenize_options = ("fo",)

    def __init__(
        self,
        master: str | None = None,
        *,
        client_options: Mapping[str, Any] | None = None,
        unmounted: str = "read",
        target_protocol: str | None = None,
        target_options: Mapping[str, Any] | None = None,
        fo: str | None = None,
        asynchronous: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
        batch_size: int | None = None,
        block_size: int | None = None,
        cache_type: str | None = None,
        cache_options: Mapping[str, Any] | None = None,
        **storage_options: Any,
    ) -> None:
        # before fsspec's loop thread may start: see wire.make_room_for_fds
        wire.make_room_for_fds()
        # s3fs's and gcsfs's names for the same
        alias_block = storage_options.pop("default_block_size", None)
        alias_cache = storage_options.pop("default_cache_type", None)
        block_size = alias_block if block_size is None else block_size
        options.check_block_size(block_size)
        options.check_unmounted(unmounted)
        opts = options.client_options(client_options, storage_options)
        # fsspec's listings cache is off unless asked for: the client's metadata cache
        # already follows each dataset's staleness bound
        storage_options.setdefault("use_listings_cache", False)
        super().__init__(
            asynchronous=asynchronous, loop=loop, batch_size=batch_size, **storage_options
        )
        self.settings = ClientSettings(master=master_from_env(master), **opts)
        self.block_size = DEFAULT_BLOCK if block_size is None else block_size
        self.cache_type = cache_type or alias_cache or DEFAULT_CACHE
        self.cache_options = dict(cache_options or {})
        self.unmounted = unmounted
        self.target_protocol = target_protocol
        self._under = Underlying(target_protocol or "", dict(target_options or {}))
        self.client_cache = ClientCache()
        self._conn = ClientConn()
        self._prefixes: list[tuple[str, str, str]] | None = None  # (uri prefix, ds, mount)
        weakref.finalize(self, self._conn.close)

    def __reduce__(self) -> tuple[Any, ...]:
        # pickles (spawned DataLoader workers) must not depend on the environment
        opts = {**self.storage_options, "master": self.settings.master}
        return make_instance, (type(self), self.storage_args, opts)

    # -- loop and client per process ----------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        pid: int = self._pid  # type: ignore[has-type]
        if pid != os.getpid():  # forked: fsspec gave the child a fresh io loop
            self._pid = os.getpid()
            if not self.asynchronous:
                self._loop = get_loop()
        loop: asyncio.AbstractEventLoop = self._loop
        return loop

    def client(self) -> AsyncClient:
        """The AsyncClient for the running loop in this process (made on first use)."""
        return self._conn.get(self.settings, self.client_cache)

    def close(self) -> None:
        """Close connections now (they are also closed at interpreter exit)."""
        self._conn.close()

    # -- paths ----------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        p = str(path)
        if p.startswith("shoal::"):
            p = p[len("shoal::") :]
        if "://" in p:
            p = p.split("://", 1)[1]
        return p.strip("/")

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        return {}

    async def _ns(self, path: str) -> str:
        """The namespace path '/<dataset>/<mount>/<rel>' for a path of this filesystem."""
        ns = await self._route(path)
        if ns is None:
            raise self._not_mounted(path)
        return ns

    async def _route(self, path: str) -> str | None:
        """The namespace path, or None for a chained URL no dataset mounts that is to be
        read through the underlying filesystem (``unmounted="read"``)."""
        p = self._strip_protocol(path)
        if self.target_protocol is None:
            return "/" + p
        for refresh in (False, True):
            hit = await self._mount_of(p, refresh)
            if hit is not None:
                prefix, ds, mount = hit
                rel = p[len(prefix) :].strip("/")
                return f"/{ds}/{mount}/{rel}" if rel else f"/{ds}/{mount}"
        if self.unmounted == "raise":
            raise self._not_mounted(path)
        self._under.note(p)
        return None

    def _not_mounted(self, path: str) -> FileNotFoundError:
        p = self._strip_protocol(path)
        return FileNotFoundError(
            errno.ENOENT,
            f"no shoal dataset mounts {self.target_protocol}://{p}: create one with "
            f"`shoal dataset create NAME --mount NAME={self.target_protocol}://...`",
            path,
        )

    @property
    def unmounted_stats(self) -> UnmountedStats:
        """Reads of chained URLs no dataset mounts (served by the underlying filesystem)."""
        return self._under.stats

    async def _mount_of(self, p: str, refresh: bool) -> tuple[str, str, str] | None:
        if self._prefixes is None or refresh:
            protos = {self.target_protocol}
            try:
                cls_proto = fsspec.get_filesystem_class(self.target_protocol).protocol
                protos |= {cls_proto} if isinstance(cls_proto, str) else set(cls_proto)
            except (ValueError, ImportError):
                pass
            found = []
            for ds in await self.client().datasets():
                for m in ds.mounts:
                    if m.uri.split("://", 1)[0] in protos:
                        found.append((_strip_uri(m.uri), ds.name, m.name))
            self._prefixes = sorted(found, key=lambda t: -len(t[0]))
        for prefix, name, mount in self._prefixes:
            if not prefix or p == prefix or p.startswith(prefix + "/"):
                return prefix, name, mount
        return None

    def _name(self, ns: str) -> str:
        """A namespace path back to this filesystem's naming (the original URL's path)."""
        if self.target_protocol is None:
            return ns.strip("/")
        np = split_path(ns)
        for prefix, ds, mount in self._prefixes or ():
            if ds == np.dataset and mount == np.mount:
                return f"{prefix}/{np.rel}".strip("/") if np.rel else prefix
        return ns.strip("/")

    def _entry(self, info: FileInfo) -> dict[str, Any]:
        return {
            "name": self._name(info.path),
            "size": info.size,
            "type": "directory" if info.is_dir else "file",
            "mtime": info.mtime,
            "version": info.version,
        }

    # -- metadata -------------------------------------------------------------------

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        p = self._strip_protocol(path)
        if p == "" and self.target_protocol is None:
            return {"name": "", "size": 0, "type": "directory"}
        ns = await self._route(p)
        if ns is None:
            return await self._under.info(p)
        try:
            return self._entry(await self.client().stat(ns))
        except ShoalError as exc:
            raise exc.to_oserror(path) from exc

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """fsspec's ``info``: from the client's metadata cache or the dataset's manifest
        on the caller's thread when they hold the path (no hop to fsspec's loop thread,
        which costs more than the lookup), else asked (``_info``). ``open`` starts here."""
        hit = stat_here(self, path)
        if hit is not None:
            return self._entry(hit)
        return sync(self.loop, self._info, path, **kwargs)

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        p = self._strip_protocol(path)
        try:
            out = self.dircache[p]  # holds nothing unless use_listings_cache=True
        except KeyError:
            out = await self._ls_now(p)
            self.dircache[p] = out
        return out if detail else [e["name"] for e in out]

    async def _ls_now(self, p: str) -> list[dict[str, Any]]:
        ns = await self._route(p) if p or self.target_protocol else "/"
        if ns is None:
            return await self._under.ls(p)
        path = p
        aio = self.client()
        try:
            entries = await aio.ls(ns)
        except ShoalError as exc:
            if exc.os_errno == errno.ENOENT:  # no such dataset, mount or path
                raise exc.to_oserror(path) from exc
            entries = []  # listing a file fails in some stores: ask what it is
        if not entries and ns.count("/") >= 3:
            try:
                info = await aio.stat(ns)
            except ShoalError as exc:
                raise exc.to_oserror(path) from exc
            entries = [] if info.is_dir else [info]
        return [self._entry(e) for e in entries]

    async def _exists(self, path: str, **kwargs: Any) -> bool:
        try:
            await self._info(path)
        except FileNotFoundError:
            return False
        return True

    # -- data -----------------------------------------------------------------------

    async def _read(self, path: str, start: int | None, end: int | None) -> bytes:
        ns = await self._route(path)
        if ns is None:
            return await self._under.read(self._strip_protocol(path), start, end)
        aio = self.client()
        try:
            if (start is not None and start < 0) or (end is not None and end < 0):
                size = (await aio.stat(ns)).size
                start = max(0, size + start) if start is not None and start < 0 else start
                end = max(0, size + end) if end is not None and end < 0 else end
            off = start or 0
            length = -1 if end is None else max(0, end - off)
            return await aio.read(ns, off, length)
        except ShoalError as exc:
            raise exc.to_oserror(path) from exc

    async def _cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        return await self._read(path, start, end)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """fsspec's ``cat_file``: pages already located on the local worker are read on
        the caller's thread (``pread`` and checksum, the client's fast path); the rest
        through fsspec's loop (``_cat_file``)."""
        if (start or 0) >= 0 and (end is None or end >= 0):
            off = start or 0
            data = read_here(self, path, off, -1 if end is None else max(0, end - off))
            if data is not None:
                return data
        return sync(self.loop, self._cat_file, path, start=start, end=end, **kwargs)

    async def _cat_many(self, paths: Iterable[str]) -> dict[str, bytes | OSError]:
        """Whole files by this filesystem's paths: one request per worker."""
        by_ns: dict[str, str] = {}
        out: dict[str, bytes | OSError] = {}
        for p in dict.fromkeys(paths):
            ns = await self._route(p)
            if ns is not None:
                by_ns[ns] = p
                continue
            try:
                out[p] = await self._under.read(self._strip_protocol(p), None, None)
            except OSError as exc:
                out[p] = exc
        got = await self.client().cat_many(list(by_ns)) if by_ns else {}
        for ns, p in by_ns.items():
            v = got[ns]
            out[p] = v.to_oserror(p) if isinstance(v, ShoalError) else v
        return out

    async def _cat(
        self,
        path: Any,
        recursive: bool = False,
        on_error: str = "raise",
        batch_size: int | None = None,
        **kwargs: Any,
    ) -> Any:
        paths = await self._expand_path(path, recursive=recursive)
        got = await self._cat_many(paths)
        out = [got[p] for p in paths]
        if on_error == "raise":
            ex = next((v for v in out if isinstance(v, BaseException)), None)
            if ex is not None:
                raise ex
        if len(paths) > 1 or isinstance(path, list) or paths[0] != self._strip_protocol(path):
            return {
                k: v
                for k, v in zip(paths, out, strict=True)
                if on_error != "omit" or not isinstance(v, BaseException)
            }
        return out[0]

    async def _cat_ranges(
        self,
        paths: list[str],
        starts: Any,
        ends: Any,
        max_gap: int | None = None,
        batch_size: int | None = None,
        on_error: str = "return",
        **kwargs: Any,
    ) -> list[bytes | BaseException]:
        if not isinstance(paths, list):
            raise TypeError("paths must be a list")
        n = len(paths)
        starts = list(starts) if isinstance(starts, Iterable) else [starts] * n
        ends = list(ends) if isinstance(ends, Iterable) else [ends] * n
        if len(starts) != n or len(ends) != n:
            raise ValueError("paths, starts and ends must have the same length")
        # whole files, and ranges of files known to be small, ride one batch
        whole = [
            p
            for p, s, e in zip(paths, starts, ends, strict=True)
            if (not s and e is None) or ((s or 0) >= 0 and (e or 0) >= 0 and await self._small(p))
        ]
        batch = await self._cat_many(whole) if whole else {}

        async def one(p: str, s: int | None, e: int | None) -> bytes | BaseException:
            if p in batch:
                v = batch[p]
                return v if isinstance(v, BaseException) else v[s or 0 : e]
            try:
                return await self._read(p, s, e)
            except OSError as exc:
                return exc

        out = await asyncio.gather(*(one(*t) for t in zip(paths, starts, ends, strict=True)))
        if on_error != "return":
            ex = next((v for v in out if isinstance(v, BaseException)), None)
            if ex is not None:
                raise ex
        return list(out)

    async def _small(self, path: str) -> bool:
        """True when the file's size is known (no round trip) and at most SMALL_FILE."""
        ns = await self._route(path)
        if ns is None:
            return False
        np = split_path(ns)
        hit = self.client_cache.datasets.get(np.dataset)
        info = self.client_cache.info(hit[0], np.key_path) if hit is not None and np.rel else None
        return info is not None and info.size <= SMALL_FILE

    async def _get_file(self, rpath: str, lpath: str, **kwargs: Any) -> None:
        info = await self._info(rpath)
        if info["type"] == "directory":
            os.makedirs(lpath, exist_ok=True)
            return
        with open(lpath, "wb") as f:
            pos = 0
            while True:
                chunk = await self._read(rpath, pos, pos + DEFAULT_BLOCK)
                f.write(chunk)
                pos += len(chunk)
                if len(chunk) < DEFAULT_BLOCK or pos >= info["size"]:
                    break

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> ShoalFile:
        if mode != "rb":
            raise read_only(path)
        return ShoalFile(
            self,
            path,
            mode,
            block_size=self.block_size if block_size is None else block_size,
            cache_type=kwargs.get("cache_type") or self.cache_type,
            cache_options=self.cache_options if cache_options is None else cache_options,
            size=kwargs.get("size"),
        )

    # -- writes: refused (the sync forms are derived from these) ----------------------

    _pipe_file = _rm_file = _rm = _mkdir = _makedirs = refuse_async(0)
    _put_file = _cp_file = refuse_async(1)
    rmdir = touch = refuse(0)
    mv = refuse(1)

    def created(self, path: str) -> Any:
        raise NotImplementedError("shoal does not know creation times; see modified()")

    def modified(self, path: str) -> Any:
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], datetime.UTC)

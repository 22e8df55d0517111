"""The generic UnderStore over any fsspec filesystem, and the base of the s3 and
webhdfs drivers.

An AsyncFileSystem is driven natively through its ``_info/_ls/_cat_file/_find``
coroutines; a sync filesystem is called through ``asyncio.to_thread``. The fsspec
instance is created lazily, on first use, for the event loop and process that use it:
a store constructed anywhere (or inherited across fork, or reused by a new
``asyncio.run``) builds a fresh instance instead of touching a session bound to a
dead loop. One instance is kept at a time; a store alternating between two live
loops would rebuild it on each switch, so give each loop its own store.

fsspec's listing cache is always off: caching metadata is shoal's job, and a stale
listing would hide a changed version.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from fsspec.spec import AbstractFileSystem

from shoal.core.types import FileInfo
from shoal.errors import FatalStoreError, InvalidArgument, StaleVersion
from shoal.ufs.base import UnderStore
from shoal.ufs.errors import DEFAULT_RETRY, RetryPolicy, StoreHealth, call_with_retry
from shoal.ufs.options import check_known, coerce_like
from shoal.ufs.paths import clean_rel, join, mtime_of, redact_uri, relative, version_of

log = logging.getLogger("shoal.ufs.fsspec")

T = TypeVar("T")
FsFactory = Callable[[asyncio.AbstractEventLoop], AbstractFileSystem]


class FsspecStore(UnderStore):
    """An UnderStore over one fsspec filesystem rooted at ``root`` (a backend path)."""

    scheme = "fsspec"
    #: driver-specific exception types that are backend failures, not bugs
    backend_errors: tuple[type[BaseException], ...] = ()

    def __init__(
        self,
        uri: str,
        root: str,
        make_fs: FsFactory,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        store_name: str | None = None,
    ) -> None:
        self._uri = redact_uri(uri).rstrip("/")
        self.scheme = uri.split("://", 1)[0] if "://" in uri else "file"
        self._root = root.rstrip("/") if root not in ("", "/") else root
        self._make_fs = make_fs
        self._retry = retry
        self._fs: AbstractFileSystem | None = None
        self._fs_loop: asyncio.AbstractEventLoop | None = None
        self._fs_pid = 0
        #: secret values blanked out of messages; drivers add what they read
        self._scrub: list[str] = []
        #: whether the store answers, shared by every operation (see StoreHealth);
        #: ``store_name`` says where it is in messages (an S3 endpoint, ...)
        self._health = StoreHealth(store_name or self._uri, retry)

    # -- plumbing -------------------------------------------------------------

    def describe(self) -> str:
        return self._uri

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"

    def _where(self, rel: str) -> str:
        return f"{self._uri}/{rel}" if rel else self._uri

    def _bound_fs(self) -> AbstractFileSystem:
        """The fsspec instance for the running loop and process, built on demand."""
        loop = asyncio.get_running_loop()
        fs = self._fs
        stale = fs is None or self._fs_pid != os.getpid()
        if fs is not None and not stale and getattr(fs, "async_impl", False):
            stale = self._fs_loop is not loop
        if stale:
            if fs is not None:
                log.debug("rebuilding filesystem for %s in a new loop or process", self._uri)
                self._discard(fs)
            fs = self._make_fs(loop)
            self._fs, self._fs_loop, self._fs_pid = fs, loop, os.getpid()
        assert fs is not None
        return fs

    def _discard(self, fs: AbstractFileSystem) -> None:
        """Drop an instance bound to another loop or process (hook for drivers)."""

    async def _run(self, rel: str, op: Callable[[AbstractFileSystem], Awaitable[T]]) -> T:
        async def once() -> T:
            return await op(self._bound_fs())

        return await call_with_retry(
            once,
            self._where(rel),
            policy=self._retry,
            scrub=self._scrub,
            extra=self.backend_errors,
            health=self._health,
        )

    async def _fs_call(self, rel: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``fs._method(...)`` on async filesystems, ``fs.method(...)`` in a thread otherwise."""

        async def op(fs: AbstractFileSystem) -> Any:
            if getattr(fs, "async_impl", False):
                return await getattr(fs, "_" + method)(*args, **kwargs)
            return await asyncio.to_thread(getattr(fs, method), *args, **kwargs)

        return await self._run(rel, op)

    def _to_info(self, d: Mapping[str, Any]) -> FileInfo:
        is_dir = d.get("type") == "directory"
        size = 0 if is_dir else int(d.get("size") or 0)
        mtime = mtime_of(dict(d))
        return FileInfo(
            path=relative(self._root, str(d["name"])),
            size=size,
            version=version_of(dict(d), size, mtime),
            mtime=mtime,
            is_dir=is_dir,
        )

    def _full(self, rel: str) -> str:
        return join(self._root, rel)

    # -- the UnderStore interface ---------------------------------------------

    async def info(self, path: str) -> FileInfo:
        rel = clean_rel(path)
        d = await self._fs_call(rel, "info", self._full(rel))
        return self._to_info(d)

    async def ls(self, path: str) -> list[FileInfo]:
        rel = clean_rel(path)
        full = self._full(rel)
        entries = await self._fs_call(rel, "ls", full, detail=True)
        return self._children(rel, [self._to_info(e) for e in entries])

    def _children(self, rel: str, infos: list[FileInfo]) -> list[FileInfo]:
        """What a backend listed for directory ``rel`` as ``ls`` answers it: sorted, without
        the directory itself; a lone file named ``rel`` means ``rel`` is a file."""
        if len(infos) == 1 and not infos[0].is_dir and infos[0].path == rel and rel:
            raise _not_a_dir(self._where(rel))
        infos = [i for i in infos if i.path != rel]  # some backends list the dir itself
        return sorted(infos, key=lambda i: i.path)

    async def walk(self, path: str = "") -> AsyncIterator[FileInfo]:
        rel = clean_rel(path)
        found = await self._fs_call(rel, "find", self._full(rel), detail=True)
        if not found:
            await self.info(rel)  # NotFound for a missing path; an empty dir yields nothing
        for d in found.values():
            if d.get("type") != "directory":
                yield self._to_info(d)

    async def read(self, path: str, start: int, end: int, version: str | None = None) -> bytes:
        rel = clean_rel(path)
        check_range(start, end)
        if start == end:
            return b""
        data = await self._fs_call(rel, "cat_file", self._full(rel), start=start, end=end)
        if version is not None:
            await self._check_version(rel, version)
        return bytes(data)

    async def _check_version(self, rel: str, version: str) -> None:
        """After a read the backend could not condition: fail if the file changed."""
        now = await self.info(rel)
        if now.version != version:
            raise StaleVersion(
                f"{self._where(rel)}: changed (version {now.version}, wanted {version})"
            )

    async def close(self) -> None:
        fs, self._fs = self._fs, None
        if fs is not None and self._fs_loop is asyncio.get_running_loop():
            closer = getattr(fs, "close", None) or getattr(fs, "_close", None)
            if closer is not None and inspect.iscoroutinefunction(closer):
                await closer()


def _not_a_dir(where: str) -> FatalStoreError:
    exc = FatalStoreError(f"{where}: not a directory")
    exc.errno = 20  # ENOTDIR
    return exc


def check_range(start: int, end: int) -> None:
    if start < 0 or end < start:
        raise InvalidArgument(f"invalid range [{start}, {end}): need 0 <= start <= end")


def constructor_options(cls: Any, options: Mapping[str, str], scheme: str) -> dict[str, Any]:
    """Options named by ``cls.__init__`` parameters, coerced to their defaults' types.

    A filesystem whose constructor takes ``**kwargs`` does not get them: an option the
    constructor does not name is a typo until proven otherwise.
    """
    params = {
        name: p
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    known = [n for n in params if n not in ("asynchronous", "loop", "skip_instance_cache")]
    check_known(scheme, options, known)
    out: dict[str, Any] = {}
    for key, value in options.items():
        default = params[key].default
        out[key] = coerce_like(key, value, None if default is inspect.Parameter.empty else default)
    return out


def open_generic(
    uri: str, options: Mapping[str, str], *, retry: RetryPolicy = DEFAULT_RETRY
) -> FsspecStore:
    """An FsspecStore for any registered fsspec protocol (memory://, gcs://, http:// ...)."""
    import fsspec

    protocol = uri.split("://", 1)[0]
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else "not available"
        raise InvalidArgument(f"cannot open {protocol}:// URIs: {msg}") from None
    kwargs = constructor_options(cls, options, protocol)
    url_kwargs = {k: v for k, v in cls._get_kwargs_from_urls(uri).items() if k not in kwargs}
    root = cls._strip_protocol(uri)
    is_async = bool(getattr(cls, "async_impl", False))
    takes_any = any(
        p.kind is p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values()
    )
    fixed: dict[str, Any] = {"use_listings_cache": False} if takes_any else {}

    def make_fs(loop: asyncio.AbstractEventLoop) -> AbstractFileSystem:
        extra: dict[str, Any] = {"asynchronous": True, "loop": loop} if is_async else {}
        return cls(skip_instance_cache=True, **fixed, **url_kwargs, **kwargs, **extra)

    return FsspecStore(uri, root, make_fs, retry=retry)

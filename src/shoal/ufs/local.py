"""The file:// driver: a local or NFS-mounted directory, with direct os calls.

Blocking calls run in the default thread pool (threads are reused, not spawned per
read). A read opens the file once and checks its version with fstat on the same
descriptor before and after ``pread``, so a version check costs no extra path lookup.
Paths may not climb above the root ('..' is refused). Symbolic links are followed
only while they stay inside the mount root (resolved, also through linked
directories): a link that leads out of it is left out of listings and walks, and
stat or read through it is refused (PermissionDenied), so a link to / lists nothing
of the host and no byte of a file outside the root is ever returned. Reads check the
file actually opened (/proc/self/fd), so swapping a link between check and open
does not get around the rule. Broken links are left out like missing files.

A link to a file inside the root is described by its target (size, version, mtime:
what stat(2) says) with ``FileInfo.link`` set to the target's path relative to the
root, so the mount can show it as a link; a link to a directory inside the root is
listed as that directory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TypeVar

from shoal.core.types import FileInfo
from shoal.errors import InvalidArgument, PermissionDenied, ShoalError, StaleVersion
from shoal.ufs.base import UnderStore
from shoal.ufs.errors import (
    DEFAULT_RETRY,
    RetryPolicy,
    backend_errors,
    call_with_retry,
    translate,
)
from shoal.ufs.fsspec_driver import check_range
from shoal.ufs.options import check_known
from shoal.ufs.paths import clean_rel

log = logging.getLogger("shoal.ufs.local")

T = TypeVar("T")
OPTIONS: tuple[str, ...] = ()


def _version(st: os.stat_result) -> str:
    return f"{st.st_size}-{st.st_mtime_ns}"


def _info(rel: str, st: os.stat_result, link: str = "") -> FileInfo:
    is_dir = stat.S_ISDIR(st.st_mode)
    size = 0 if is_dir else st.st_size
    return FileInfo(
        path=rel,
        size=size,
        version=f"{size}-{st.st_mtime_ns}",
        mtime=st.st_mtime,
        is_dir=is_dir,
        mtime_ns=st.st_mtime_ns,
        link="" if is_dir else link,
    )


def _target(real: str, root: str) -> str:
    """A resolved path inside ``root`` as a path relative to it ("." for the root)."""
    return os.path.relpath(real, root)


def _inside(real: str, root: str) -> bool:
    """Whether resolved path ``real`` is the resolved ``root`` or below it."""
    return real == root or real.startswith(root.rstrip("/") + "/")


def _scan(full: str, rel: str, root: str) -> list[tuple[FileInfo, tuple[int, int]]]:
    """Entries of one directory with their (dev, inode); broken links and links that
    leave ``root`` (resolved) are skipped."""
    out = []
    with os.scandir(full) as it:
        for entry in it:
            child = f"{rel}/{entry.name}" if rel else entry.name
            link = ""
            if entry.is_symlink():
                real = os.path.realpath(entry.path)
                if not _inside(real, root):
                    log.debug("skipping %s: a link that leaves the mount root", child)
                    continue
                link = _target(real, root)
            try:
                st = entry.stat()
            except FileNotFoundError:
                log.debug("skipping broken link %s", child)
                continue
            out.append((_info(child, st, link), (st.st_dev, st.st_ino)))
    return out


def _check_inside(full: str, root: str) -> str:
    """The resolved path, if inside ``root``; else PermissionDenied."""
    real = os.path.realpath(full)
    if not _inside(real, root):
        raise PermissionDenied("a symbolic link on this path leaves the mount root")
    return real


def _check_opened(fd: int, full: str, root: str) -> None:
    """The file behind ``fd`` (what was really opened) lies inside ``root``."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: resolve the path instead (racy, but the best there is)
        real = os.path.realpath(full)
    if not _inside(real, root):
        raise PermissionDenied("a symbolic link on this path leaves the mount root")


def _pread(full: str, start: int, end: int, version: str | None, root: str) -> bytes:
    fd = os.open(full, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        _check_opened(fd, full, root)
        if version is not None and _version(os.fstat(fd)) != version:
            raise StaleVersion(f"changed (version {_version(os.fstat(fd))}, wanted {version})")
        chunks = []
        pos, want = start, end - start
        while want > 0:
            chunk = os.pread(fd, min(want, 1 << 30), pos)
            if not chunk:
                break
            chunks.append(chunk)
            pos += len(chunk)
            want -= len(chunk)
        if version is not None and _version(os.fstat(fd)) != version:
            raise StaleVersion(f"changed while read (wanted {version})")
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


#: one range of :meth:`LocalStore.read_many`: (path, start, end, version)
Range = tuple[str, int, int, str | None]


class LocalStore(UnderStore):
    """A directory on a local (or network-mounted) file system."""

    scheme = "file"

    def __init__(self, root: str, *, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        if not os.path.isabs(root):
            raise InvalidArgument(f"file:// mount needs an absolute path, got {root!r}")
        self._root = os.path.normpath(root)
        #: the root with every link resolved: what "inside the mount root" means
        self._real = os.path.realpath(self._root)
        self._retry = retry

    def describe(self) -> str:
        return f"file://{self._root}"

    def __repr__(self) -> str:
        return f"<LocalStore {self.describe()}>"

    def _full(self, rel: str) -> str:
        return os.path.join(self._root, rel) if rel else self._root

    def _where(self, rel: str) -> str:
        return f"{self.describe()}/{rel}" if rel else self.describe()

    async def _call(self, rel: str, fn: Callable[[], T]) -> T:
        async def op() -> T:
            return await asyncio.to_thread(fn)

        try:
            return await call_with_retry(op, self._where(rel), policy=self._retry)
        except (StaleVersion, PermissionDenied) as exc:
            raise self._named(rel, exc) from None

    def _named(self, rel: str, exc: ShoalError) -> ShoalError:
        """A version or root-escape refusal, its message naming the file."""
        return type(exc)(f"{self._where(rel)}: {exc.message}")

    async def info(self, path: str) -> FileInfo:
        rel = clean_rel(path)
        full = self._full(rel)

        def stat_inside() -> FileInfo:
            real = _check_inside(full, self._real)
            link = _target(real, self._real) if rel and os.path.islink(full) else ""
            return _info(rel, os.stat(full), link)

        return await self._call(rel, stat_inside)

    async def ls(self, path: str) -> list[FileInfo]:
        rel = clean_rel(path)
        full = self._full(rel)

        def scan() -> list[tuple[FileInfo, tuple[int, int]]]:
            _check_inside(full, self._real)
            return _scan(full, rel, self._real)

        entries = await self._call(rel, scan)
        return sorted((i for i, _ in entries), key=lambda i: i.path)

    async def walk(self, path: str = "") -> AsyncIterator[FileInfo]:
        rel = clean_rel(path)
        top = await self.info(rel)
        if not top.is_dir:
            yield top
            return
        root_st = await self._call(rel, lambda: os.stat(self._full(rel)))
        seen = {(root_st.st_dev, root_st.st_ino)}
        stack = [rel]
        while stack:
            d = stack.pop()
            try:
                entries = await self._call(d, lambda d=d: _scan(self._full(d), d, self._real))  # type: ignore[misc]
            except FileNotFoundError:
                continue  # removed while walking
            for info, ident in entries:
                if not info.is_dir:
                    yield info
                elif ident not in seen:  # links may form cycles
                    seen.add(ident)
                    stack.append(info.path)

    async def read(self, path: str, start: int, end: int, version: str | None = None) -> bytes:
        rel = clean_rel(path)
        check_range(start, end)
        if start == end:
            return b""
        full = self._full(rel)
        return await self._call(rel, lambda: _pread(full, start, end, version, self._real))

    async def read_many(self, ranges: Sequence[Range]) -> list[bytes | ShoalError]:
        """Byte ranges of many files in ONE trip to the thread pool, each checked like
        :meth:`read` (inside the root, at its version before and after the read; an
        empty range opens the file too, so a changed empty file is StaleVersion).

        For loads of many small files, where a thread hop per file costs more than
        the read itself. Each result is its range's bytes or the error its read
        raised, so one file's failure fails no other; nothing is retried here: the
        caller fetches a file that failed retryably again with :meth:`read`, which
        retries by the mount's policy."""
        catch = backend_errors()
        plan: list[tuple[str, str, int, int, str | None] | ShoalError] = []
        for path, start, end, version in ranges:
            try:
                rel = clean_rel(path)
                check_range(start, end)
            except ShoalError as exc:
                plan.append(exc)
                continue
            plan.append((rel, self._full(rel), start, end, version))

        def run() -> list[bytes | ShoalError]:
            out: list[bytes | ShoalError] = []
            for p in plan:
                if isinstance(p, ShoalError):
                    out.append(p)
                    continue
                rel, full, start, end, version = p
                try:
                    out.append(_pread(full, start, end, version, self._real))
                except (StaleVersion, PermissionDenied) as exc:
                    out.append(self._named(rel, exc))
                except ShoalError as exc:
                    out.append(exc)
                except catch as exc:
                    out.append(translate(exc, self._where(rel)))
            return out

        return await asyncio.to_thread(run)


def open_local(uri: str, options: Mapping[str, str]) -> LocalStore:
    """file:///abs/path, file://localhost/abs/path or a bare absolute path."""
    check_known("file", options, OPTIONS)
    if uri.startswith("file://"):
        rest = uri[len("file://") :]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        if not rest.startswith("/"):
            raise InvalidArgument(
                "file:// URIs need an absolute path: file:///data/set (three slashes)"
            )
        uri = rest
    return LocalStore(uri)

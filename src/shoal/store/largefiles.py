"""Per-version data files of large files: ``files/<xx>/<hash>.data``.

Owns the data files and their descriptors (a small LRU). A file is created sparse at its
full size; pages are written in place at ``index * page_size``. Which pages are present
is the caller's record (the index). A version leaves only as a whole: the file is
unlinked, never hole-punched, so a reader holding a descriptor keeps its bytes.
"""

from __future__ import annotations

import errno
import os

import xxhash

from shoal.core.types import FileKey
from shoal.store.fds import FdCache


def data_name(key: FileKey) -> str:
    """The data file's path relative to the tier directory (stable for a file version)."""
    digest = xxhash.xxh3_128_hexdigest(
        "\0".join((key.dataset, key.path, key.version)).encode("utf-8", "surrogateescape")
    )
    return os.path.join("files", digest[:2], digest + ".data")


class LargeFiles:
    """Create, write, read and drop the large-file data files of one tier."""

    def __init__(self, root: str, fds: FdCache) -> None:
        self.root = root
        self._fds = fds

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def create(self, name: str, size: int) -> None:
        """A fresh sparse file of ``size`` bytes (a leftover of a crash is unlinked first)."""
        path = self.path(name)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        self._fds.discard(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        written = os.pwrite(self._fds.get(self.path(name)), data, offset)
        if written != len(data):
            raise OSError(errno.ENOSPC, f"short write to {name}: {written} of {len(data)} bytes")

    def read(self, name: str, offset: int, length: int) -> bytes:
        return os.pread(self._fds.get(self.path(name)), length, offset)

    def remove(self, name: str) -> None:
        path = self.path(name)
        self._fds.discard(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

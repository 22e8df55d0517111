"""The under-storage interface every driver implements (about five methods).

Paths given to a driver are relative to the mount's root URI ("" is the root itself),
always with '/' separators and no leading slash. Every method raises only the classes
of :mod:`shoal.errors`: NotFound, PermissionDenied, RetryableStoreError (after the
bounded retries were spent; StoreTimeout when the store did not answer within the
mount's deadline, see :mod:`shoal.ufs.errors`), FatalStoreError, StaleVersion.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

from shoal.core.types import FileInfo


class UnderStore(ABC):
    """One mounted location in under storage."""

    #: the URI scheme this driver serves, e.g. "s3", "file", "webhdfs"
    scheme: str = ""

    @abstractmethod
    async def info(self, path: str) -> FileInfo:
        """Size, version (ETag or size-mtime) and type of one file or directory."""

    @abstractmethod
    async def ls(self, path: str) -> list[FileInfo]:
        """Direct children of a directory, sorted by path; NotFound if it does not exist."""

    @abstractmethod
    def walk(self, path: str = "") -> AsyncIterator[FileInfo]:
        """Every file (not directory) below ``path``, recursively, in any order."""

    @abstractmethod
    async def read(self, path: str, start: int, end: int, version: str | None = None) -> bytes:
        """Bytes [start, end) of a file. With ``version``, raise StaleVersion instead of
        returning bytes of any other version (If-Match on stores that support it)."""

    async def read_head(self, path: str, length: int) -> tuple[FileInfo, bytes]:
        """The file's info and its first ``length`` bytes, in ONE request where the store
        allows (S3: a ranged GET whose response carries ETag and total size). A cold read
        of a small file then costs one round trip to the store, like a plain GET.
        Drivers override this; the default makes two calls."""
        info = await self.info(path)
        data = await self.read(path, 0, min(length, info.size), info.version)
        return info, data

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def describe(self) -> str:
        """The URI with any credentials removed, for logs and errors."""
        return self.scheme + "://"

"""Wrappers that make an :class:`~shoal.ufs.base.UnderStore` or a page-store
:class:`~shoal.store.base.Tier` fail on chosen calls (for unit tests; importable from
:mod:`shoal.testing.faults` too).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import AsyncIterator, Callable, Collection, Iterable

from shoal.core.types import FileInfo, FileKey, PageKey
from shoal.errors import RetryableStoreError
from shoal.store.base import EvictionSink, Location, PutMeta, Tier, Usage
from shoal.ufs.base import UnderStore


class _Injector:
    """Raise ``error`` on chosen (1-based) calls of chosen methods."""

    def __init__(
        self,
        methods: Collection[str],
        fail_on: Iterable[int] | None,
        error: BaseException | Callable[[], BaseException],
    ) -> None:
        self.methods = frozenset(methods)
        #: None = every call fails
        self.fail_on = None if fail_on is None else frozenset(fail_on)
        self.error = error
        #: calls seen per method (all methods, failing or not)
        self.calls: collections.Counter[str] = collections.Counter()
        #: calls of the chosen methods, together: the k of "the k-th call"
        self.counted = 0
        self.injected = 0
        self._lock = threading.Lock()

    def check(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1
            if method not in self.methods:
                return
            self.counted += 1
            fail = self.fail_on is None or self.counted in self.fail_on
            if fail:
                self.injected += 1
        if fail:
            err = self.error
            raise err() if callable(err) and not isinstance(err, BaseException) else err


class FaultyUnderStore(UnderStore):
    """An UnderStore that delegates to ``inner`` and raises ``error`` on the k-th call
    (1-based, counted over ``methods`` together) for each k in ``fail_on``; with
    ``fail_on=None`` every call of ``methods`` fails. ``error`` is an exception or a
    factory of one (a fresh exception per call keeps tracebacks apart)."""

    def __init__(
        self,
        inner: UnderStore,
        *,
        fail_on: Iterable[int] | None = (1,),
        error: BaseException | Callable[[], BaseException] = lambda: RetryableStoreError(
            "injected fault"
        ),
        methods: Collection[str] = ("read", "read_head"),
    ) -> None:
        self.inner = inner
        self.scheme = inner.scheme
        self.faults = _Injector(methods, fail_on, error)

    async def info(self, path: str) -> FileInfo:
        self.faults.check("info")
        return await self.inner.info(path)

    async def ls(self, path: str) -> list[FileInfo]:
        self.faults.check("ls")
        return await self.inner.ls(path)

    async def walk(self, path: str = "") -> AsyncIterator[FileInfo]:
        self.faults.check("walk")
        async for info in self.inner.walk(path):
            yield info

    async def read(self, path: str, start: int, end: int, version: str | None = None) -> bytes:
        self.faults.check("read")
        return await self.inner.read(path, start, end, version)

    async def read_head(self, path: str, length: int) -> tuple[FileInfo, bytes]:
        self.faults.check("read_head")
        return await self.inner.read_head(path, length)

    async def close(self) -> None:
        await self.inner.close()

    def describe(self) -> str:
        return self.inner.describe()


class FaultyPageStore(Tier):
    """A page-store tier that delegates to ``inner`` and raises ``error`` on the k-th call of
    ``methods`` (as :class:`FaultyUnderStore`). The default, an OSError(EIO) from
    ``put``, is what a failing disk does under a tier."""

    def __init__(
        self,
        inner: Tier,
        *,
        fail_on: Iterable[int] | None = (1,),
        error: BaseException | Callable[[], BaseException] = lambda: OSError(5, "injected EIO"),
        methods: Collection[str] = ("put",),
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.faults = _Injector(methods, fail_on, error)

    @property
    def on_evict(self) -> EvictionSink | None:
        return self.inner.on_evict

    @on_evict.setter
    def on_evict(self, sink: EvictionSink | None) -> None:
        self.inner.on_evict = sink

    def get(self, key: PageKey) -> bytes | None:
        self.faults.check("get")
        return self.inner.get(key)

    def locate(self, key: PageKey) -> Location | None:
        self.faults.check("locate")
        return self.inner.locate(key)

    def locate_file(self, file: FileKey) -> Location | None:
        self.faults.check("locate_file")
        return self.inner.locate_file(file)

    def locate_run(self, file: FileKey) -> tuple[Location, list[int]] | None:
        self.faults.check("locate_run")
        return self.inner.locate_run(file)

    def put(self, key: PageKey, data: bytes | memoryview, meta: PutMeta) -> bool:
        self.faults.check("put")
        return self.inner.put(key, data, meta)

    def contains(self, key: PageKey) -> bool:
        self.faults.check("contains")
        return self.inner.contains(key)

    def delete(self, file: FileKey | None = None, *, dataset: str | None = None) -> int:
        self.faults.check("delete")
        return self.inner.delete(file, dataset=dataset)

    def drop_corrupt(self, key: PageKey) -> None:
        self.faults.check("drop_corrupt")
        self.inner.drop_corrupt(key)

    def expire(self, now: float) -> int:
        self.faults.check("expire")
        return self.inner.expire(now)

    def usage(self) -> Usage:
        self.faults.check("usage")
        return self.inner.usage()

    def close(self) -> None:
        self.inner.close()

    def has_file(self, file: FileKey) -> bool:
        self.faults.check("has_file")
        return self.inner.has_file(file)

    def changes(self) -> int | None:
        return self.inner.changes()

    def peek(self, key: PageKey) -> Location | None:
        self.faults.check("peek")
        return self.inner.peek(key)

    def touch(self, key: PageKey) -> bool:
        self.faults.check("touch")
        return self.inner.touch(key)

    def file_count(self, dataset: str) -> int | None:
        return self.inner.file_count(dataset)

    def files_in_dir(self, dataset: str, directory: str) -> list[FileKey]:
        return self.inner.files_in_dir(dataset, directory)

    def versions(self, dataset: str, path: str) -> dict[str, int]:
        self.faults.check("versions")
        return self.inner.versions(dataset, path)

    def files(self, dataset: str, prefix: str = "") -> list[FileKey]:
        return self.inner.files(dataset, prefix)

    def refusal(self) -> str:
        return self.inner.refusal()

    def file_room(self) -> int | None:
        return self.inner.file_room()

    def evict(self, file: FileKey) -> int:
        self.faults.check("evict")
        return self.inner.evict(file)

    def reclaim(self, budget: int) -> bool:
        return self.inner.reclaim(budget)

    def flush(self) -> None:
        self.inner.flush()

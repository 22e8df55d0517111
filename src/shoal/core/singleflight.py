"""Single-flight: one in-progress computation per key, however many callers wait.

Used by the worker so that 16 readers of one uncached page cause one under-storage
fetch. Pure asyncio: no sockets, no sleeps; the caller supplies the coroutine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._inflight: dict[Hashable, asyncio.Future[T]] = {}
        #: how many calls joined a flight already in progress (for metrics/tests)
        self.shared = 0
        #: how many flights were started
        self.started = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._inflight

    def __len__(self) -> int:
        return len(self._inflight)

    async def do(self, key: Hashable, fn: Callable[[], Awaitable[T]]) -> T:
        fut = self._inflight.get(key)
        if fut is not None:
            self.shared += 1
            # shield: one waiter's cancellation must not cancel the shared flight
            return await asyncio.shield(fut)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._inflight[key] = fut
        self.started += 1
        try:
            result = await fn()
        except BaseException as exc:
            _fail(fut, exc)
            raise
        else:
            fut.set_result(result)
            return result
        finally:
            self._inflight.pop(key, None)

    async def do_many(self, keys: list[Hashable], fn: Callable[[], Awaitable[list[T]]]) -> list[T]:
        """One computation answering several keys at once (``fn`` returns one result per
        key, in order): every key not already in flight is claimed before it starts, so
        their callers wait on it; a key already in flight keeps its own flight (what
        ``fn`` computes for it is returned to this caller only)."""
        loop = asyncio.get_running_loop()
        mine: dict[int, asyncio.Future[T]] = {}
        for i, key in enumerate(keys):
            if key not in self._inflight:
                mine[i] = self._inflight[key] = loop.create_future()
        self.started += 1
        try:
            results = await fn()
        except BaseException as exc:
            for fut in mine.values():
                _fail(fut, exc)
            raise
        else:
            for i, fut in mine.items():
                fut.set_result(results[i])
            return results
        finally:
            for i in mine:
                if self._inflight.get(keys[i]) is mine[i]:
                    del self._inflight[keys[i]]


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    """Hand a flight's failure to its waiters (a cancellation as a cancellation)."""
    if fut.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        fut.cancel()
    else:
        fut.set_exception(exc)
        fut.exception()  # mark retrieved: waiters may be none

"""Order-aware prefetch: read the next samples of a known order ahead of the consumer.

A :class:`Prefetcher` is given the order in which one consumer (a training process or
one DataLoader worker) will ask for files. A background thread keeps a window of
``depth`` positions ahead of the consumer fetched, ``batch`` files per
``Client.cat_many`` (one request per shoal worker), into a bounded in-process memory.
Fetching also pulls the files into the shoal workers' caches, so other readers of the
same files (other ranks, the next epoch) find them warm.

The thread starts on first use, not in ``__init__``; after ``fork`` the child starts
its own (threads do not survive fork) and pickling keeps only the settings.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shoal.client import Client
from shoal.errors import InvalidArgument, ShoalError

log = logging.getLogger("shoal.prefetch")


@dataclass
class PrefetchStats:
    #: reads answered from prefetch memory with no wait
    hits: int = 0
    #: reads answered from prefetch memory after waiting for a fetch already under way
    waited: int = 0
    #: reads the prefetcher could not answer (outside its order, failed, timed out)
    misses: int = 0
    #: files fetched ahead, and the requests (one per cat_many) that fetched them
    fetched: int = 0
    requests: int = 0
    fetched_bytes: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class Prefetcher:
    def __init__(
        self,
        client: Client,
        depth: int = 256,
        batch: int = 64,
        max_bytes: int = 256 << 20,
        wait: float = 30.0,
    ) -> None:
        if depth < 1 or batch < 1 or max_bytes < 1:
            raise InvalidArgument("prefetch depth, batch and max_bytes must be positive")
        self.client = client
        self.depth = depth
        self.batch = min(batch, depth)
        self.max_bytes = max_bytes
        self.wait = wait
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._gen = 0
        self._order: Sequence[str] = ()
        self._cursor = 0  # the consumer's next position
        self._next = 0  # the next position to fetch
        self._inflight: tuple[int, int] | None = None
        self._mem: dict[int, bytes] = {}
        self._mem_bytes = 0
        self.stats = PrefetchStats()

    def __getstate__(self) -> dict[str, Any]:
        keys = ("client", "depth", "batch", "max_bytes", "wait")
        return {k: getattr(self, k) for k in keys}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _check_fork(self) -> None:
        if self._pid != os.getpid():  # the thread and the lock's state stayed in the parent
            self._reset()

    # -- consumer side ----------------------------------------------------------------

    def start(self, order: Sequence[str], at: int = 0) -> None:
        """Begin a new order (an epoch), the consumer at position ``at``."""
        self._check_fork()
        with self._cond:
            self._gen += 1
            self._order = order
            self._cursor = self._next = at
            self._inflight = None
            self._mem.clear()
            self._mem_bytes = 0
            self._cond.notify_all()
        if self._thread is None or not self._thread.is_alive():
            self._stop = False
            self._thread = threading.Thread(target=self._run, name="shoal-prefetch", daemon=True)
            self._thread.start()

    def get(self, pos: int) -> bytes | None:
        """The file at ``pos`` of the order, if the prefetcher has it or is fetching it;
        None tells the caller to read it itself. Moves the window to ``pos``."""
        self._check_fork()
        with self._cond:
            if not 0 <= pos < len(self._order):
                self.stats.misses += 1
                return None
            if pos != self._cursor:  # the consumer jumped: drop what it passed
                for k in [k for k in self._mem if k < pos]:
                    self._mem_bytes -= len(self._mem.pop(k))
                if pos < self._cursor or pos > self._next:
                    self._next = pos
            self._cursor = pos
            waited = pos not in self._mem
            if waited:
                self._cond.notify_all()
                gen = self._gen
                self._cond.wait_for(
                    lambda: gen != self._gen or self._stop or self._fetched(pos), self.wait
                )
            data = self._mem.pop(pos, None)
            self._cursor = max(self._cursor, pos + 1)
            if data is None:
                self.stats.misses += 1
                return None
            self._mem_bytes -= len(data)
            if waited:
                self.stats.waited += 1
            else:
                self.stats.hits += 1
            self._cond.notify_all()
            return data

    def _fetched(self, pos: int) -> bool:
        f = self._inflight
        return pos < self._next and (f is None or not f[0] <= pos < f[1])

    def close(self) -> None:
        """Stop the thread (it also dies with the process: it is a daemon)."""
        if self._pid != os.getpid():
            return
        with self._cond:
            self._stop = True
            self._mem.clear()
            self._mem_bytes = 0
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    # -- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or self._work() is not None)
                if self._stop:
                    return
                lo, hi = self._work()  # type: ignore[misc]
                gen, paths = self._gen, list(self._order[lo:hi])
                self._inflight = (lo, hi)
                self._next = hi
            try:
                got: dict[str, bytes | ShoalError] = self.client.cat_many(paths)
            except Exception as exc:  # the consumer reads these itself and sees the error
                log.warning("prefetch of %d files failed: %s", len(paths), exc)
                got = {}
            with self._cond:
                self.stats.requests += 1
                if gen == self._gen:
                    for pos, path in zip(range(lo, hi), paths, strict=True):
                        data = got.get(path)
                        if isinstance(data, bytes) and pos >= self._cursor:
                            self._mem[pos] = data
                            self._mem_bytes += len(data)
                            self.stats.fetched += 1
                            self.stats.fetched_bytes += len(data)
                    self._inflight = None
                self._cond.notify_all()

    def _work(self) -> tuple[int, int] | None:
        """The next range to fetch, or None while the window is full or done."""
        lo = max(self._next, self._cursor)
        hi = min(len(self._order), self._cursor + self.depth, lo + self.batch)
        if lo >= hi or self._inflight is not None:
            return None
        if lo > self._cursor:  # the consumer is not waiting for ``lo``
            if self._mem_bytes >= self.max_bytes:
                return None  # memory is full
            if hi - lo < self.batch // 2 and hi < len(self._order):
                return None  # refill in batches, not a file each time the consumer moves
        return lo, hi

"""Read-ahead for sequential readers over TCP.

A reader that walks a file in small ranges (1 MiB is typical) from a worker on another
host pays one request's fixed cost per range: measured by the remote benchmark
(issue 13), shoal's TCP path read 1 MiB ranges at 0.30-0.36x raw TCP between the same
hosts, and 8 MiB ranges at 0.8x. So the second read in a row that starts where the
previous one ended asks for :data:`AHEAD` bytes at once, and the next reads are served
from those bytes (on the caller's own thread, through :meth:`Ahead.take`).

What is read ahead is never served stale or mixed: an entry holds one file version and
is served only while the client's metadata still names that version, the dataset's
generation is the one it was read at, and it is younger than :data:`MAX_AGE` seconds;
datasets whose staleness is ``always`` never read ahead. Each entry is one file's next
bytes, dropped once read past; at most :data:`MAX_ENTRIES` are kept (``MAX_ENTRIES x
AHEAD`` bytes of memory at the most). Concurrent readers of one file ask for their own
ranges (no read-ahead while another read of it is in flight), and a file on this
host's worker is read by the short circuit instead.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from shoal.client.cache import ClientCache
from shoal.core.types import Dataset

#: bytes asked for at once by a sequential reader over TCP
AHEAD = 8 << 20
#: files whose next bytes are kept
MAX_ENTRIES = 8
#: seconds read-ahead bytes may be served after they were read
MAX_AGE = 2.0
#: files whose last read end is remembered (to see the next read start there)
MAX_TRACKED = 1024

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class _Entry:
    start: int
    data: bytes
    version: str
    generation: int
    at: float


class Ahead:
    def __init__(self, cache: ClientCache) -> None:
        self.cache = cache
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self._next_at: OrderedDict[Key, int] = OrderedDict()
        self._reading: dict[Key, int] = {}

    def take(self, ds: Dataset, path: str, offset: int, length: int) -> bytes | None:
        """Bytes [offset, offset+length) of ``path`` from what was read ahead, or None.
        Any thread (its state is a few dict operations, each atomic under the GIL)."""
        key = (ds.name, path)
        e = self._entries.get(key)
        if e is None or length <= 0:
            return None
        last = e.start + len(e.data)
        if not e.start <= offset <= last:
            return None
        info = self.cache.info(ds, path)
        if (
            info is None
            or info.version != e.version
            or ds.generation != e.generation
            or time.monotonic() - e.at > MAX_AGE
        ):
            self._entries.pop(key, None)
            return None
        end = offset + length
        if end > last:
            if last != info.size:
                return None  # runs past what was read ahead: the caller asks
            end = last  # the file ends there: what a read past the end returns
        self._next_at[key] = end
        if end == last:
            self._entries.pop(key, None)
        return e.data[offset - e.start : end - e.start]

    def wanted(self, ds: Dataset, path: str, offset: int, length: int) -> bool:
        """Whether this read should ask for AHEAD bytes: a :meth:`sequential` one
        shorter than AHEAD."""
        return 0 < length < AHEAD and self.sequential(ds, path, offset)

    def sequential(self, ds: Dataset, path: str, offset: int) -> bool:
        """Whether a read at ``offset`` is the second in a row to start where the last
        one ended, with no other read of the file in flight (and the dataset's
        staleness lets bytes be read ahead)."""
        key = (ds.name, path)
        return (
            ds.policy.staleness != 0  # 'always': every read asks the worker
            and self._next_at.get(key) == offset
            and not self._reading.get(key)
        )

    def begin(self, ds: Dataset, path: str) -> None:
        key = (ds.name, path)
        self._reading[key] = self._reading.get(key, 0) + 1

    def end(self, ds: Dataset, path: str, offset: int, length: int) -> None:
        """A read of [offset, offset+length) is over (successful or not)."""
        key = (ds.name, path)
        n = self._reading.get(key, 1) - 1
        if n > 0:
            self._reading[key] = n
        else:
            self._reading.pop(key, None)
        if length > 0:
            self._next_at[key] = offset + length
            self._next_at.move_to_end(key)
            while len(self._next_at) > MAX_TRACKED:
                self._next_at.popitem(last=False)

    def keep(self, ds: Dataset, path: str, start: int, data: bytes) -> None:
        """``data`` read ahead from ``start``, in the version the client now knows."""
        info = self.cache.info(ds, path)
        if info is None:
            return
        key = (ds.name, path)
        self._entries[key] = _Entry(start, data, info.version, ds.generation, time.monotonic())
        self._entries.move_to_end(key)
        while len(self._entries) > MAX_ENTRIES:
            self._entries.popitem(last=False)

"""Append-only segment files that pack small files: ``seg/<id>.seg``.

Owns the segment files, their descriptors and their byte accounting (size = end offset,
live bytes, which keys live where). Bytes at a (segment, offset) are never overwritten:
new data is appended with ``os.pwrite`` at the tracked end of the *active* segment, and
a segment whose entries are mostly dead is compacted by the caller (copy the live
entries into the active segment, then :meth:`remove` the old file). A reader holding a
descriptor and a location keeps reading the right bytes even after the unlink.

After a restart, appends always go to a fresh segment, so bytes written after the last
index commit of a crashed process (unknown to the index) are never overwritten either;
they are leaked until their segment is compacted or dropped.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Hashable, Sequence

from shoal.store.fds import FdCache
from shoal.store.index import TierIndex

MiB = 1 << 20
#: buffers in one vectored write (Linux's IOV_MAX)
_IOV_MAX = 1024


class SegmentSet:
    """The tier's segments: append, read, dead-byte accounting and removal."""

    def __init__(self, directory: str, target_size: int, fds: FdCache, index: TierIndex) -> None:
        self.directory = directory
        #: roll to a new segment once the active one reaches this size
        self.target_size = target_size
        self._fds = fds
        self._index = index
        self._ends: dict[int, int] = {}
        self._live: dict[int, int] = {}
        self._members: dict[int, dict[Hashable, int]] = {}
        self._active: int | None = None
        self._next_id = 1
        #: a segment whose dead fraction exceeds this is worth compacting
        self.threshold = 0.5
        self._ready: set[int] = set()
        #: total bytes of all segment files, dead ones included
        self.total_bytes = 0
        #: bytes of live entries in all segments
        self.live_bytes = 0
        self._paths: dict[int, str] = {}

    # -- restart -------------------------------------------------------------------

    def restore(self, seg: int, end: int) -> None:
        """A segment the index knows about (called before any ``restore_entry``)."""
        self._ends[seg] = end
        self._live.setdefault(seg, 0)
        self._members.setdefault(seg, {})
        self.total_bytes += end
        self._next_id = max(self._next_id, seg + 1)

    def restore_entry(self, seg: int, key: Hashable, offset: int, length: int) -> None:
        if seg not in self._ends:
            self.restore(seg, 0)
        end = offset + length
        if end > self._ends[seg]:
            self.total_bytes += end - self._ends[seg]
            self._ends[seg] = end
        self._members[seg][key] = length
        self._live[seg] += length
        self.live_bytes += length

    # -- data path -----------------------------------------------------------------

    def path(self, seg: int) -> str:
        p = self._paths.get(seg)
        if p is None:
            p = self._paths[seg] = os.path.join(self.directory, f"{seg:08d}.seg")
        return p

    def append(self, key: Hashable, data: bytes | memoryview) -> tuple[int, int]:
        """Write ``data`` at the end of the active segment; (segment, offset)."""
        length = len(data)
        seg = self._active
        if seg is None or (self._ends[seg] > 0 and self._ends[seg] + length > self.target_size):
            seg = self._new_segment()
        offset = self._ends[seg]
        fd = self._fds.get(self.path(seg))
        written = os.pwrite(fd, data, offset)
        if written != length:
            # the bytes past ``offset`` are garbage now; never reuse them
            self._ends[seg] += max(0, written)
            self.total_bytes += max(0, written)
            # a short write to a regular file means the filesystem is out of room
            raise OSError(
                errno.ENOSPC, f"short write to segment {seg}: {written} of {length} bytes"
            )
        self._ends[seg] = offset + length
        self.total_bytes += length
        self._members[seg][key] = length
        self._live[seg] += length
        self.live_bytes += length
        self._index.set_segment(seg, offset + length)
        return seg, offset

    def append_run(
        self, keys: Sequence[Hashable], datas: Sequence[bytes | memoryview]
    ) -> list[int]:
        """Write the longest prefix of ``datas`` that fits the active segment (at least
        one; a new segment when the active one is full) with ONE write, in order; their
        offsets in :attr:`active`. On OSError none of them is recorded."""
        first = len(datas[0])
        seg = self._active
        if seg is None or (self._ends[seg] > 0 and self._ends[seg] + first > self.target_size):
            seg = self._new_segment()
        start = end = self._ends[seg]
        offsets: list[int] = []
        for data in datas[:_IOV_MAX]:
            if offsets and end + len(data) > self.target_size:
                break
            offsets.append(end)
            end += len(data)
        run = datas[: len(offsets)]
        written = os.pwritev(self._fds.get(self.path(seg)), run, start)
        if written != end - start:
            # the bytes past ``start`` are garbage now; never reuse them
            self._ends[seg] += max(0, written)
            self.total_bytes += max(0, written)
            raise OSError(
                errno.ENOSPC, f"short write to segment {seg}: {written} of {end - start} bytes"
            )
        self._ends[seg] = end
        self.total_bytes += end - start
        self.live_bytes += end - start
        self._live[seg] += end - start
        members = self._members[seg]
        for key, data in zip(keys, run, strict=False):
            members[key] = len(data)
        self._index.set_segment(seg, end)
        return offsets

    def read(self, seg: int, offset: int, length: int) -> bytes:
        return os.pread(self._fds.get(self.path(seg)), length, offset)

    def _new_segment(self) -> int:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        while True:
            seg = self._next_id
            self._next_id += 1
            try:
                # O_EXCL: a leftover file of a crashed process may still be read by someone
                fd = os.open(self.path(seg), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            os.close(fd)
            break
        self._ends[seg] = 0
        self._live[seg] = 0
        self._members[seg] = {}
        self.roll()
        self._active = seg
        self._index.set_segment(seg, 0)
        # rare (once per segment): commit now so a crash cannot leak the whole file
        self._index.flush()
        return seg

    # -- accounting and compaction ----------------------------------------------------

    def mark_dead(self, seg: int, key: Hashable) -> None:
        length = self._members[seg].pop(key, None)
        if length is not None:
            self._live[seg] -= length
            self.live_bytes -= length
            self._check(seg)

    def _check(self, seg: int) -> None:
        if seg != self._active and self.dead_bytes(seg) > self.threshold * self._ends[seg]:
            self._ready.add(seg)

    def recheck(self, seg: int) -> None:
        """A compaction of ``seg`` failed: offer it again with the next ready ones."""
        if seg in self._ends:
            self._check(seg)

    def check_all(self) -> None:
        """Find every segment worth compacting (after a restart)."""
        for seg in self._ends:
            self._check(seg)

    def take_ready(self) -> list[int]:
        """Segments that crossed the dead threshold since the last call, most dead first."""
        ready = [s for s in self._ready if s in self._ends and s != self._active]
        self._ready.clear()
        ready.sort(key=self.dead_bytes, reverse=True)
        return ready

    def dead_bytes(self, seg: int) -> int:
        return self._ends[seg] - self._live[seg]

    def members(self, seg: int) -> list[Hashable]:
        return list(self._members[seg])

    @property
    def active(self) -> int | None:
        return self._active

    def roll(self) -> None:
        """Stop appending to the active segment (the next append starts a new one)."""
        old, self._active = self._active, None
        if old is not None:
            self._check(old)

    def with_dead_bytes(self) -> list[int]:
        """Every segment holding dead bytes, most dead first (active one included)."""
        out = [seg for seg in self._ends if self.dead_bytes(seg) > 0]
        out.sort(key=self.dead_bytes, reverse=True)
        return out

    def remove(self, seg: int) -> int:
        """Unlink a segment (it must hold no live entry); bytes freed."""
        if self._members[seg]:
            raise ValueError(f"segment {seg} still has {len(self._members[seg])} live entries")
        path = self.path(seg)
        self._paths.pop(seg, None)
        self._fds.discard(path)
        end = self._ends.pop(seg)
        del self._live[seg], self._members[seg]
        if seg == self._active:
            self._active = None
        self.total_bytes -= end
        self._index.delete_segment(seg)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return end

    def __len__(self) -> int:
        return len(self._ends)

    def __contains__(self, seg: object) -> bool:
        return seg in self._ends

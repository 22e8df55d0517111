"""The disk tier's room: capacity, eviction down to the watermarks, compaction.

A mixin of :class:`~shoal.store.disk.DiskTier` (it shares the tier's state; none of it
is on the read path). Eviction picks victims by the dataset's policy and hands each
evicted file version to the tier's ``on_evict`` sink (demotion, wired by the tiered
composite, see :mod:`~shoal.store.demotion`) before dropping it. Compaction copies a
segment's live entries to the active segment and commits their new locations to the
index before it unlinks the old segment (a reader holding the old location and an open
descriptor still reads the old bytes after the unlink).
"""

from __future__ import annotations

import logging

from shoal.config import TierSpec
from shoal.core.types import FileKey, PageKey
from shoal.store.base import EvictedPages, EvictionSink, PutMeta
from shoal.store.catalog import Catalog
from shoal.store.eviction import EvictionPolicy
from shoal.store.index import PageEntry, TierIndex
from shoal.store.segments import SegmentSet
from shoal.store.space import FsSpace

log = logging.getLogger("shoal.store.disk")


class RoomKeeper:
    """Making room in a tier; the attributes below are the tier's."""

    name: str
    spec: TierSpec
    on_evict: EvictionSink | None
    _cat: Catalog
    _segments: SegmentSet
    _index: TierIndex
    _policy: EvictionPolicy[FileKey]
    _space: FsSpace
    _evicted_bytes: int

    def _read(self, key: PageKey, e: PageEntry) -> bytes | None:
        raise NotImplementedError  # the tier's verified read

    def _capacity(self, need: int = 0) -> int:
        """The declared capacity, or less where the filesystem has less room."""
        room = self._space.ceiling(self._cat.used(), need)
        return self.spec.capacity if room is None else min(self.spec.capacity, room)

    def file_room(self) -> int:
        """The most bytes one large file version can take here whole: the high
        watermark of the room the tier really has (eviction makes room up to it)."""
        return int(self._capacity() * self.spec.high_watermark)

    def evict(self, file: FileKey) -> int:
        """Evict one file version now, as making room would: handed to ``on_evict``
        (demotion), then dropped; bytes freed (the tiered composite moves a large file
        whose tier refused a page of it, instead of splitting it across tiers)."""
        if file not in self._cat.files:
            return 0
        before = self._evicted_bytes
        self._evict(file)
        self._compact_ready()
        self._index.maybe_flush()
        return self._evicted_bytes - before

    def _no_room_reason(self, need: int) -> str:
        room = self._space.last()
        if room is not None and room < self.spec.capacity:
            return f"its filesystem has room for {room} bytes, {need} more do not fit"
        return f"{need} more bytes do not fit in {self.spec.capacity} (pinned or too large)"

    def _make_room(self, need: int, putting: FileKey) -> bool:
        """Evict (by policy) until ``need`` more bytes fit; False if they cannot."""
        cap = self._capacity(need)
        high = cap * self.spec.high_watermark
        if self._cat.used() + need <= high:
            return True
        if need > high:
            return False
        low = cap * self.spec.low_watermark
        skip = (putting,)
        segs = self._segments
        # evict only while compacting the dead bytes there are could not reach ``low``
        while self._cat.used() - (segs.total_bytes - segs.live_bytes) + need > low:
            victim = self._policy.pop_victim(skip)
            if victim is None:
                break
            self._evict(victim)
            self._compact_ready()
        for seg in segs.with_dead_bytes():
            if self._cat.used() + need <= low:
                break
            if seg not in segs:
                continue
            if seg == segs.active:
                segs.roll()
            if not self._compact(seg):
                break  # the filesystem has no room to copy live entries to
        # a full filesystem cannot take compaction's copies: evict on, since a segment
        # whose entries are all dead goes without copying anything
        while self._cat.used() + need > high:
            victim = self._policy.pop_victim(skip)
            if victim is None:
                break
            self._evict(victim)
            self._compact_ready()
        return self._cat.used() + need <= high

    def _evict(self, fk: FileKey) -> None:
        if self.on_evict is not None:
            self.on_evict(fk, self._evicted_pages(fk))
        self._evicted_bytes += self._cat.drop_file(fk)

    def _evicted_pages(self, fk: FileKey) -> EvictedPages:
        """An evicted file's pages in order, read and verified; ends at the first one
        that cannot be read (reading it may drop the file)."""
        st = self._cat.files[fk]
        for index in sorted(st.pages):
            key = PageKey(fk, index)
            e = self._cat.pages.get(key)
            data = None if e is None else self._read(key, e)
            if e is None or data is None or fk not in self._cat.files:
                return
            yield key, data, PutMeta(st.size, st.page_size, e.pinned, e.expires_at)

    def _compact_ready(self) -> None:
        for seg in self._segments.take_ready():
            self._compact(seg)

    def _compact(self, seg: int) -> bool:
        """Copy a segment's live entries to the active segment, then unlink it; False
        (the segment stays, to be compacted later) if the copies or the commit failed.

        The old bytes are never overwritten: a reader holding the old location and an
        open descriptor still reads them after the unlink.
        """
        moved = False
        try:
            for key in self._segments.members(seg):
                assert isinstance(key, PageKey)
                e = self._cat.pages[key]
                data = self._read(key, e)
                if data is None:
                    continue
                new_seg, new_offset = self._segments.append(key, data)
                self._segments.mark_dead(seg, key)
                e.seg, e.offset = new_seg, new_offset
                self._cat.changes += 1
                self._index.put_page(key, e)
                moved = True
        except OSError:
            self._segments.recheck(seg)
            return False
        # the new locations must be committed before the old bytes go away
        if not self._index.flush(touches=False) and moved:
            self._segments.recheck(seg)
            return False
        self._segments.remove(seg)
        return True

    def _drop_files(self, files: list[FileKey], what: str) -> int:
        freed = 0
        try:
            for fk in files:
                freed += self._cat.drop_file(fk)
            self._compact_ready()
        except OSError as exc:
            log.warning("tier %s: %s failed: %s", self.name, what, exc)
        self._index.maybe_flush()
        return freed

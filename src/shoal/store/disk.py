"""DiskTier: a page store over one directory (an SSD or HDD path, or /dev/shm for MEM).

Owns the tier's behaviour: reads with checksum verification, writes, eviction down to
the watermarks (with optional demotion to the next tier), segment compaction, TTL,
pinning and the failure policy (an OSError is logged and becomes a miss or a refused
put, never an exception). What is stored lives in :mod:`~shoal.store.catalog`; the bytes
in :mod:`~shoal.store.segments` (small files) and :mod:`~shoal.store.largefiles` (one
sparse file per large version); the rows that survive a restart in
:mod:`~shoal.store.index`; the directory layout in :mod:`~shoal.store.layout`.

``used`` is segment bytes (dead ones included until their segment is compacted) plus
the bytes of the large-file pages present. The eviction unit is a small file or a whole
large-file version. A read touches no SQLite and opens no file: a dict lookup, one
``os.pread`` on a cached descriptor, one xxh3.

Index rows are committed in batches as writes happen; call :meth:`DiskTier.flush` now
and then (e.g. every 100 ms from the worker's loop) so that access statistics and the
tail of a burst are persisted while idle. After a crash, bytes written after the last
commit are leaked (until their segment is compacted), never served.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable

import xxhash

from shoal.config import TierSpec
from shoal.core.types import FileKey, PageKey
from shoal.errors import InvalidArgument
from shoal.store import layout
from shoal.store.base import Location, PageStore, PutMeta, Usage
from shoal.store.catalog import Catalog, FileState
from shoal.store.eviction import PerDataset
from shoal.store.fds import FdCache
from shoal.store.index import FileRow, PageEntry, TierIndex
from shoal.store.largefiles import LargeFiles, data_name
from shoal.store.segments import SegmentSet

log = logging.getLogger("shoal.store.disk")

MiB = 1 << 20
_checksum = xxhash.xxh3_64_intdigest


class DiskTier(PageStore):
    """A :class:`PageStore` over ``spec.path``; see the module docstring.

    ``segment_size`` is where segments roll (default: capacity/16, 64 KiB..64 MiB);
    ``clock`` gives wall-clock seconds (TTL, statistics); ``demote_to`` receives the
    pages this tier evicts (usually set by :class:`~shoal.store.tiered.TieredStore`).
    """

    def __init__(
        self,
        spec: TierSpec,
        *,
        segment_size: int | None = None,
        clock: Callable[[], float] = time.time,
        demote_to: PageStore | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.root = spec.path
        self.demote_to = demote_to
        self._clock = clock
        if segment_size is None:
            segment_size = min(64 * MiB, max(64 * 1024, spec.capacity // 16))
        self._seg_fds = FdCache(1024)
        self._large_fds = FdCache(64)
        self._evicted_bytes = 0
        self._corrupt_pages = 0
        self._closed = False
        self._lock_fd = layout.lock(self.root)
        try:
            layout.prepare(self.root)
            try:
                self._open(segment_size)
            except sqlite3.DatabaseError as exc:
                log.warning(
                    "tier %s: index unreadable (%s): discarding cached data", self.name, exc
                )
                layout.wipe(self.root)
                self._open(segment_size)
        except BaseException:
            layout.unlock(self._lock_fd)
            raise
        log.info(
            "tier %s at %s: %d files, %d bytes from the index",
            self.name,
            self.root,
            len(self._cat.files),
            self._cat.used(),
        )

    def _open(self, segment_size: int) -> None:
        """Open the index and rebuild the catalog from it (DatabaseError if unreadable)."""
        index = TierIndex(os.path.join(self.root, layout.INDEX_FILE))
        seg_dir = os.path.join(self.root, layout.SEG_DIR)
        segments = SegmentSet(seg_dir, segment_size, self._seg_fds, index)
        large = LargeFiles(self.root, self._large_fds)
        # each dataset's own policy orders its files; the tier's is the default
        self._per_dataset = PerDataset(self.spec.eviction)
        catalog = Catalog(index, segments, large, self._per_dataset)
        try:
            catalog.load()
        except BaseException:
            index.abandon()
            raise
        self._index, self._segments, self._large, self._cat = index, segments, large, catalog
        self._policy = catalog.policy

    # -- reads -----------------------------------------------------------------------

    def _live(self, key: PageKey, now: float) -> PageEntry | None:
        e = self._cat.pages.get(key)
        if e is not None and e.expires_at and e.expires_at <= now:
            self._cat.drop_file(key.file)
            return None
        return e

    def _touch(self, key: PageKey, e: PageEntry, now: float) -> None:
        e.last_access = now
        e.access_count += 1
        self._policy.touch(key.file)
        self._index.touch(key, e)

    def _read(self, key: PageKey, e: PageEntry) -> bytes | None:
        """The page's verified bytes, or None (and it is dropped) if unreadable or corrupt."""
        try:
            if e.seg >= 0:
                data = self._segments.read(e.seg, e.offset, e.length)
            else:
                data = self._large.read(self._cat.files[key.file].name, e.offset, e.length)
        except OSError as exc:
            log.warning("tier %s: read of %s failed, dropping it: %s", self.name, key, exc)
            self._cat.drop_file(key.file)
            return None
        if len(data) != e.length or _checksum(data) != e.checksum:
            self._corrupt(key, "checksum mismatch")
            return None
        return data

    def _corrupt(self, key: PageKey, why: str) -> None:
        self._corrupt_pages += 1
        log.warning("tier %s: dropping corrupt page %s: %s", self.name, key, why)
        if self._cat.pages[key].seg >= 0:
            self._cat.drop_file(key.file)
        else:
            self._cat.drop_page(key)

    def get(self, key: PageKey) -> bytes | None:
        now = self._clock()
        e = self._live(key, now)
        if e is None:
            return None
        data = self._read(key, e)
        if data is not None:
            self._touch(key, e, now)
        return data

    def locate(self, key: PageKey) -> Location | None:
        return self._locate(key, True)

    def peek(self, key: PageKey) -> Location | None:
        return self._locate(key, False)

    def _locate(self, key: PageKey, touch: bool) -> Location | None:
        now = self._clock()
        e = self._live(key, now)
        if e is None:
            return None
        if touch:
            self._touch(key, e, now)
        if e.seg >= 0:
            path = self._segments.path(e.seg)
        else:
            path = self._large.path(self._cat.files[key.file].name)
        return Location(path, e.offset, e.length, e.checksum, self.name)

    def touch(self, key: PageKey) -> bool:
        now = self._clock()
        e = self._live(key, now)
        if e is None:
            return False
        self._touch(key, e, now)
        return True

    def locate_file(self, file: FileKey) -> Location | None:
        st = self._cat.files.get(file)
        if st is None or len(st.pages) < st.npages:
            return None
        if not st.large:
            return self.locate(file.page(0))
        if st.expires_at and st.expires_at <= self._clock():
            self._cat.drop_file(file)
            return None
        self._policy.touch(file)
        return Location(self._large.path(st.name), 0, st.size, 0, self.name)

    def contains(self, key: PageKey) -> bool:
        return key in self._cat.pages

    def has_file(self, file: FileKey) -> bool:
        return file in self._cat.files

    def files(self, dataset: str, prefix: str = "") -> list[FileKey]:
        p = prefix.rstrip("/")
        return [
            FileKey(ds, path, v)
            for (ds, path), vs in self._cat.by_path.items()
            if ds == dataset and (not p or path == p or path.startswith(p + "/"))
            for v in vs
        ]

    def changes(self) -> int | None:
        return self._cat.changes

    def file_count(self, dataset: str) -> int | None:
        return len(self._cat.datasets.get(dataset, ()))

    def files_in_dir(self, dataset: str, directory: str) -> list[FileKey]:
        return [
            FileKey(dataset, path, v)
            for path in self._cat.by_dir.get((dataset, directory), ())
            for v in self._cat.by_path.get((dataset, path), ())
        ]

    def versions(self, dataset: str, path: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self._cat.by_path.get((dataset, path), ()):
            st = self._cat.files.get(FileKey(dataset, path, v))
            if st is not None:
                out[v] = st.size
        return out

    # -- writes ----------------------------------------------------------------------

    def put(self, key: PageKey, data: bytes | memoryview, meta: PutMeta) -> bool:
        fk, index = key.file, key.index
        size, psize = meta.file_size, meta.page_size
        if psize <= 0 or size < 0 or index < 0:
            raise InvalidArgument(f"invalid page geometry for {key}: {meta}")
        large = size > psize
        npages = -(-size // psize) if large else 1
        expected = min(psize, size - index * psize) if large else size
        if index >= npages or len(data) != expected:
            raise InvalidArgument(
                f"page {key} of {meta} must hold {expected} bytes, got {len(data)}"
            )
        if meta.eviction:
            self._per_dataset.set_kind(fk.dataset, meta.eviction)
        st = self._cat.files.get(fk)
        if st is not None and (st.size != size or (large and st.page_size != psize)):
            log.info("tier %s: %s cached with another geometry, replacing it", self.name, fk)
            self._cat.drop_file(fk)
            st = None
        e = self._cat.pages.get(key)
        if e is not None:
            if meta.pin and not e.pinned:
                e.pinned = True
                self._cat.pin(fk, self._cat.files[fk])
                self._index.put_page(key, e)
            return True
        try:
            if not self._make_room(len(data), fk):
                return False
            self._write(key, data, meta, st)
        except OSError as exc:
            log.warning("tier %s: cannot store %s: %s", self.name, key, exc)
            return False
        self._index.maybe_flush()
        return True

    def _write(
        self, key: PageKey, data: bytes | memoryview, meta: PutMeta, st: FileState | None
    ) -> None:
        fk = key.file
        if meta.file_size > meta.page_size:
            if st is None:
                name = data_name(fk)
                self._large.create(name, meta.file_size)
                st = FileState(meta.file_size, meta.page_size, name)
                self._index.put_file(fk, FileRow(meta.file_size, meta.page_size, name))
                self._cat.add_file(fk, st)
                self._policy.add(fk)
            seg, offset = -1, key.index * meta.page_size
            self._large.write(st.name, offset, data)
            self._cat.large_bytes += len(data)
        else:
            seg, offset = self._segments.append(key, data)
            st = FileState(meta.file_size, meta.page_size)
            self._cat.add_file(fk, st)
            self._policy.add(fk)
        now = self._clock()
        e = PageEntry(
            seg, offset, len(data), _checksum(data), pinned=meta.pin,
            expires_at=meta.expires_at, last_access=now, inserted_at=now,
        )  # fmt: skip
        self._cat.add_page(key, st, e)
        self._policy.touch(fk)
        self._index.put_page(key, e)

    # -- space -----------------------------------------------------------------------

    def _make_room(self, need: int, putting: FileKey) -> bool:
        """Evict (by policy) until ``need`` more bytes fit; False if they cannot."""
        cap = self.spec.capacity
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
            self._compact(seg)
        return self._cat.used() + need <= high

    def _evict(self, fk: FileKey) -> None:
        if self.demote_to is not None:
            self._demote(fk, self.demote_to)
        self._evicted_bytes += self._cat.drop_file(fk)

    def _demote(self, fk: FileKey, to: PageStore) -> None:
        """Hand an evicted file's pages to the next tier down (best effort)."""
        st = self._cat.files[fk]
        for index in sorted(st.pages):
            key = PageKey(fk, index)
            e = self._cat.pages.get(key)
            data = None if e is None else self._read(key, e)
            if e is None or data is None or fk not in self._cat.files:
                return
            meta = PutMeta(st.size, st.page_size, expires_at=e.expires_at)
            if not to.put(key, data, meta):
                return

    def _compact_ready(self) -> None:
        for seg in self._segments.take_ready():
            self._compact(seg)

    def _compact(self, seg: int) -> None:
        """Copy a segment's live entries to the active segment, then unlink it.

        The old bytes are never overwritten: a reader holding the old location and an
        open descriptor still reads them after the unlink.
        """
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
        # the new locations must be committed before the old bytes go away
        self._index.flush(touches=False)
        self._segments.remove(seg)

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

    def delete(self, file: FileKey | None = None, *, dataset: str | None = None) -> int:
        if file is not None and dataset is None:
            return self._drop_files([file], "delete")
        if dataset is not None and file is None:
            return self._drop_files(list(self._cat.datasets.get(dataset, ())), "delete")
        raise InvalidArgument("delete needs either a file or a dataset")

    def drop_corrupt(self, key: PageKey) -> None:
        if key in self._cat.pages:
            self._corrupt(key, "reported by a reader")

    def expire(self, now: float) -> int:
        return self._drop_files(self._cat.pop_expired(now), "expire")

    # -- the rest ----------------------------------------------------------------------

    def usage(self) -> Usage:
        return Usage(
            capacity=self.spec.capacity,
            used=self._cat.used(),
            pages=len(self._cat.pages),
            files=len(self._cat.files),
            evicted_bytes=self._evicted_bytes,
            corrupt_pages=self._corrupt_pages,
            by_dataset=self._cat.by_dataset(),
        )

    def flush(self) -> None:
        self._index.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._index.close()
        finally:
            self._seg_fds.close()
            self._large_fds.close()
            layout.unlock(self._lock_fd)

    def __repr__(self) -> str:
        return f"DiskTier({self.name}:{self.root})"

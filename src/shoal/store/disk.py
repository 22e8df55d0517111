"""DiskTier: a page store over one directory (an SSD or HDD path, or /dev/shm for MEM).

Owns the tier's behaviour: reads with checksum verification, writes, TTL, pinning and
the failure policy (an OSError is logged and becomes a miss or a refused put, never an
exception). Eviction down to the watermarks (each evicted file version handed to the
tier's ``on_evict`` sink: demotion, wired by the tiered composite) and segment
compaction are in :mod:`~shoal.store.room`; the health transitions in
:mod:`~shoal.store.tierhealth`. What is stored lives in :mod:`~shoal.store.catalog`
(which also answers the listings); the bytes in :mod:`~shoal.store.segments` (small
files) and :mod:`~shoal.store.largefiles` (one sparse file per large version); the rows
that survive a restart in :mod:`~shoal.store.index`; the directory layout in
:mod:`~shoal.store.layout`.

``used`` is segment bytes (dead ones included until their segment is compacted) plus
the bytes of the large-file pages present. The eviction unit is a small file or a whole
large-file version. A run of new small files (``put_many``, :mod:`~shoal.store.runs`)
is written with one write. A read touches no SQLite and opens no file: a dict lookup, one
``os.pread`` on a cached descriptor, one xxh3.

The tier's room is the smaller of its declared capacity and what its filesystem
really has (:mod:`~shoal.store.space`); a write that fails with ``ENOSPC`` makes room
by the real free space and is retried once. A refused put is logged aggregated (one
line per interval) and its reason kept (:meth:`DiskTier.refusal`). A disk that keeps
failing takes the tier down for a while (:mod:`~shoal.store.health`): reads miss and
puts are refused without touching it. Data files the index does not track are
reclaimed by a background walk (:mod:`~shoal.store.reclaim`, :meth:`DiskTier.reclaim`).

Index rows are committed in batches as writes happen; call :meth:`DiskTier.flush` now
and then (e.g. every 100 ms from the worker's loop) so that access statistics and the
tail of a burst are persisted while idle. After a crash, bytes written after the last
commit are leaked (until their segment is compacted), never served.
"""

from __future__ import annotations

import errno
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
from shoal.store.base import (
    CacheStore,
    EvictionSink,
    Location,
    PageStore,
    PutMeta,
    Tier,
    Usage,
)
from shoal.store.catalog import Catalog, CatalogListings, FileState
from shoal.store.demotion import Demotion
from shoal.store.eviction import PerDataset
from shoal.store.fds import FdCache
from shoal.store.health import TierHealth
from shoal.store.index import FileRow, PageEntry, TierIndex
from shoal.store.largefiles import LargeFiles, data_name
from shoal.store.reclaim import Reclaimer
from shoal.store.room import RoomKeeper
from shoal.store.runs import RunWriter
from shoal.store.segments import SegmentSet
from shoal.store.space import Aggregated, FsSpace
from shoal.store.tierhealth import HealthReporting

log = logging.getLogger("shoal.store.disk")

MiB = 1 << 20
_checksum = xxhash.xxh3_64_intdigest
#: write errors that mean "no room": make room by the filesystem's real free space
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class DiskTier(RoomKeeper, HealthReporting, CatalogListings, RunWriter, Tier):
    """A :class:`~shoal.store.base.Tier` over ``spec.path``; see the module docstring.

    ``segment_size`` is where segments roll (default: capacity/16, 64 KiB..64 MiB);
    ``clock`` gives wall-clock seconds (TTL, statistics). ``on_evict`` receives the file
    versions this tier evicts (a :class:`~shoal.store.tiered.TieredStore` sets it);
    ``demote_to`` is the shorthand for a tier used on its own: its evicted pages go into
    that store.
    """

    def __init__(
        self,
        spec: TierSpec,
        *,
        segment_size: int | None = None,
        clock: Callable[[], float] = time.time,
        demote_to: CacheStore | None = None,
        on_evict: EvictionSink | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.root = spec.path
        if on_evict is None and demote_to is not None:
            on_evict = Demotion((demote_to,))
        self.on_evict = on_evict
        self._clock = clock
        self._space = FsSpace(self.root)
        self._health = TierHealth()
        #: mirrors of the health state the hot paths test (one attribute, no call)
        self._is_down = self._unwell = False
        self._warnings = Aggregated(log)
        #: why the last refused put was refused (see PageStore.refusal)
        self._refusal = ""
        self._seg_fds = FdCache(1024)
        self._large_fds = FdCache(64)
        self._evicted_bytes = 0
        self._corrupt_pages = 0
        self._closed = False
        self._lock_fd = layout.lock(self.root)
        try:
            layout.prepare(self.root)
            try:
                self._open(segment_size or 64 * 1024)
            except sqlite3.DatabaseError as exc:
                log.warning(
                    "tier %s: index unreadable (%s): discarding cached data", self.name, exc
                )
                layout.wipe(self.root)
                self._open(segment_size or 64 * 1024)
        except BaseException:
            layout.unlock(self._lock_fd)
            raise
        self._space.refresh(self._cat.used())
        if segment_size is None:
            # segments roll at 1/16 of the room the tier really has, so that a tier
            # declared larger than its disk still has segments small enough to compact
            self._segments.target_size = min(64 * MiB, max(64 * 1024, self._capacity() // 16))
        self._reclaimer: Reclaimer | None = Reclaimer(
            self.root, self._segments.__contains__, self._cat.large_names.__contains__
        )
        log.info(
            "tier %s at %s: %d files, %d bytes from the index",
            self.name,
            self.root,
            len(self._cat.files),
            self._cat.used(),
        )

    def _open(self, segment_size: int) -> None:
        """Open the index and rebuild the catalog from it (DatabaseError if unreadable)."""
        for sub in (layout.SEG_DIR, layout.FILES_DIR):
            os.makedirs(os.path.join(self.root, sub), mode=0o700, exist_ok=True)
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
            self._warnings.note(
                "read_error",
                f"tier {self.name}: %d reads failed in the last %.0fs, dropped (last: %s)",
                f"{key}: {exc}",
            )
            self._io_error()
            self._cat.drop_file(key.file)
            return None
        if self._unwell:
            self._io_ok()
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
        if self._is_down and self._down():
            return None
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
        if self._is_down and self._down():
            return None
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
        return self.touch_pages(key.file, key.index, key.index + 1) == 1

    def touch_pages(self, file: FileKey, start: int, stop: int) -> int:
        """As :meth:`touch` page by page (each page's statistics and index row; the
        file's place in the eviction order as that many reads), with one clock
        reading, one check of the tier's health and one eviction update for all."""
        if stop <= start or (self._is_down and self._down()):
            return 0
        now = self._clock()
        pages, touched = self._cat.pages, self._index.touch
        n = 0
        for i in range(start, stop):
            key = PageKey(file, i)
            e = pages.get(key)
            if e is None:
                break
            if e.expires_at and e.expires_at <= now:
                self._cat.drop_file(file)
                return n
            e.last_access = now
            e.access_count += 1
            touched(key, e)
            n += 1
        self._policy.touch_times(file, n)
        return n

    def locate_file(self, file: FileKey) -> Location | None:
        if self._is_down and self._down():
            return None
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

    def locate_run(self, file: FileKey) -> tuple[Location, list[int]] | None:
        if self._is_down and self._down():
            return None
        st = self._cat.files.get(file)
        if st is None or not st.large or len(st.pages) < st.npages:
            return None
        if st.expires_at and st.expires_at <= self._clock():
            return None  # expired: dropped by the next access that counts
        pages = self._cat.pages
        try:
            sums = [pages[file.page(i)].checksum for i in range(st.npages)]
        except KeyError:
            return None
        return Location(self._large.path(st.name), 0, st.size, 0, self.name), sums

    @property
    def demote_to(self) -> PageStore | None:
        """The store right below that this tier's evicted pages go to (None: dropped)."""
        nxt: PageStore | None = getattr(self.on_evict, "next", None)
        return nxt

    def contains(self, key: PageKey) -> bool:
        return key in self._cat.pages and not (self._is_down and self._down())

    def has_file(self, file: FileKey) -> bool:
        return file in self._cat.files and not (self._is_down and self._down())

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
        if self._is_down and self._down():
            return self._refuse("down", "tier down: its disk keeps failing", key)
        e = self._cat.pages.get(key)
        if e is not None:
            if meta.pin and not e.pinned:
                e.pinned = True
                self._cat.pin(fk, self._cat.files[fk])
                self._index.put_page(key, e)
            return True
        try:
            self._store(key, data, meta, st)
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                self._io_error()
                return self._refuse("write_error", f"cannot write: {exc}", key)
            # the filesystem is fuller than the last check said: look again, make room
            # by what is really free (evicting), and retry once
            self._space.refresh(self._cat.used())
            try:
                self._store(key, data, meta, self._cat.files.get(fk))
            except (OSError, _NoRoom) as exc2:
                why = exc2.strerror if isinstance(exc2, OSError) else None
                if why:  # out of room even after making room: quota, inodes, a bad disk
                    self._io_error()
                return self._refuse("no_space", f"cache full: {why or exc2}", key)
        except _NoRoom as why:
            return self._refuse("full", f"cache full: {why}", key)
        if self._unwell:
            self._io_ok()
        self._index.maybe_flush()
        return True

    def _store(
        self, key: PageKey, data: bytes | memoryview, meta: PutMeta, st: FileState | None
    ) -> None:
        """Make room and write (OSError, or _NoRoom when eviction cannot make room)."""
        if not self._make_room(len(data), key.file):
            raise _NoRoom(self._no_room_reason(len(data)))
        self._write(key, data, meta, st)

    def _refuse(self, kind: str, why: str, key: PageKey) -> bool:
        """A put that could not be stored: remember why, log it aggregated; False."""
        self._refusal = why
        self._warnings.note(
            kind, f"tier {self.name}: %d puts refused in the last %.0fs (last: %s)", f"{key}: {why}"
        )
        return False

    def refusal(self) -> str:
        return self._refusal

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
        self._record(key, st, seg, offset, data, meta, self._clock())

    def _record(
        self,
        key: PageKey,
        st: FileState,
        seg: int,
        offset: int,
        data: bytes | memoryview,
        meta: PutMeta,
        now: float,
    ) -> None:
        """A page written at (seg, offset): into the catalog, the policy and the index."""
        e = PageEntry(
            seg, offset, len(data), _checksum(data), pinned=meta.pin,
            expires_at=meta.expires_at, last_access=now, inserted_at=now,
        )  # fmt: skip
        self._cat.add_page(key, st, e)
        self._policy.touch(key.file)
        self._index.put_page(key, e)

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
        room = self._space.last()
        return Usage(
            capacity=self.spec.capacity if room is None else min(self.spec.capacity, room),
            used=self._cat.used(),
            pages=len(self._cat.pages),
            files=len(self._cat.files),
            evicted_bytes=self._evicted_bytes,
            corrupt_pages=self._corrupt_pages,
            by_dataset=self._cat.by_dataset(),
        )

    def flush(self) -> None:
        """Commit buffered index changes now; access statistics only when due (they
        are written on close, and a lost one costs an eviction's precision, no data)."""
        self._index.flush_due()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reclaimer is not None:
            self._reclaimer.close()
        try:
            self._index.close()
        finally:
            self._seg_fds.close()
            self._large_fds.close()
            layout.unlock(self._lock_fd)

    def reclaim(self, budget: int) -> bool:
        """Look at up to ``budget`` entries of the tier's data directories and unlink the
        data files the index does not track (see :mod:`~shoal.store.reclaim`); False
        once the walk (done once per open) is over."""
        r = self._reclaimer
        if r is None or self._closed:
            return False
        if r.step(budget):
            return True
        self._reclaimer = None
        if r.files:
            log.info(
                "tier %s: reclaimed %d untracked data files (%d bytes)",
                self.name,
                r.files,
                r.bytes,
            )
        return False

    def __repr__(self) -> str:
        return f"DiskTier({self.name}:{self.root})"


class _NoRoom(Exception):
    """Eviction could not make room for a put (the message says why)."""

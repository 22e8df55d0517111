"""The disk tier's persistent index: SQLite (WAL) behind a write-behind buffer.

The tier's in-memory dicts are the runtime truth; this module only makes them survive a
restart. Changes are buffered and committed in batches (every ``flush_interval`` seconds
or ``flush_rows`` changes, checked on each write, and on ``flush``/``close``), never one
commit per put. Access statistics (``touch``) are persisted lazily, every
``touch_interval`` seconds, at most ``touch_rows`` per commit (a warm epoch touches
every page it reads; the rest follow in the next commits), and all of them on
``close``. With ``synchronous=NORMAL`` a commit costs no fsync.

Schema (one row per page, per large file, per segment)::

    pages(dataset, path, version, idx) -> seg (-1: page of a large file), offset,
          length, checksum (xxh3_64 as signed int64), pinned, expires_at, last_access,
          access_count, inserted_at
    files(dataset, path, version) -> file_size, page_size, name (relative data path)
    segments(id) -> size (end offset as last recorded)
    meta(key) -> value

After a crash the rows of the last uncommitted batch are lost: their bytes are leaked
(counted nowhere, reclaimed when their segment is compacted) and nothing is served from
them. A committed row can point at bytes that never reached the disk; the checksum
catches that on read.
"""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from shoal.core.types import FileKey, PageKey
from shoal.store.space import Aggregated

log = logging.getLogger("shoal.store.disk")

SCHEMA = """
CREATE TABLE IF NOT EXISTS pages (
    dataset TEXT NOT NULL, path TEXT NOT NULL, version TEXT NOT NULL, idx INTEGER NOT NULL,
    seg INTEGER NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL,
    checksum INTEGER NOT NULL, pinned INTEGER NOT NULL, expires_at REAL NOT NULL,
    last_access REAL NOT NULL, access_count INTEGER NOT NULL, inserted_at REAL NOT NULL,
    PRIMARY KEY (dataset, path, version, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS files (
    dataset TEXT NOT NULL, path TEXT NOT NULL, version TEXT NOT NULL,
    file_size INTEGER NOT NULL, page_size INTEGER NOT NULL, name TEXT NOT NULL,
    PRIMARY KEY (dataset, path, version)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS segments (id INTEGER PRIMARY KEY, size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1


def _to_i64(x: int) -> int:
    return x - _U64 if x > _I64_MAX else x


def _to_u64(x: int) -> int:
    return x + _U64 if x < 0 else x


def _private(path: str) -> None:
    """Create the database file 0600 (or make an older one so) before SQLite opens it:
    SQLite gives its -wal and -shm files the database file's mode."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return  # SQLite reports the real problem
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        pass
    finally:
        os.close(fd)


class PageEntry:
    """A stored page: where its bytes are, their checksum, and its cache statistics."""

    __slots__ = (
        "access_count",
        "checksum",
        "expires_at",
        "inserted_at",
        "last_access",
        "length",
        "offset",
        "pinned",
        "seg",
    )

    def __init__(
        self,
        seg: int,
        offset: int,
        length: int,
        checksum: int,
        *,
        pinned: bool = False,
        expires_at: float = 0.0,
        last_access: float = 0.0,
        access_count: int = 1,
        inserted_at: float = 0.0,
    ) -> None:
        #: segment id, or -1 for a page of a large file (offset is then index * page_size)
        self.seg = seg
        self.offset = offset
        self.length = length
        self.checksum = checksum
        self.pinned = pinned
        self.expires_at = expires_at
        self.last_access = last_access
        self.access_count = access_count
        self.inserted_at = inserted_at


@dataclass(frozen=True, slots=True)
class FileRow:
    """A large file version: its geometry and the data file name relative to the tier."""

    file_size: int
    page_size: int
    name: str


def _page_row(key: PageKey, e: PageEntry) -> tuple[object, ...]:
    f = key.file
    return (
        f.dataset, f.path, f.version, key.index, e.seg, e.offset, e.length,
        _to_i64(e.checksum), int(e.pinned), e.expires_at, e.last_access, e.access_count,
        e.inserted_at,
    )  # fmt: skip


class TierIndex:
    """Write-behind persistence of the tier's pages, large files and segments."""

    def __init__(
        self,
        path: str,
        *,
        flush_interval: float = 0.1,
        flush_rows: int = 2000,
        touch_interval: float = 5.0,
        touch_rows: int = 2000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.flush_interval = flush_interval
        self.flush_rows = flush_rows
        self.touch_interval = touch_interval
        self.touch_rows = touch_rows
        self._clock = clock
        _private(path)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
        except BaseException:
            self._db.close()
            raise
        self._pages: dict[PageKey, PageEntry | None] = {}
        self._files: dict[FileKey, FileRow | None] = {}
        self._segs: dict[int, int | None] = {}
        self._touched: dict[PageKey, PageEntry] = {}
        self._warnings = Aggregated(log)
        self._last_flush = self._last_touch_flush = clock()

    # -- loading ---------------------------------------------------------------------

    def load_segments(self) -> list[tuple[int, int]]:
        return [(int(r[0]), int(r[1])) for r in self._db.execute("SELECT id, size FROM segments")]

    def load_files(self) -> Iterator[tuple[FileKey, FileRow]]:
        q = "SELECT dataset, path, version, file_size, page_size, name FROM files"
        for ds, p, v, size, psize, name in self._db.execute(q):
            yield FileKey(ds, p, v), FileRow(size, psize, name)

    def load_pages(self) -> Iterator[tuple[PageKey, PageEntry]]:
        q = "SELECT * FROM pages"
        for ds, p, v, idx, seg, off, ln, ck, pin, exp, la, ac, ins in self._db.execute(q):
            entry = PageEntry(
                seg, off, ln, _to_u64(ck), pinned=bool(pin), expires_at=exp,
                last_access=la, access_count=ac, inserted_at=ins,
            )  # fmt: skip
            yield PageKey(FileKey(ds, p, v), idx), entry

    # -- buffered changes ------------------------------------------------------------

    def put_page(self, key: PageKey, entry: PageEntry) -> None:
        self._pages[key] = entry

    def delete_page(self, key: PageKey) -> None:
        self._pages[key] = None
        self._touched.pop(key, None)

    def touch(self, key: PageKey, entry: PageEntry) -> None:
        self._touched[key] = entry

    def put_file(self, key: FileKey, row: FileRow) -> None:
        self._files[key] = row

    def delete_file(self, key: FileKey) -> None:
        self._files[key] = None

    def set_segment(self, seg: int, size: int) -> None:
        self._segs[seg] = size

    def delete_segment(self, seg: int) -> None:
        self._segs[seg] = None

    @property
    def pending(self) -> int:
        return len(self._pages) + len(self._files) + len(self._segs)

    def maybe_flush(self) -> None:
        """Commit if the batch is old or large enough (cheap when it is not)."""
        now = self._clock()
        if self.pending >= self.flush_rows or (
            self.pending and now - self._last_flush >= self.flush_interval
        ):
            self.flush_due()

    def flush_due(self) -> bool:
        """Commit the buffered changes, and a slice of the access statistics when they
        are due (what the periodic commits do; :meth:`flush` writes them all)."""
        return self.flush(touches=self.touches_due(), touch_rows=self.touch_rows)

    def touches_due(self) -> bool:
        """Whether access statistics are due to be written (every ``touch_interval``:
        a warm epoch touches every page it reads, and writing each of those rows five
        times a second was most of a worker's CPU under short-circuit reads)."""
        return self._clock() - self._last_touch_flush >= self.touch_interval

    def flush(self, *, touches: bool = True, touch_rows: int | None = None) -> bool:
        """Commit every buffered change (and access statistics, at most ``touch_rows``
        of them: the rest stay due for the next flush); False if SQLite failed."""
        pages, files, segs = self._pages, self._files, self._segs
        touched = self._touched if touches else {}
        if touch_rows is not None and len(touched) > touch_rows:
            # a warm epoch's touches a slice per flush: one commit of 20,000 rows held
            # the worker's loop (every read it serves) for ~140 ms
            touched = dict(itertools.islice(touched.items(), touch_rows))
        if not (pages or files or segs or touched):
            return True
        now = self._clock()
        try:
            with self._db:
                self._db.execute("BEGIN")
                # rows are made as SQLite takes them: a list of a warm epoch's touches
                # (thousands of tuples) outlived the young generations, and its garbage
                # collections stalled the worker's loop (120 -> 34 ms for 5,000 rows)
                self._write_pages(_page_row(k, e) for k, e in touched.items() if k not in pages)
                self._write_pages(_page_row(k, e) for k, e in pages.items() if e is not None)
                gone = [
                    (k.file.dataset, k.file.path, k.file.version, k.index)
                    for k, e in pages.items()
                    if e is None
                ]
                self._db.executemany(
                    "DELETE FROM pages WHERE dataset=? AND path=? AND version=? AND idx=?", gone
                )
                self._db.executemany(
                    "INSERT OR REPLACE INTO files VALUES (?,?,?,?,?,?)",
                    [
                        (k.dataset, k.path, k.version, r.file_size, r.page_size, r.name)
                        for k, r in files.items()
                        if r is not None
                    ],
                )
                self._db.executemany(
                    "DELETE FROM files WHERE dataset=? AND path=? AND version=?",
                    [(k.dataset, k.path, k.version) for k, r in files.items() if r is None],
                )
                self._db.executemany(
                    "INSERT OR REPLACE INTO segments VALUES (?,?)",
                    [(s, n) for s, n in segs.items() if n is not None],
                )
                self._db.executemany(
                    "DELETE FROM segments WHERE id=?", [(s,) for s, n in segs.items() if n is None]
                )
        except sqlite3.Error as exc:
            # keep the batch; the next flush retries it (a full disk fails every flush:
            # one line per interval, not five a second)
            self._warnings.note(
                "commit",
                "tier index: %d commits failed in the last %.0fs, changes kept for retry (%s)",
                f"{self.pending} changes pending: {exc}",
            )
            self._last_flush = now
            return False
        self._pages, self._files, self._segs = {}, {}, {}
        if touched is self._touched:
            self._touched = {}
        else:
            for k in touched:
                del self._touched[k]
        if touches and not self._touched:
            self._last_touch_flush = now  # else still due: the next slice next time
        self._last_flush = now
        return True

    def _write_pages(self, rows: Iterable[tuple[object, ...]]) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO pages VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", rows
        )

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._db.close()

    def abandon(self) -> None:
        """Close without writing anything (the database is being discarded)."""
        self._pages, self._files, self._segs, self._touched = {}, {}, {}, {}
        self._db.close()

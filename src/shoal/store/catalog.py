"""The disk tier's in-memory catalog: the runtime truth about what a tier holds.

Owns the dicts of pages and file versions, per-dataset grouping, the TTL heap, the
eviction policy's view of the units, byte accounting, and rebuilding all of that from
the index on restart (from the index alone: no directory is scanned). Dropping a file
here releases its bytes: segment entries are marked dead (compaction is the tier's
job), a large file's data file is unlinked.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Set

from shoal.core.types import FileKey, PageKey
from shoal.store.base import DatasetUsage
from shoal.store.eviction import EvictionPolicy, UnitStats
from shoal.store.index import PageEntry, TierIndex
from shoal.store.largefiles import LargeFiles
from shoal.store.segments import SegmentSet

log = logging.getLogger("shoal.store.disk")

#: the page sets of a small (one-page) file, shared: a set of its own per file cost 216
#: bytes for each of a million cached files (large files get a mutable set each)
NO_PAGES: frozenset[int] = frozenset()
PAGE_0: frozenset[int] = frozenset((0,))


class FileState:
    """One stored file version: its geometry, present pages and byte count."""

    __slots__ = ("bytes", "expires_at", "large", "name", "npages", "page_size", "pages", "pinned", "size")  # fmt: skip

    def __init__(self, size: int, page_size: int, name: str = "") -> None:
        self.size = size
        self.page_size = page_size
        self.large = size > page_size
        self.npages = -(-size // page_size) if self.large else 1
        #: data file name relative to the tier (large files only)
        self.name = name
        #: indexes of the pages present (the file's bitmap; shared constants for a
        #: small file, changed only through the catalog)
        self.pages: Set[int] = set() if self.large else NO_PAGES
        self.bytes = 0
        self.pinned = False
        #: earliest expiry of any of its pages; 0 = never
        self.expires_at = 0.0


class Catalog:
    """Pages, files and their accounting for one tier."""

    def __init__(
        self,
        index: TierIndex,
        segments: SegmentSet,
        large: LargeFiles,
        policy: EvictionPolicy[FileKey],
    ) -> None:
        self.index = index
        self.segments = segments
        self.large = large
        self.policy = policy
        self.pages: dict[PageKey, PageEntry] = {}
        self.files: dict[FileKey, FileState] = {}
        self.datasets: dict[str, dict[FileKey, FileState]] = {}
        #: bytes stored per dataset, kept as pages come and go (by_dataset is O(datasets)
        #: for the heartbeat, not O(files): a scan of every file each second stalled the loop)
        self.dataset_bytes: dict[str, int] = {}
        #: dataset -> path -> cached versions of that file (a tuple: almost always one, and
        #: a set per cached file cost 216 bytes; keyed per dataset: no key tuple per file)
        self.by_path: dict[str, dict[str, tuple[str, ...]]] = {}
        #: (dataset, directory) -> paths of the files cached in it
        self.by_dir: dict[tuple[str, str], set[str]] = {}
        #: data file names of the large file versions (what reclaim must not unlink)
        self.large_names: set[str] = set()
        self._expiry: list[tuple[float, int, FileKey]] = []
        self._seq = 0  # tie-breaker: FileKeys do not order
        self.large_bytes = 0
        #: moves on every page added, dropped or moved (see PageStore.changes)
        self.changes = 0

    def used(self) -> int:
        return self.segments.total_bytes + self.large_bytes

    def load(self) -> None:
        """Rebuild everything from the index."""
        for seg, size in self.index.load_segments():
            self.segments.restore(seg, size)
        rows = dict(self.index.load_files())
        stats: dict[FileKey, tuple[float, int, float]] = {}
        for key, e in self.index.load_pages():
            fk = key.file
            st = self.files.get(fk)
            if st is None:
                row = rows.get(fk)
                if e.seg >= 0:
                    st = FileState(e.length, max(1, e.length))
                elif row is not None:
                    st = FileState(row.file_size, row.page_size, row.name)
                else:
                    self.index.delete_page(key)  # its file row never committed
                    continue
                self.add_file(fk, st)
            if e.seg >= 0:
                self.segments.restore_entry(e.seg, key, e.offset, e.length)
            else:
                self.large_bytes += e.length
            self.add_page(key, st, e)
            last, count, first = stats.get(fk, (0.0, 0, e.inserted_at))
            stats[fk] = (
                max(last, e.last_access),
                count + e.access_count,
                min(first, e.inserted_at),
            )
        for fk, row in rows.items():
            if fk not in self.files:
                self.add_file(fk, FileState(row.file_size, row.page_size, row.name))
        # a large file's frequency is the sum of its pages' (as at run time)
        self.policy.load(
            (fk, UnitStats(*stats.get(fk, (0.0, 1, 0.0))))
            for fk, st in self.files.items()
            if not st.pinned
        )
        self.segments.check_all()

    def add_file(self, fk: FileKey, st: FileState) -> None:
        """A new file version (not yet in the policy: the caller adds it)."""
        self.files[fk] = st
        if st.large:
            self.large_names.add(st.name)
        # no setdefault: its default would be a new dict or set per file, mostly thrown
        # away (a load of many small files adds them by the thousand)
        files = self.datasets.get(fk.dataset)
        if files is None:
            files = self.datasets[fk.dataset] = {}
        files[fk] = st
        paths_of = self.by_path.get(fk.dataset)
        if paths_of is None:
            paths_of = self.by_path[fk.dataset] = {}
        versions = paths_of.get(fk.path)
        if versions is None:
            paths_of[fk.path] = (fk.version,)
        elif fk.version not in versions:
            paths_of[fk.path] = (*versions, fk.version)
        where = (fk.dataset, fk.path.rpartition("/")[0])
        paths = self.by_dir.get(where)
        if paths is None:
            self.by_dir[where] = {fk.path}
        else:
            paths.add(fk.path)

    def add_page(self, key: PageKey, st: FileState, e: PageEntry) -> None:
        self.changes += 1
        self.pages[key] = e
        if isinstance(st.pages, set):
            st.pages.add(key.index)
        else:
            st.pages = PAGE_0  # a small file's one page
        st.bytes += e.length
        ds = key.file.dataset
        self.dataset_bytes[ds] = self.dataset_bytes.get(ds, 0) + e.length
        if e.pinned:
            self.pin(key.file, st)
        if e.expires_at and (not st.expires_at or e.expires_at < st.expires_at):
            st.expires_at = e.expires_at
            self._seq += 1
            heapq.heappush(self._expiry, (e.expires_at, self._seq, key.file))

    def pin(self, fk: FileKey, st: FileState) -> None:
        if not st.pinned:
            st.pinned = True
            self.policy.remove(fk)

    def drop_file(self, fk: FileKey) -> int:
        """Forget a file version and release its bytes; its byte count (0 if unknown)."""
        st = self.files.pop(fk, None)
        if st is None:
            return 0
        self.changes += 1
        self.policy.remove(fk)
        ds = self.datasets[fk.dataset]
        del ds[fk]
        if not ds:
            del self.datasets[fk.dataset]
            self.dataset_bytes.pop(fk.dataset, None)
        else:
            self.dataset_bytes[fk.dataset] -= st.bytes
        paths_of = self.by_path.get(fk.dataset, {})
        vs = paths_of.get(fk.path)
        if vs is not None and fk.version in vs:
            rest = tuple(v for v in vs if v != fk.version)
            if rest:
                paths_of[fk.path] = rest
            else:
                del paths_of[fk.path]
                if not paths_of:
                    del self.by_path[fk.dataset]
                d = (fk.dataset, fk.path.rpartition("/")[0])
                paths = self.by_dir.get(d)
                if paths is not None:
                    paths.discard(fk.path)
                    if not paths:
                        del self.by_dir[d]
        for index in st.pages:
            key = PageKey(fk, index)
            e = self.pages.pop(key)
            self.index.delete_page(key)
            if e.seg >= 0:
                self.segments.mark_dead(e.seg, key)
        if st.large:
            self.large_bytes -= st.bytes
            self.large_names.discard(st.name)
            self.index.delete_file(fk)
            try:
                self.large.remove(st.name)
            except OSError as exc:
                log.warning("cannot remove %s: %s", st.name, exc)
        return st.bytes

    def drop_page(self, key: PageKey) -> None:
        """Forget one page of a large file (its bytes are reused by a re-put)."""
        self.changes += 1
        st = self.files[key.file]
        e = self.pages.pop(key)
        self.index.delete_page(key)
        if isinstance(st.pages, set):
            st.pages.discard(key.index)
        else:
            st.pages = NO_PAGES
        st.bytes -= e.length
        self.dataset_bytes[key.file.dataset] -= e.length
        self.large_bytes -= e.length

    def pop_expired(self, now: float) -> list[FileKey]:
        """File versions whose earliest page expiry is <= now (taken off the TTL heap)."""
        out = []
        while self._expiry and self._expiry[0][0] <= now:
            when, _, fk = heapq.heappop(self._expiry)
            st = self.files.get(fk)
            if st is not None and st.expires_at == when:
                out.append(fk)
        return out

    def by_dataset(self) -> dict[str, DatasetUsage]:
        return {
            ds: DatasetUsage(len(files), self.dataset_bytes.get(ds, 0))
            for ds, files in self.datasets.items()
        }


class CatalogListings:
    """The :class:`~shoal.store.base.Listings` a tier answers from its catalog (a mixin
    of :class:`~shoal.store.disk.DiskTier`; no disk access)."""

    _cat: Catalog

    def files(self, dataset: str, prefix: str = "") -> list[FileKey]:
        p = prefix.rstrip("/")
        return [
            FileKey(dataset, path, v)
            for path, vs in self._cat.by_path.get(dataset, {}).items()
            if not p or path == p or path.startswith(p + "/")
            for v in vs
        ]

    def file_count(self, dataset: str) -> int | None:
        return len(self._cat.datasets.get(dataset, ()))

    def files_in_dir(self, dataset: str, directory: str) -> list[FileKey]:
        versions = self._cat.by_path.get(dataset, {})
        return [
            FileKey(dataset, path, v)
            for path in self._cat.by_dir.get((dataset, directory), ())
            for v in versions.get(path, ())
        ]

    def versions(self, dataset: str, path: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self._cat.by_path.get(dataset, {}).get(path, ()):
            st = self._cat.files.get(FileKey(dataset, path, v))
            if st is not None:
                out[v] = st.size
        return out

    def changes(self) -> int | None:
        return self._cat.changes

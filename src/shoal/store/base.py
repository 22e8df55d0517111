"""The page-store interface that every tier and the tiered composite implement.

A page is identified by :class:`~shoal.core.types.PageKey` = (dataset, path, version,
index). A file no larger than its dataset's page size is a *small file*: it is stored
whole as page 0, packed into append-only segment files (no inode per file). A larger
file is stored as one file per version on the tier's directory, sparse while partly
cached, with a record of which pages are present, so that a complete file can be handed
to a reader as one open file.

Every stored page carries an xxh3_64 checksum. ``get`` verifies it (a mismatch drops the
page, counts it and returns None). ``locate`` does not read the bytes: it returns where
they are plus the checksum, and whoever reads them (a sendfile receiver, a short-circuit
client) verifies.

A tier failure (disk error, full disk) is logged and treated as a miss, never an outage.
All methods are synchronous and fast (local disk / tmpfs); the worker calls them on its
event loop.

The contract is split by what callers need, each a :class:`~typing.Protocol` (callers
type against the narrowest one; the tiers and the composite subclass them, so that a
missing method fails at construction):

- :class:`PageStore`: the page operations (get, locate, put and put_many, contains,
  delete, usage, close);
- :class:`Listings`: which file versions are cached (the worker's listings, restarts
  under "never revalidate", free and sync jobs);
- :class:`Handover`: locations handed to local readers that read the store's files
  themselves (whole-file locations, peeks and touches, a change counter);
- :class:`Maintenance`: upkeep the worker's loops and the read verifier drive (TTL,
  reclaim, flush, corrupt pages, why a put was refused);
- :class:`CacheStore`: all four, what a worker's loader holds; :class:`Tier` adds the
  demotion hook a :class:`~shoal.store.tiered.TieredStore` wires into each tier it
  stacks (``on_evict``, see :mod:`~shoal.store.demotion`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shoal.core.types import FileKey, PageKey


@dataclass(frozen=True, slots=True)
class Location:
    """Where a page's (or a whole file's) bytes are on local disk."""

    path: str  # the segment file or per-version data file
    offset: int
    length: int
    checksum: int  # xxh3_64 of the bytes; 0 for a whole large file (check per page)
    tier: str = ""


@dataclass(frozen=True, slots=True)
class PutMeta:
    """What the store needs to know about the file a page belongs to."""

    file_size: int
    page_size: int
    pin: bool = False
    #: absolute time.time() after which the page expires; 0 = never
    expires_at: float = 0.0
    #: tiers (mem, ssd, hdd) the dataset allows; empty = any
    tiers: tuple[str, ...] = ()
    #: the dataset's eviction policy (lru, lfu, fifo); empty = the tier's default
    eviction: str = ""


@dataclass(slots=True)
class DatasetUsage:
    files: int = 0
    bytes: int = 0


@dataclass(slots=True)
class Usage:
    capacity: int = 0
    used: int = 0
    pages: int = 0
    files: int = 0
    evicted_bytes: int = 0
    corrupt_pages: int = 0
    by_dataset: dict[str, DatasetUsage] = field(default_factory=dict)


#: the pages of one evicted file version, read lazily (a tier stops at an unreadable one)
EvictedPages = Iterator[tuple[PageKey, bytes, PutMeta]]
#: where a tier hands the file versions it evicts (see :mod:`~shoal.store.demotion`)
EvictionSink = Callable[[FileKey, EvictedPages], None]


class PageStore(Protocol):
    """The page operations: what every tier and the tiered composite implement."""

    name: str

    @abstractmethod
    def get(self, key: PageKey) -> bytes | None:
        """The page's bytes, checksum verified, or None on a miss or a corrupt page."""

    @abstractmethod
    def locate(self, key: PageKey) -> Location | None:
        """Where the page's bytes are, without reading them; None on a miss."""

    @abstractmethod
    def put(self, key: PageKey, data: bytes | memoryview, meta: PutMeta) -> bool:
        """Store a page (evicting as needed); False if it could not be stored."""

    def put_many(self, pages: Sequence[tuple[PageKey, bytes | memoryview, PutMeta]]) -> list[bool]:
        """Store several pages as ``put`` would one by one (a disk tier writes a run of
        small files with one write); whether each was stored."""
        return [self.put(key, data, meta) for key, data, meta in pages]

    def file_room(self) -> int | None:
        """The most bytes one large file version can take here whole (what eviction
        makes room up to); None = not known. The tiered composite places large files by
        it (see :mod:`~shoal.store.demotion`)."""
        return None

    @abstractmethod
    def contains(self, key: PageKey) -> bool: ...

    @abstractmethod
    def delete(self, file: FileKey | None = None, *, dataset: str | None = None) -> int:
        """Drop every page of one file version, or of a whole dataset; bytes freed."""

    @abstractmethod
    def usage(self) -> Usage: ...

    @abstractmethod
    def close(self) -> None:
        """Flush the index and release file descriptors."""


class Listings(Protocol):
    """Which file versions are cached: listings, restarts, free and sync jobs."""

    @abstractmethod
    def has_file(self, file: FileKey) -> bool:
        """True if any page of this file version is stored."""

    def files(self, dataset: str, prefix: str = "") -> list[FileKey]:
        """Every cached file version of a dataset at or below a path prefix."""
        return []

    def files_in_dir(self, dataset: str, directory: str) -> list[FileKey]:
        """Cached file versions directly in one directory (not below it)."""
        return [f for f in self.files(dataset, directory) if f.path.rpartition("/")[0] == directory]

    def file_count(self, dataset: str) -> int | None:
        """How many file versions of a dataset are cached (an upper bound); None =
        unknown without walking them all."""
        return None

    def versions(self, dataset: str, path: str) -> dict[str, int]:
        """Cached versions of one file -> file size. Lets a restarted worker serve what it
        holds without asking under storage (within a "never revalidate" bound)."""
        return {}


class Handover(Protocol):
    """Locations handed to readers that read the store's files themselves."""

    @abstractmethod
    def locate_file(self, file: FileKey) -> Location | None:
        """The whole file as one byte range on disk, if every page of it is present."""

    def locate_run(self, file: FileKey) -> tuple[Location, list[int]] | None:
        """A large version kept whole in one data file with every page present: that
        file as one Location (as :meth:`locate_file`, but without counting an access)
        and each page's checksum, in page order; None otherwise (a small file, a
        missing page, a store that keeps no such files). One answer per file for a
        local reader, instead of a location per page."""
        return None

    @abstractmethod
    def peek(self, key: PageKey) -> Location | None:
        """Where the page is, without counting an access."""

    @abstractmethod
    def touch(self, key: PageKey) -> bool:
        """Count an access to a page served elsewhere (a client read it through a
        handed-over descriptor); False on a miss."""

    def touch_pages(self, file: FileKey, start: int, stop: int) -> int:
        """:meth:`touch` pages ``start`` .. ``stop - 1`` of a file in order, up to the
        first one missing; how many were counted. A client reports its reads of a
        file as one item (TOUCH): a tier may count them without a call per page."""
        for i in range(start, stop):
            if not self.touch(file.page(i)):
                return i - start
        return max(0, stop - start)

    def changes(self) -> int | None:
        """A counter that moves whenever any page is added, dropped or moved, so that a
        caller may keep answers derived from locations until it moves; None = not
        tracked (derive nothing)."""
        return None


class Maintenance(Protocol):
    """Upkeep: TTL, reclaim, flush, corrupt pages, refused puts."""

    @abstractmethod
    def drop_corrupt(self, key: PageKey) -> None:
        """A reader found this page's bytes did not match its checksum: drop and count it."""

    @abstractmethod
    def expire(self, now: float) -> int:
        """Drop pages whose TTL passed; bytes freed."""

    def refusal(self) -> str:
        """Why the last put that returned False was refused ("" = not known)."""
        return ""

    def reclaim(self, budget: int) -> bool:
        """Do a bounded slice (``budget`` directory entries) of reclaiming on-disk data
        that the store does not track; True while there is more to do. Default:
        nothing to reclaim."""
        return False

    def flush(self) -> None:
        """Persist buffered bookkeeping (index rows, access statistics); call it now and
        then, e.g. from the worker's loop. Default: nothing is buffered."""
        return None


class CacheStore(PageStore, Listings, Handover, Maintenance, Protocol):
    """The whole surface: what a worker's loader holds (a tier or the composite)."""


class Tier(CacheStore, Protocol):
    """One tier a :class:`~shoal.store.tiered.TieredStore` stacks.

    ``on_evict``, when set (by the composite), receives each file version the tier
    evicts, with its pages read lazily; None = evicted pages are dropped.
    """

    on_evict: EvictionSink | None

    def evict(self, file: FileKey) -> int:
        """Evict one file version now as making room would (handed to ``on_evict``,
        then dropped); bytes freed. The composite moves a large file this way when its
        tier refuses a page of it. Default: drop it."""
        return self.delete(file)

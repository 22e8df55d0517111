"""Client-side state that outlives one event loop: datasets, the ring, file metadata
within each dataset's staleness bound, and short-circuit locations with their
descriptors. Kept apart from the loop-bound :class:`AsyncClient` so a forked child
(PyTorch DataLoader worker) keeps it: descriptors stay valid across fork.

Reads of these dicts happen on the caller's thread (the sync fast path) and writes on
the loop thread; single dict operations are atomic under the GIL, which is all the
fast path relies on.
"""

from __future__ import annotations

import array
import os
import time
from collections import OrderedDict
from dataclasses import field
from typing import TYPE_CHECKING, Any

from shoal.core.records import record
from shoal.core.types import NEVER, Dataset, FileInfo

if TYPE_CHECKING:
    from shoal.client.hostmeta import HostMeta, Space
    from shoal.core.manifest import Manifest
    from shoal.core.ring import Ring


@record
class WorkerAddr:
    id: str
    host: str
    port: int
    uds: str
    node: str
    #: its TCP port speaks TLS, as it registered; None: the master did not say (an
    #: older one): TLS exactly when the client has a CA
    tls: bool | None = None


@record
class PageLoc:
    """A cached page on a local worker: read it with pread(fds[fdkey], length, offset)."""

    fdkey: tuple[int, int]
    offset: int
    length: int
    checksum: int
    #: the worker that handed the descriptor over (hits are reported to it)
    worker: str
    #: the page layout it was located in: a reader slicing with another page size
    #: (the dataset's policy changed meanwhile) must not use it
    page_size: int


@record
class FileRun:
    """A located file's pages back to back in one descriptor (a large file kept whole,
    one LOCATE answer): page ``first + i`` is at ``offset + i * page_size``, its
    checksum ``sums[i]``, for ``count`` pages; the last page of the file may be short."""

    fdkey: tuple[int, int]
    offset: int
    first: int
    count: int
    sums: array.array[int]
    worker: str
    page_size: int


LocKey = tuple[str, str, str, int]  # dataset, path, version, page index
#: a located file version: dataset, path, version
RunKey = tuple[str, str, str]
#: the index under which ``ClientCache.verified`` keeps a worker's check of a run
RUN_CHECK = -1
#: a whole small file a LOCATE_DIR answer located: descriptor key, offset, size,
#: checksum, version, worker, page size (see ``ClientCache.dir_locs``)
SmallLoc = tuple[tuple[int, int], int, int, int, str, str, int]

#: seconds before a client asks a worker again for a directory's cached files
DIR_RELOCATE = 2.0
#: a stat that misses the metadata cache in a directory where this many did before
#: lists the directory instead (one round trip teaches every file in it): a reader that
#: stats a second file of a directory is taken to be walking it, as rclone's VFS and
#: the kernel's readdirplus assume, while a lone stat in a huge directory stays a stat;
#: once a process has listed a directory of a dataset so (it walks), its first miss in
#: any other directory of that dataset lists that one at once: one round trip per
#: directory, not a stat and then a listing (``ClientCache.walking``)
STAT_LIST_AFTER = 1
#: seconds before a directory listed for stats is listed again on a miss (a file that
#: was not in the listing: new, or not a file) when the staleness bound is shorter
DIR_RELIST = 2.0
#: directories whose stat misses are counted at most (then the count starts over)
MAX_STAT_DIRS = 1 << 16

#: bumped in every forked child, so a hot path can notice a fork without a system call
FORKS = [0]


def _forked() -> None:
    FORKS[0] += 1


os.register_at_fork(after_in_child=_forked)


@record(slots=False, frozen=False)
class Counters:
    #: reads served by pread on a handed-over descriptor (no worker round trip)
    short_circuit: int = 0
    #: reads answered by a worker on this host over the Unix socket
    local: int = 0
    #: reads answered by a worker over TCP
    remote: int = 0
    #: reads served by under storage because no worker could
    ufs_fallback: int = 0
    failovers: int = 0
    corrupt: int = 0
    bytes_short_circuit: int = 0
    bytes_local: int = 0
    bytes_remote: int = 0
    bytes_ufs: int = 0
    #: ufs_fallback by the error that sent the read there (its code; no_worker: none
    #: answered): a code of the one error table, so the label stays bounded
    fallback_causes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, int]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, int)}


class LRU(OrderedDict[Any, Any]):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        if len(self) > self.limit:
            self.popitem(last=False)


_get = dict.get


class MetaLRU(LRU):
    """The metadata cache, and behind it what this host's other client processes
    listed (``spaces``: dataset -> :class:`~shoal.client.hostmeta.Space`), looked up
    on a miss without building a record per listed file. Every reader of file
    metadata reads through ``get`` (the stat and read fast paths included), so a
    listing another process got answers here as one this process got would, with
    the time it was got for the staleness bound. Not for paths a LOCATE_DIR answer
    located (``skip``): their first read builds their records (ClientCache.remember)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.spaces: dict[str, Space] = {}
        self.skip: dict[tuple[str, str], SmallLoc] = {}

    def get(self, key: Any, default: Any = None) -> Any:
        hit = _get(self, key)
        if hit is not None or not self.spaces:
            return default if hit is None else hit
        space = self.spaces.get(key[0])
        if space is None or key in self.skip:
            return default
        got = space.lookup(key[1])
        return default if got is None else got


@record(slots=False, frozen=False)
class ClientCache:
    datasets: dict[str, tuple[Dataset, float]] = field(default_factory=dict)
    ring: Ring | None = None
    ring_at: float = 0.0
    workers: dict[str, WorkerAddr] = field(default_factory=dict)
    meta: MetaLRU = field(default_factory=lambda: MetaLRU(1_000_000))
    locs: dict[LocKey, PageLoc] = field(default_factory=dict)
    #: files located as one run each (shoal.client.handover); the worker's check of a
    #: run is ``verified[(*key, RUN_CHECK)]``, this process's own checks per page
    runs: dict[RunKey, FileRun] = field(default_factory=dict)
    #: (dataset, path) -> a whole small file located by LOCATE_DIR whose path ``meta``
    #: does not hold: kept raw, so that learning a dataset's files costs no records
    #: per file (shoal.client.local reads them); dropped whenever ``meta`` learns or
    #: forgets the path, or the descriptors go
    dir_locs: dict[tuple[str, str], SmallLoc] = field(default_factory=dict)
    fds: dict[tuple[int, int], int] = field(default_factory=dict)
    #: short-circuit hits not yet reported: (worker, dataset, path, version, pages, bytes)
    touch_log: list[tuple[str, str, str, str, int, int]] = field(default_factory=list)
    #: (worker, dataset, directory) whose cached files this process has located, and
    #: when; directory None: the whole dataset's
    dirs_located: dict[tuple[str, str, str | None], float] = field(default_factory=dict)
    #: (worker, dataset) -> how many directories this process asked it to locate
    dir_asks: dict[tuple[str, str], int] = field(default_factory=dict)
    #: (dataset, directory) -> stats that missed the metadata cache there (see
    #: STAT_LIST_AFTER), and when the directory was last listed to answer them
    stat_misses: dict[tuple[str, str], int] = field(default_factory=dict)
    dirs_listed: dict[tuple[str, str], float] = field(default_factory=dict)
    #: datasets this process has listed a directory of for its stats (a walker)
    walking: set[str] = field(default_factory=set)
    #: located pages this process checked whole for a partial read -> the data file's
    #: ctime then (see shoal.client.local)
    verified: dict[LocKey, int] = field(default_factory=dict)
    #: located pages that failed their checksum, not yet reported: (worker, key)
    bad_pages: list[tuple[str, LocKey]] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    max_fds: int = 512
    #: dataset -> (manifest id, manifest)
    manifests: dict[str, tuple[str, Manifest]] = field(default_factory=dict)
    #: monotonic time of the last refresh of the dataset definitions (tried, at least);
    #: past ``refresh_every`` the short circuit stands aside until the next one
    checked_at: float = 0.0
    refresh_every: float = 10.0
    #: monotonic time of the last flush of ``touch_log``
    touched_at: float = 0.0
    #: the host's metadata cache (shoal.client.hostmeta; set by the client's Metadata)
    host: HostMeta | None = None

    def __post_init__(self) -> None:
        self.meta.skip = self.dir_locs

    def info(self, ds: Dataset, path: str) -> FileInfo | None:
        hit = self.meta.get((ds.name, path))
        if hit is None:
            return None
        info, at = hit
        bound = ds.policy.staleness
        if bound == NEVER or time.monotonic() - at <= bound:
            return info
        return None

    def remember(self, ds: str, info: FileInfo, at: float | None = None) -> None:
        """Keep ``info``, got at ``at`` (monotonic; None: now)."""
        self.meta.put((ds, info.path), (info, time.monotonic() if at is None else at))
        if self.dir_locs:  # a located small file: a page record now, if of this version
            small = self.dir_locs.pop((ds, info.path), None)
            if small is not None and small[4] == info.version:
                fdkey, off, size, ck, version, worker, ps = small
                self.locs[(ds, info.path, version, 0)] = PageLoc(fdkey, off, size, ck, worker, ps)

    def list_due(self, ds: Dataset, directory: str) -> bool:
        """Whether a stat that missed in ``directory`` should list it (STAT_LIST_AFTER
        misses before, or none in a dataset this process walks; not listed within the
        staleness bound or DIR_RELIST): never for
        a dataset that revalidates always, whose listings are never reused."""
        bound = ds.policy.staleness
        if bound == 0:
            return False
        key = (ds.name, directory)
        misses = self.stat_misses.get(key, 0)
        if not misses and len(self.stat_misses) >= MAX_STAT_DIRS:
            self.stat_misses.clear()  # a bound on what this process keeps per directory
        self.stat_misses[key] = misses + 1
        if misses < STAT_LIST_AFTER and ds.name not in self.walking:
            return False
        at = self.dirs_listed.get(key)
        return at is None or time.monotonic() - at > max(DIR_RELIST, bound)

    def dir_due(self, key: tuple[str, str, str]) -> bool:
        """Whether to ask a worker for a directory's cached files: never asked, or asked
        over DIR_RELOCATE seconds ago (files cached since then become visible)."""
        at = self.dirs_located.get(key)
        return at is None or time.monotonic() - at > DIR_RELOCATE

    def forget(self, ds: str, path: str) -> None:
        """``path`` changed: forget it here, and tell this host's other processes."""
        self.meta.pop((ds, path), None)
        self.dir_locs.pop((ds, path), None)
        space = self.meta.spaces.get(ds)
        if space is not None:
            space.hide(path, time.monotonic())
        hit = self.datasets.get(ds)
        if self.host is not None and hit is not None:
            self.host.tombstone(hit[0], path)

    def forget_dataset(self, ds: str) -> None:
        for k in [k for k in self.meta if k[0] == ds]:
            self.meta.pop(k, None)
        for k in [k for k in self.locs if k[0] == ds]:
            self.locs.pop(k, None)
        for r in [r for r in self.runs if r[0] == ds]:
            self.runs.pop(r, None)
        for v in [v for v in self.verified if v[0] == ds]:
            self.verified.pop(v, None)
        for s in [s for s in self.dir_locs if s[0] == ds]:
            self.dir_locs.pop(s, None)
        for d in [d for d in self.dirs_located if d[1] == ds]:
            self.dirs_located.pop(d, None)
        for a in [a for a in self.dir_asks if a[1] == ds]:
            self.dir_asks.pop(a, None)
        self.walking.discard(ds)
        self.meta.spaces.pop(ds, None)
        for table in (self.stat_misses, self.dirs_listed):
            for k in [k for k in table if k[0] == ds]:
                table.pop(k, None)

    def add_fd(self, key: tuple[int, int], fd: int) -> tuple[int, int]:
        """Keep a handed-over descriptor (closing it if one of that file is held)."""
        if key in self.fds:
            os.close(fd)
            return key
        if len(self.fds) >= self.max_fds:
            self.drop_locations()
        self.fds[key] = fd
        return key

    def drop_locations(self) -> None:
        self.locs.clear()
        self.runs.clear()
        self.dir_locs.clear()
        self.verified.clear()
        fds = list(self.fds.values())
        self.fds.clear()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

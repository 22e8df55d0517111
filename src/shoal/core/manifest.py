"""A dataset's manifest: every file's path, size, version and mtime, in one compact
sorted table, so that ls and stat of a million-file dataset are a local lookup instead
of thousands of LIST calls.

Paths are key paths inside the dataset ('<mount>/<relative path>'), sorted, so the
children of a directory are a contiguous run found by bisection. The wire form is
msgpack: ``{"v": 2, "dataset", "built_at", "entries": [[path, size, version, mtime,
mtime_ns(, link)]...]}`` (format 1, without mtime_ns, is still read; ``link`` only for
symbolic links, see :class:`~shoal.core.types.FileInfo`).
"""

from __future__ import annotations

import bisect
import fnmatch
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import msgpack

from shoal.core.types import FileInfo, mtime_ns_of
from shoal.errors import ProtocolError

FORMAT = 2
#: formats this code reads
READS = (1, 2)


@dataclass(frozen=True, slots=True)
class Entry:
    path: str
    size: int
    version: str
    mtime: float
    #: nanoseconds (0: derive from ``mtime``), exact where the store gives them
    mtime_ns: int = 0
    #: a symbolic link's target relative to the mount root ("" for a plain file)
    link: str = ""

    def __post_init__(self) -> None:
        if not self.mtime_ns and self.mtime:
            object.__setattr__(self, "mtime_ns", mtime_ns_of(self.mtime))

    def info(self) -> FileInfo:
        return FileInfo(
            self.path, self.size, self.version, self.mtime, False, self.mtime_ns, self.link
        )

    @classmethod
    def from_row(cls, row: list[Any] | tuple[Any, ...]) -> Entry:
        """From ``[path, size, version, mtime(, mtime_ns(, link))]`` (workers' lists
        and manifest entries)."""
        path, size, version, mtime = row[:4]
        ns = int(row[4]) if len(row) > 4 and row[4] else 0
        link = str(row[5]) if len(row) > 5 and row[5] else ""
        return cls(str(path), int(size), str(version), float(mtime), ns, link)

    def row(self) -> list[Any]:
        out = [self.path, self.size, self.version, float(self.mtime), self.mtime_ns]
        if self.link:
            out.append(self.link)
        return out


#: one entry as the columns hold it: (path, size, version, mtime, mtime_ns, link)
Row = tuple[str, int, str, float, int, str]


class Manifest:
    """The sorted table, held as columns: a path list (bisected), compact arrays of sizes
    and times, versions, and the few links by index. An :class:`Entry` is made only for
    the files asked about: an object per file cost ~150 more bytes for each of a million
    files in every worker and client holding the manifest, and decoding made them all."""

    def __init__(self, dataset: str, entries: Iterable[Entry], built_at: float = 0.0) -> None:
        rows = [(e.path, e.size, e.version, float(e.mtime), e.mtime_ns, e.link) for e in entries]
        self._fill(dataset, rows, built_at)

    def _fill(self, dataset: str, rows: list[Row], built_at: float) -> None:
        self.dataset = dataset
        self.built_at = built_at
        rows.sort(key=itemgetter(0))  # stable; linear on a sorted table (a decoded one)
        self._paths = [r[0] for r in rows]
        self._sizes = array("q", [r[1] for r in rows])
        self._versions = [r[2] for r in rows]
        self._mtimes = array("d", [r[3] for r in rows])
        self._ns = array("q", [r[4] for r in rows])
        self._links = {i: r[5] for i, r in enumerate(rows) if r[5]}

    @classmethod
    def _of_rows(cls, dataset: str, rows: list[Row], built_at: float) -> Manifest:
        man = cls.__new__(cls)
        man._fill(dataset, rows, built_at)
        return man

    def _entry(self, i: int) -> Entry:
        return Entry(*self._row(i))

    def _row(self, i: int) -> Row:
        return (
            self._paths[i],
            self._sizes[i],
            self._versions[i],
            self._mtimes[i],
            self._ns[i],
            self._links.get(i, ""),
        )

    def __len__(self) -> int:
        return len(self._paths)

    @property
    def total_bytes(self) -> int:
        return sum(self._sizes)

    def _find(self, path: str) -> int:
        i = bisect.bisect_left(self._paths, path)
        return i if i < len(self._paths) and self._paths[i] == path else -1

    def get(self, path: str) -> Entry | None:
        i = self._find(path)
        return None if i < 0 else self._entry(i)

    def is_dir(self, path: str) -> bool:
        prefix = path.rstrip("/") + "/" if path else ""
        i = bisect.bisect_left(self._paths, prefix)
        return i < len(self._paths) and self._paths[i].startswith(prefix)

    def _under(self, prefix: str) -> range:
        """The indexes of every file at or below ``prefix`` (a file or a directory)."""
        p = prefix.rstrip("/")
        if p and (i := self._find(p)) >= 0:
            return range(i, i + 1)
        start = p + "/" if p else ""
        lo = bisect.bisect_left(self._paths, start)
        if not start:
            return range(lo, len(self._paths))
        # everything that starts with start: up to the first path >= start with '/' + 1
        hi = bisect.bisect_left(self._paths, p + "0", lo)  # '0' sorts right after '/'
        return range(lo, hi)

    def under(self, prefix: str) -> Iterator[Entry]:
        """Every file at or below ``prefix`` (a file path or a directory path)."""
        for i in self._under(prefix):
            yield self._entry(i)

    def ls(self, path: str) -> list[FileInfo]:
        """Direct children of a directory: files and subdirectories, sorted."""
        base = path.rstrip("/")
        start = base + "/" if base else ""
        out: list[FileInfo] = []
        i = bisect.bisect_left(self._paths, start)
        n = len(self._paths)
        while i < n and self._paths[i].startswith(start):
            rest = self._paths[i][len(start) :]
            slash = rest.find("/")
            if slash < 0:
                out.append(self._entry(i).info())
                i += 1
                continue
            sub = start + rest[:slash]
            out.append(FileInfo(sub, 0, "", 0.0, True))
            # skip the whole subtree: everything that starts with sub + "/"
            i = bisect.bisect_left(self._paths, sub + "0", i)  # '0' sorts right after '/'
        return out

    def select(self, prefixes: list[str], glob: str | None = None) -> list[Entry]:
        """Files under any of ``prefixes`` ("" = all) whose path matches ``glob``."""
        seen: set[str] = set()
        out: list[Entry] = []
        for p in prefixes or [""]:
            for i in self._under(p):
                path = self._paths[i]
                if path in seen:
                    continue
                if glob and not fnmatch.fnmatchcase(path, glob):
                    continue
                seen.add(path)
                out.append(self._entry(i))
        return out

    def merge(self, prefixes: list[str], fresh: Iterable[Entry], built_at: float) -> Manifest:
        """A new manifest where everything under ``prefixes`` is replaced by ``fresh``."""
        rows = [(e.path, e.size, e.version, float(e.mtime), e.mtime_ns, e.link) for e in fresh]
        return self.merge_rows(prefixes, rows, built_at)

    def merge_rows(self, prefixes: list[str], fresh: list[Any], built_at: float) -> Manifest:
        """:meth:`merge` of wire entries (a listing's ``[path, size, version, mtime(,
        mtime_ns(, link))]``), with no object made per entry on the way."""
        drop: set[int] = set()
        for p in prefixes:
            drop.update(self._under(p))
        if drop:
            rows = [self._row(i) for i in range(len(self)) if i not in drop]
        else:
            rows = [self._row(i) for i in range(len(self))]
        rows += [_row_of(r) for r in fresh]
        return Manifest._of_rows(self.dataset, rows, built_at)

    def diff(self, other: Manifest, prefixes: list[str]) -> tuple[list[Entry], list[str]]:
        """Against a newer ``other``: entries changed or added there, paths gone there."""
        changed = [
            other._entry(i)
            for p in prefixes or [""]
            for i in other._under(p)
            if (j := self._find(other._paths[i])) < 0 or self._versions[j] != other._versions[i]
        ]
        gone = [
            self._paths[i]
            for p in prefixes or [""]
            for i in self._under(p)
            if other._find(self._paths[i]) < 0
        ]
        return changed, gone

    # -- wire -----------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        links = self._links
        entries = [
            [p, s, v, m, n, links[i]] if i in links else [p, s, v, m, n]
            for i, (p, s, v, m, n) in enumerate(
                zip(self._paths, self._sizes, self._versions, self._mtimes, self._ns, strict=True)
            )
        ]
        body = {"v": FORMAT, "dataset": self.dataset, "built_at": self.built_at, "entries": entries}
        out: bytes = msgpack.packb(body, use_bin_type=True)
        return out

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        try:
            body: Any = msgpack.unpackb(raw, raw=False)
            if body.get("v") not in READS:
                raise ProtocolError(f"manifest format {body.get('v')} is not one of {READS}")
            rows = [_row_of(row) for row in body["entries"]]
            return cls._of_rows(str(body["dataset"]), rows, float(body.get("built_at", 0.0)))
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise ProtocolError(f"unreadable manifest: {exc}") from None


def _row_of(row: list[Any]) -> Row:
    """A wire entry as :meth:`Entry.from_row` reads it, without the object."""
    path, size, version, mtime = row[:4]
    mtime = float(mtime)
    ns = int(row[4]) if len(row) > 4 and row[4] else 0
    if not ns and mtime:
        ns = mtime_ns_of(mtime)
    link = str(row[5]) if len(row) > 5 and row[5] else ""
    return (str(path), int(size), str(version), mtime, ns, link)


def _under_any(path: str, prefixes: list[str]) -> bool:
    for p in prefixes:
        p = p.rstrip("/")
        if not p or path == p or path.startswith(p + "/"):
            return True
    return False

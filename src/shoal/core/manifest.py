"""A dataset's manifest: every file's path, size, version and mtime, in one compact
sorted table, so that ls and stat of a million-file dataset are a local lookup instead
of thousands of LIST calls.

Paths are key paths inside the dataset ('<mount>/<relative path>'), sorted, so the
children of a directory are a contiguous run found by bisection. The wire form is
msgpack, by columns (format 3): ``{"v": 3, "dataset", "built_at", "paths": [...],
"versions": [...], "sizes", "mtimes", "ns": little-endian arrays of int64, float64 and
int64 as bytes, "links": [[index, link]...]}``, so that decoding a million files is a
list of paths and three ``frombytes``, not a million rows (``link`` only for symbolic
links, see :class:`~shoal.core.types.FileInfo`). Formats 1 and 2, rows ``{"entries":
[[path, size, version, mtime(, mtime_ns(, link))]...]}``, are still read (manifests
that masters stored before).
"""

from __future__ import annotations

import bisect
import fnmatch
import operator
import sys
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import msgpack

from shoal.core.types import FileInfo, Mtime, mtime_ns_of
from shoal.errors import ProtocolError

FORMAT = 3
#: formats this code reads
READS = (1, 2, 3)


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


#: entries a named-files sync changes at most by splicing columns (more: one pass)
SPLICE_MAX = 256


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

    def ls(self, path: str, prefix: str = "") -> list[FileInfo]:
        """Direct children of a directory: files and subdirectories, sorted; each path
        with ``prefix`` in front (a caller's namespace: "/<dataset>/"). One record per
        child, made straight from the columns (a listing of a million files makes a
        million of them, nothing else)."""
        base = path.rstrip("/")
        start = base + "/" if base else ""
        out: list[FileInfo] = []
        paths, sizes, versions, mtimes, nss, links = (
            self._paths,
            self._sizes,
            self._versions,
            self._mtimes,
            self._ns,
            self._links,
        )
        cut = len(start)
        i = bisect.bisect_left(paths, start)
        n = len(paths)
        while i < n and paths[i].startswith(start):
            # the run of files right in this directory, up to the first subdirectory
            j = i
            while j < n and (p := paths[j]).startswith(start) and "/" not in p[cut:]:
                j += 1
            for k in range(i, j):
                ns = nss[k]
                out.append(
                    FileInfo(
                        prefix + paths[k],
                        sizes[k],
                        versions[k],
                        Mtime(ns) if ns else mtimes[k],
                        False,
                        ns,
                        links.get(k, "") if links else "",
                    )
                )
            if j >= n or not paths[j].startswith(start):
                break
            rest = paths[j][cut:]
            sub = start + rest[: rest.find("/")]
            out.append(FileInfo(prefix + sub, 0, "", 0.0, True))
            # skip the whole subtree: everything that starts with sub + "/"
            i = bisect.bisect_left(paths, sub + "0", j)  # '0' sorts right after '/'
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

    def replace_rows(self, paths: Iterable[str], fresh: list[Any], built_at: float) -> Manifest:
        """A new manifest where exactly the files ``paths`` are replaced by ``fresh`` (wire
        entries, as :meth:`merge_rows`): each of ``paths`` that ``fresh`` lacks is gone.
        A sync of named files (each write through a gateway) changes a few entries of a
        table of maybe millions, so the columns are copied and spliced in C, not made
        into a row or an object per entry: as objects, a one-file sync of a 1M-entry
        manifest held the master's loop ~6 s."""
        rows = sorted((_row_of(r) for r in fresh), key=itemgetter(0))
        gone = {*paths, *(r[0] for r in rows)}
        drop = sorted({i for p in gone if (i := self._find(p)) >= 0}, reverse=True)
        if len(drop) + len(rows) > SPLICE_MAX:  # many: one pass over the rows is cheaper
            cut = set(drop)
            kept = [self._row(i) for i in range(len(self)) if i not in cut]
            return Manifest._of_rows(self.dataset, kept + rows, built_at)
        out = Manifest.__new__(Manifest)
        out.dataset, out.built_at = self.dataset, built_at
        names, versions = list(self._paths), list(self._versions)
        sizes, mtimes, ns = array("q", self._sizes), array("d", self._mtimes), array("q", self._ns)
        links = dict(self._links)
        for i in drop:  # from the end: the indices still to drop stay where they are
            del names[i], versions[i], sizes[i], mtimes[i], ns[i]
            links = {k - (k > i): v for k, v in links.items() if k != i}
        for path, size, version, mtime, nsec, link in rows:
            j = bisect.bisect_left(names, path)
            names.insert(j, path)
            versions.insert(j, version)
            sizes.insert(j, size)
            mtimes.insert(j, mtime)
            ns.insert(j, nsec)
            links = {k + (k >= j): v for k, v in links.items()}
            if link:
                links[j] = link
        out._paths, out._versions, out._links = names, versions, links
        out._sizes, out._mtimes, out._ns = sizes, mtimes, ns
        return out

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
        body = {
            "v": FORMAT,
            "dataset": self.dataset,
            "built_at": self.built_at,
            "paths": self._paths,
            "versions": self._versions,
            "sizes": _le(self._sizes),
            "mtimes": _le(self._mtimes),
            "ns": _le(self._ns),
            "links": [[i, link] for i, link in sorted(self._links.items())],
        }
        out: bytes = msgpack.packb(body, use_bin_type=True)
        return out

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        try:
            body: Any = msgpack.unpackb(raw, raw=False)
            v = body.get("v")
            if v not in READS:
                raise ProtocolError(f"manifest format {v} is not one of {READS}")
            dataset, built_at = str(body["dataset"]), float(body.get("built_at", 0.0))
            if v >= 3:
                return cls._of_columns(dataset, body, built_at)
            rows = [_row_of(row) for row in body["entries"]]
            return cls._of_rows(dataset, rows, built_at)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise ProtocolError(f"unreadable manifest: {exc}") from None

    @classmethod
    def _of_columns(cls, dataset: str, body: dict[str, Any], built_at: float) -> Manifest:
        """Format 3, checked (types, lengths, order) without a loop in Python per file
        beyond the checks themselves, which run in C (map, all)."""
        paths, versions = body["paths"], body["versions"]
        n = len(paths)
        if type(paths) is not list or type(versions) is not list or len(versions) != n:
            raise ValueError("paths and versions are not lists of one length")
        if not all(map(str.__instancecheck__, paths)) or not all(
            map(str.__instancecheck__, versions)
        ):
            raise ValueError("a path or version is not a string")
        # sorted and unique: ls and stat bisect it
        if not all(map(operator.lt, paths, paths[1:])):
            raise ValueError("paths are not sorted")
        man = cls.__new__(cls)
        man.dataset, man.built_at = dataset, built_at
        man._paths, man._versions = paths, versions
        man._sizes = _of_le("q", body["sizes"], n)
        man._mtimes = _of_le("d", body["mtimes"], n)
        man._ns = _of_le("q", body["ns"], n)
        man._links = {}
        for i, link in body.get("links", ()):
            if type(i) is not int or not 0 <= i < n or type(link) is not str or not link:
                raise ValueError("a link is not [index, target]")
            man._links[i] = link
        return man


def _le(a: array[Any]) -> bytes:
    """An array's bytes, little-endian."""
    if sys.byteorder == "little":
        return a.tobytes()
    b = array(a.typecode, a)
    b.byteswap()
    return b.tobytes()


def _of_le(typecode: str, raw: Any, n: int) -> array[Any]:
    """An array of ``n`` items from little-endian bytes (ValueError if not that)."""
    out = array(typecode)
    if type(raw) is not bytes or len(raw) != n * out.itemsize:
        raise ValueError(f"a column is not {n} items")
    out.frombytes(raw)
    if sys.byteorder != "little":
        out.byteswap()
    return out


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

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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
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


class Manifest:
    def __init__(self, dataset: str, entries: Iterable[Entry], built_at: float = 0.0) -> None:
        self.dataset = dataset
        self.built_at = built_at
        items = sorted(entries, key=lambda e: e.path)
        self._paths = [e.path for e in items]
        self._entries = items

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self._entries)

    def get(self, path: str) -> Entry | None:
        i = bisect.bisect_left(self._paths, path)
        if i < len(self._paths) and self._paths[i] == path:
            return self._entries[i]
        return None

    def is_dir(self, path: str) -> bool:
        prefix = path.rstrip("/") + "/" if path else ""
        i = bisect.bisect_left(self._paths, prefix)
        return i < len(self._paths) and self._paths[i].startswith(prefix)

    def under(self, prefix: str) -> Iterator[Entry]:
        """Every file at or below ``prefix`` (a file path or a directory path)."""
        p = prefix.rstrip("/")
        exact = self.get(p) if p else None
        if exact is not None:
            yield exact
            return
        start = p + "/" if p else ""
        i = bisect.bisect_left(self._paths, start)
        while i < len(self._paths) and self._paths[i].startswith(start):
            yield self._entries[i]
            i += 1

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
                out.append(self._entries[i].info())
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
            for e in self.under(p):
                if e.path in seen:
                    continue
                if glob and not fnmatch.fnmatchcase(e.path, glob):
                    continue
                seen.add(e.path)
                out.append(e)
        return out

    def merge(self, prefixes: list[str], fresh: Iterable[Entry], built_at: float) -> Manifest:
        """A new manifest where everything under ``prefixes`` is replaced by ``fresh``."""
        keep = [e for e in self._entries if not _under_any(e.path, prefixes)]
        return Manifest(self.dataset, [*keep, *fresh], built_at)

    def diff(self, other: Manifest, prefixes: list[str]) -> tuple[list[Entry], list[str]]:
        """Against a newer ``other``: entries changed or added there, paths gone there."""
        changed = [
            e
            for p in prefixes or [""]
            for e in other.under(p)
            if (old := self.get(e.path)) is None or old.version != e.version
        ]
        gone = [
            e.path for p in prefixes or [""] for e in self.under(p) if other.get(e.path) is None
        ]
        return changed, gone

    # -- wire -----------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        body = {
            "v": FORMAT,
            "dataset": self.dataset,
            "built_at": self.built_at,
            "entries": [e.row() for e in self._entries],
        }
        out: bytes = msgpack.packb(body, use_bin_type=True)
        return out

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        try:
            body: Any = msgpack.unpackb(raw, raw=False)
            if body.get("v") not in READS:
                raise ProtocolError(f"manifest format {body.get('v')} is not one of {READS}")
            entries = [Entry.from_row(row) for row in body["entries"]]
            return cls(str(body["dataset"]), entries, float(body.get("built_at", 0.0)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ProtocolError(f"unreadable manifest: {exc}") from None


def _under_any(path: str, prefixes: list[str]) -> bool:
    for p in prefixes:
        p = p.rstrip("/")
        if not p or path == p or path.startswith(p + "/"):
            return True
    return False

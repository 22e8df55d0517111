"""The inode table's entries, the mount's counters and the reply types of handlers.
(The errno a failed request answers with comes from :func:`shoal.errors.errno_of`.)"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from shoal.core.types import FileInfo


class Fail(int):
    """An errno a handler answers with, returned instead of raised: for requests whose
    answer is always the same error (an IOCTL per buffered ``open()``: isatty), where
    raising and mapping an exception costs more than the rest of the request. Returned
    by synchronous handlers only (a coroutine's failures raise)."""


Reply = bytes | memoryview | list[bytes | memoryview] | None
Result = Reply | Fail | Coroutine[Any, Any, Reply]
Handler = Callable[[int, memoryview], Result]

#: seconds the kernel may trust entries and attributes of a "never revalidate" dataset
FOREVER = 365 * 86400.0
#: entries at the top level (datasets come and go through the master)
TOP_TTL = 5.0
BLKSIZE = 1 << 20
#: seconds an open waits for the local worker to hold a large file whole (passthrough)
PASSTHROUGH_WAIT = 3.0
#: seconds a descriptor handed over by a directory's answer waits for its file's first
#: open (then it is closed), and a directory is not asked again within
HANDED_FOR = 30.0
#: handed-over descriptors held at once (the oldest are closed first)
MAX_HANDED = 512
#: directories whose last ask is remembered
MAX_DIRS_ASKED = 4096
#: passthrough registrations held; beyond this the idle ones (kept after their last
#: release for the next open) are dropped, least recently used first, as each holds
#: its data file open
MAX_BACKING = 4096
#: bytes of data files the idle registrations may hold (space the worker cannot free
#: while they are held, once it evicted them)
MAX_IDLE_BYTES = 32 << 30
#: negative entries remembered (to invalidate after a sync); beyond, they get TOP_TTL
MAX_NEGATIVE = 65536


@dataclass(slots=True, eq=False)
class Node:
    ino: int
    path: str  # namespace path: "/", "/ds", "/ds/mount", "/ds/mount/rel"
    ds: str  # dataset name ("" for the root)
    key: str  # "<mount>/<rel>" inside the dataset ("" above mounts)
    is_dir: bool
    size: int = 0
    mtime_ns: int = 0  # the source's modification time (0: unknown)
    version: str = ""
    #: a symbolic link's target relative to the mount root ("" for no link)
    link: str = ""
    at: float = 0.0  # monotonic time the attributes were fetched
    nlookup: int = 0
    opens: int = 0
    passthrough_opens: int = 0
    backing: int = 0  # passthrough backing id, 0 = none
    backing_version: str = ""  # the version whose data file ``backing`` is
    kept_version: str = ""  # version whose pages the kernel may keep cached
    chunk_at: int = 0  # start offset of the last window read of a large file
    chunk: bytes = b""
    attr: tuple[int, ...] = ()


@dataclass
class Stats:
    reads: int = 0
    read_bytes: int = 0
    passthrough_opens: int = 0
    cached_opens: int = 0
    backing_files: int = 0
    client_calls: int = 0
    errors: dict[int, int] = field(default_factory=dict)


#: a version without an ETag: "<size>-<mtime_ns>" (file://, webhdfs, fsspec stores)
_SIZE_MTIME = re.compile(r"(\d+)-(\d+)")


def version_mtime_ns(size: int, version: str) -> int:
    """The mtime a "<size>-<mtime_ns>" version carries (0 for any other version)."""
    m = _SIZE_MTIME.fullmatch(version)
    return int(m.group(2)) if m is not None and int(m.group(1)) == size else 0


def kind(x: Node | FileInfo) -> int:
    """0 file, 1 directory, 2 link: what the kernel must never see change on an inode."""
    return 2 if x.link else int(x.is_dir)


def readlink(n: Node) -> bytes:
    """A link node's target as the kernel follows it: relative to the link's own
    directory, so it resolves inside the mount whatever the mount point."""
    rel = n.key.partition("/")[2]  # the path inside the mount
    target = posixpath.relpath(n.link, posixpath.dirname(rel) or ".")
    return target.encode("utf-8", "surrogateescape")

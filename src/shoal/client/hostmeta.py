"""The host's metadata cache: directory listings that this user's client processes got
from workers, kept where every later process on the host finds them, so that a fresh
process (a DataLoader worker, a script started after an ``ls``) answers its first
stats without a round trip per directory.

Layout: a private directory (0700, this user's; tmpfs where there is one), and in it
one folder per dataset *incarnation* -- a hash of the master's address, this boot,
the client's token (processes with different tokens share nothing) and the dataset's
whole definition (its mounts, its policy and its generation: a
sync or a policy change starts a new folder and the old one is never read again).
Nothing in the name needs a round trip: a fresh process that knows the dataset's
definition finds the folder before it has fetched the ring.
Each writing process appends to a log of its own in that folder, so no file has two
writers. A record is a fixed header (kind, directory, when it was listed, a checksum)
and a columnar body: the directory's file names joined, sizes and modification times
as packed arrays, versions joined. A reader scans the headers only and decodes a
directory's body, checksum first, when a stat first looks there: a process that stats
ten files of a million-file dataset decodes ten directories, and builds no record per
listed file. A torn or bad record ends what is read of that log.

Consistency is the per-directory listing's: an entry is trusted from the moment its
writer got the listing, for the dataset's staleness bound, as that process would
trust it; never under a bound of 0; a file this host's clients saw change (a write, a
stale version) is hidden by a tombstone record from then on. Records older than
HOST_TTL are not read whatever the bound, which bounds how long a dataset deleted and
made again under the same name and definition (or a cluster started afresh at the
same address) could be answered from its predecessor's listings. Any error here (no tmpfs, a full disk, a bad record) is a
miss, logged at debug: the worker is asked as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import struct
import threading
import time
from array import array
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any

import msgpack
import xxhash

from shoal.core.types import NEVER, Dataset, FileInfo

log = logging.getLogger("shoal.client")

#: seconds a record is read at most after it was written, whatever the staleness bound
HOST_TTL = 300.0
#: bytes one process appends to its log at most; bytes a reader reads of a dataset
MAX_LOG = 16 << 20
MAX_READ = 64 << 20
#: seconds between looks for logs and records other processes added (slow path only)
RECHECK = 0.5
#: seconds between one process's sweeps of old logs (each new folder it writes would
#: otherwise scan every folder: a writer makes a new one per sync of its dataset)
SWEEP_EVERY = 30.0
#: the environment variable that names the directory ("off": no host cache)
ENV = "SHOAL_META_DIR"

_FORMAT = b"shoal-hostmeta-1"
_MAGIC = 0x4D48534C  # "LSHM"
#: magic, kind, directory length, body length, listed at (monotonic), xxh3 of dir+body
_HDR = struct.Struct("<IBxHIdQ")
_LISTING, _TOMB = 0, 1
#: folder -> (this process's log in it, bytes written): one log per process, however
#: many clients it makes; _PID: the process they belong to (a forked child starts anew)
_LOGS: dict[str, tuple[str, int]] = {}
_LOCK = threading.Lock()
_PID = [os.getpid()]
#: when this process last swept old logs (monotonic)
_SWEPT = [float("-inf")]


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _root() -> str | None:
    """This user's private directory for the cache (made if missing), or None."""
    env = os.environ.get(ENV, "")
    if env == "off":
        return None
    if env:
        base = env
    else:
        run = os.environ.get("XDG_RUNTIME_DIR", "")
        top = run if run and os.path.isdir(run) else "/dev/shm"
        if not os.path.isdir(top):
            top = os.environ.get("TMPDIR") or "/tmp"
        base = os.path.join(top, f"shoal-meta-{os.getuid()}")
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
        st = os.lstat(base)
    except OSError as exc:
        log.debug("no host metadata cache at %s: %s", base, exc)
        return None
    # another user's folder, or a link, in a shared /tmp: never read or write it
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        log.debug("no host metadata cache: %s is not this user's private folder", base)
        return None
    return base


class _Dir:
    """One directory's listing, decoded: name -> row of the columns."""

    __slots__ = ("at", "mtime_ns", "mtimes", "rows", "sizes", "versions")

    def __init__(self, at: float, body: Any) -> None:
        names, sizes, versions, mtimes, mtime_ns = body
        n = names.count("\n") + 1 if names else 0
        self.rows = dict(zip(names.split("\n"), range(n), strict=True)) if n else {}
        self.versions = versions.split("\n") if n else []
        self.sizes, self.mtimes, self.mtime_ns = array("q"), array("d"), array("q")
        self.sizes.frombytes(sizes)
        self.mtimes.frombytes(mtimes)
        self.mtime_ns.frombytes(mtime_ns)
        counts = {len(self.rows), len(self.versions), len(self.sizes), len(self.mtimes)}
        if counts != {n} or len(self.mtime_ns) != n:
            raise ValueError("columns of different lengths")
        self.at = at


#: a directory's newest listing not decoded yet: (listed at, the log's bytes, where
#: its directory and body start, its body's end, checksum)
_Raw = tuple[float, bytes, int, int, int]


class Space:
    """What this host's logs say of one dataset incarnation: looked up on any thread
    (single dict operations), loaded and refreshed on the loop thread."""

    def __init__(self, folder: str, bound: float, clock: Callable[[], float]) -> None:
        self.folder = folder
        self.bound = bound
        self.clock = clock
        #: directory -> its newest listing (raw until first looked at; None: bad)
        self.dirs: dict[str, _Dir | _Raw | None] = {}
        #: path -> when it was hidden (listings from before do not answer for it)
        self.hidden: dict[str, float] = {}
        #: log name -> bytes of it read so far
        self.read: dict[str, int] = {}
        self.total = 0
        self.checked = -RECHECK

    def lookup(self, path: str) -> tuple[FileInfo, float] | None:
        d, _, name = path.rpartition("/")
        got = self.dirs.get(d)
        if got is None:
            return None
        if type(got) is tuple:
            got = self._decode(d, got)
            if got is None:
                return None
        assert isinstance(got, _Dir)
        i = got.rows.get(name)
        if i is None:
            return None
        if self.hidden:
            gone = self.hidden.get(path)
            if gone is not None and gone >= got.at:
                return None
        info = FileInfo(path, got.sizes[i], got.versions[i], got.mtimes[i], False, got.mtime_ns[i])
        return info, got.at

    def _decode(self, d: str, raw: _Raw) -> _Dir | None:
        at, data, start, end, ck = raw
        try:
            if xxhash.xxh3_64_intdigest(memoryview(data)[start:end]) != ck:
                raise ValueError("checksum mismatch")
            skip = start + len(d.encode())
            body = msgpack.unpackb(memoryview(data)[skip:end], raw=False)
            out: _Dir | None = _Dir(at, body)
        except Exception as exc:  # a bad record is a miss, never an answer
            log.debug("host metadata of %s unreadable: %s", d, exc)
            out = None
        if self.dirs.get(d) is raw:  # else a refresh found a newer listing meanwhile
            self.dirs[d] = out
        return out

    def hide(self, path: str, at: float) -> None:
        if at > self.hidden.get(path, -1.0):
            self.hidden[path] = at

    def due(self) -> bool:
        return self.clock() - self.checked >= RECHECK

    def refresh(self) -> None:
        """Read what the logs gained since the last look (new logs too)."""
        self.checked = now = self.clock()
        limit = HOST_TTL if self.bound == NEVER else min(self.bound, HOST_TTL)
        try:
            logs = sorted(os.scandir(self.folder), key=lambda e: -e.stat().st_mtime)
        except OSError:
            return
        for entry in logs:
            if self.total >= MAX_READ:
                break
            try:
                if time.time() - entry.stat().st_mtime > HOST_TTL:
                    continue
                with open(entry.path, "rb") as f:
                    f.seek(self.read.get(entry.name, 0))
                    data = f.read(MAX_READ - self.total)
            except OSError:
                continue
            used = self._scan(data, now, limit)
            self.read[entry.name] = self.read.get(entry.name, 0) + used
            self.total += used

    def _scan(self, data: bytes, now: float, limit: float) -> int:
        """Index the records in ``data`` (headers only); the bytes of whole records."""
        pos, n, hdr = 0, len(data), _HDR.size
        while pos + hdr <= n:
            magic, kind, dlen, blen, at, ck = _HDR.unpack_from(data, pos)
            start, end = pos + hdr, pos + hdr + dlen + blen
            if magic != _MAGIC or end > n:
                break  # torn (being written) or not ours: the rest waits
            pos = end
            if not 0 <= now - at <= limit:
                continue
            try:
                d = data[start : start + dlen].decode()
            except UnicodeDecodeError:
                continue
            if kind == _LISTING:
                cur = self.dirs.get(d)
                cur_at = cur[0] if type(cur) is tuple else getattr(cur, "at", -1.0)
                if cur is None or at > cur_at:
                    self.dirs[d] = (at, data, start, end, ck)
            elif kind == _TOMB and xxhash.xxh3_64_intdigest(memoryview(data)[start:end]) == ck:
                name = data[start + dlen : end].decode(errors="replace")
                self.hide(f"{d}/{name}" if d else name, at)
        return pos


class HostMeta:
    """This process's door to the host's cache, for datasets of the cluster at
    ``master``."""

    def __init__(
        self,
        master: str,
        clock: Callable[[], float] = time.monotonic,
        token: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.master = master
        self.clock = clock
        #: the client's token: processes share listings only when they present the
        #: same one (a token scoped to dataset A never sees what B's reader listed)
        self._token = token
        self._root: str | None = None
        self._looked = False
        self._boot = ""
        self._folder: tuple[Dataset, str] | None = None

    @property
    def root(self) -> str | None:
        """The cache's directory, found at first use (a client that never lists or
        misses a stat touches no file)."""
        if not self._looked:
            self._root, self._boot, self._looked = _root(), _boot_id(), True
            try:
                who = self._token() or ""
            except Exception:  # no readable token: its own folders, shared with nobody
                who = os.urandom(16).hex()
            self._boot += "\0" + hashlib.blake2b(who.encode(), digest_size=16).hexdigest()
        return self._root

    def folder(self, ds: Dataset) -> str | None:
        """The folder of ``ds``'s incarnation (the last one named is kept: a listing
        of each directory would hash the whole definition otherwise)."""
        if self.root is None:
            return None
        last = self._folder
        if last is not None and (last[0] is ds or last[0] == ds):
            return last[1]
        h = hashlib.blake2b(_FORMAT, digest_size=16)
        for part in (self.master, self._boot):
            h.update(part.encode() + b"\0")
        h.update(json.dumps(ds.to_dict(), sort_keys=True).encode())
        out = os.path.join(self.root, h.hexdigest())
        self._folder = (ds, out)
        return out

    def space(self, ds: Dataset) -> Space | None:
        """A fresh view of the dataset's listings on this host (None: none to use)."""
        bound = ds.policy.staleness
        folder = self.folder(ds) if bound != 0 else None
        if folder is None or not os.path.isdir(folder):
            return None
        sp = Space(folder, bound, self.clock)
        sp.refresh()
        return sp

    def put(self, ds: Dataset, directory: str, entries: Iterable[FileInfo]) -> None:
        """Add a listing of ``directory`` just got from a worker (its files only)."""
        if ds.policy.staleness == 0 or self.root is None:
            return
        prefix = f"{directory}/" if directory else ""
        plen = len(prefix)
        # few allocations (a list per column; joins and a replace in C): the process
        # that got the listing pays little next to what decoding it cost
        files = [e for e in entries if not (e.is_dir or e.link)]
        paths = [e.path for e in files]
        n = len(paths)
        if not n or not all(map(str.startswith, paths, repeat(prefix, n))):
            return  # nothing a stat could use, or not a listing of this directory
        joined = "\n".join(paths)
        names = joined[plen:].replace("\n" + prefix, "\n") if plen else joined
        versions = "\n".join([e.version for e in files])
        if names.count("\n") != n - 1 or versions.count("\n") != n - 1:
            return  # a name or version with a newline: those directories are asked for
        try:
            sizes = array("q", [e.size for e in files]).tobytes()
            mtimes = array("d", [e.mtime for e in files]).tobytes()
            mtime_ns = array("q", [e.mtime_ns for e in files]).tobytes()
        except (OverflowError, TypeError):
            return
        body = msgpack.packb([names, sizes, versions, mtimes, mtime_ns])
        self._append(ds, _LISTING, directory, body)

    def tombstone(self, ds: Dataset, path: str) -> None:
        """``path`` changed (a write, a stale version): no listing from before answers."""
        if ds.policy.staleness == 0 or self.root is None:
            return
        d, _, name = path.rpartition("/")
        self._append(ds, _TOMB, d, name.encode())

    def _append(self, ds: Dataset, kind: int, directory: str, body: bytes) -> None:
        folder = self.folder(ds)
        if folder is None:
            return
        dbytes = directory.encode()
        if len(dbytes) > 0xFFFF:
            return
        tail = dbytes + body
        rec = _HDR.pack(
            _MAGIC, kind, len(dbytes), len(body), self.clock(), xxhash.xxh3_64_intdigest(tail)
        )
        with _LOCK:
            if os.getpid() != _PID[0]:  # a forked child writes logs of its own
                _LOGS.clear()
                _PID[0] = os.getpid()
            name, size = _LOGS.get(folder) or ("", 0)
            if size + len(rec) + len(tail) > MAX_LOG:
                return
            flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
            try:
                if not name:
                    now = time.monotonic()
                    if now - _SWEPT[0] >= SWEEP_EVERY:
                        _SWEPT[0] = now
                        _sweep(os.path.dirname(folder))
                    os.makedirs(folder, mode=0o700, exist_ok=True)
                    name = f"{os.getpid()}-{os.urandom(4).hex()}.log"
                    flags |= os.O_CREAT | os.O_EXCL
                # opened for each record: nothing stays open (no descriptor to leak
                # from a client never closed, or to share with a forked child)
                fd = os.open(os.path.join(folder, name), flags, 0o600)
                try:
                    os.write(fd, rec + tail)  # one write: a reader sees it whole or torn
                finally:
                    os.close(fd)
            except OSError as exc:
                log.debug("host metadata not written to %s: %s", folder, exc)
                return
            _LOGS[folder] = (name, size + len(rec) + len(tail))


def _sweep(root: str) -> None:
    """Delete logs no reader will read again (older than HOST_TTL) and empty folders."""
    cutoff = time.time() - HOST_TTL
    try:
        folders = list(os.scandir(root))
    except OSError:
        return
    for f in folders:
        try:
            kept = 0
            for e in list(os.scandir(f.path)):
                if e.stat().st_mtime < cutoff:
                    os.unlink(e.path)
                else:
                    kept += 1
            if not kept and f.stat().st_mtime < cutoff:
                os.rmdir(f.path)
        except OSError:
            continue

"""The file system behind the mount: an inode table over the client's namespace
/<dataset>/<mount>/<path> and one handler per FUSE operation.

A handler takes (nodeid, body) and returns the reply body, ``None`` for no reply, or a
coroutine when it needs the client. Whatever the client already holds (metadata within
the staleness bound, page locations on a local worker) is answered synchronously, with
no task and no round trip: warm lookups, getattr, opens and reads of cached pages.
Large files complete on the local worker are opened in kernel passthrough, so their
reads never reach this process.

Opens: by default each is an OPEN and a RELEASE (FOPEN_KEEP_CACHE while the version is
unchanged), and Python's ``open()`` adds an IOCTL (isatty(); the kernel hands every
ioctl on and never remembers ENOTTY): three round trips per file, the daemon's CPU
almost all in the syscalls and wake-ups. ``kernel_open`` answers the first OPEN ENOSYS
and the kernel opens every file itself from then on, with keep_cache: one round trip,
no passthrough. Its revalidation is the kernel's LOOKUP and GETATTR at the staleness
bound; a new version seen then is invalidated before the reply with its attributes
goes out (AUTO_INVAL_DATA sees only size and mtime): :meth:`FileSystem.invalidate_soon`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

from shoal.client.aio import AsyncClient, read_located
from shoal.client.wholefile import KeptFds
from shoal.core.types import NEVER, Dataset, FileInfo
from shoal.errors import NotFound, UserError
from shoal.fuse import protocol as p
from shoal.fuse.ahead import Ahead
from shoal.fuse.dirs import DirectoryOps
from shoal.fuse.nodes import (
    BLKSIZE,
    FOREVER,
    HANDED_FOR,
    MAX_HANDED,
    MAX_NEGATIVE,
    TOP_TTL,
    Handler,
    Node,
    Reply,
    Result,
    Stats,
    kind,
    readlink,
    version_mtime_ns,
)
from shoal.fuse.passthrough import PassthroughOps

log = logging.getLogger("shoal.fuse.ops")

#: client.stat calls in flight while revalidating a changed dataset
STAT_PARALLELISM = 32
#: large files whose read window is kept in kernel-open mode (no RELEASE drops it)
MAX_CHUNKS = 16
#: the answers of a cached open: the kernel keeps its pages (same version) or drops them
OPEN_KEEP = p.encode_open(0, p.FOPEN_NOFLUSH | p.FOPEN_KEEP_CACHE)
OPEN_DROP = p.encode_open(0, p.FOPEN_NOFLUSH)


class FileSystem(DirectoryOps, PassthroughOps):
    """Handlers for one mount. ``backing_open``/``backing_close`` are the passthrough
    ioctls (None when the kernel did not grant passthrough)."""

    def __init__(
        self, client: AsyncClient, datasets: list[str] | None = None, kernel_open: bool = False
    ) -> None:
        self.client = client
        #: answer OPEN with ENOSYS: no daemon round trip per open, no passthrough
        self.kernel_open = kernel_open
        self.cache = client.cache
        self.only = set(datasets) if datasets else None
        self.uid, self.gid = os.getuid(), os.getgid()
        self.started = time.time()
        self.started_ns = time.time_ns()
        self.nodes: dict[int, Node] = {}
        self.by_path: dict[str, Node] = {}
        self._next_ino = 2
        self._dirs: dict[int, list[FileInfo] | None] = {}
        self._next_fh = 1
        self.backing_open: Callable[[int], int] | None = None
        self.backing_close: Callable[[int], None] | None = None
        self._idle: OrderedDict[int, tuple[Node, int]] = OrderedDict()
        self._idle_bytes = 0
        self._handed: KeptFds[str] = KeptFds(HANDED_FOR, MAX_HANDED)
        self._dirs_asked: OrderedDict[str, float] = OrderedDict()
        self._dirs_asking: dict[str, asyncio.Future[None]] = {}
        #: writes FUSE notifications to the kernel (set by the daemon)
        self.notify: Callable[[list[bytes]], Coroutine[Any, Any, None]] | None = None
        #: negative entries handed out inside datasets: (parent ino, name) -> dataset
        self.negative: OrderedDict[tuple[int, str], str] = OrderedDict()
        self._notifying: set[asyncio.Task[None]] = set()
        #: inode invalidations of a new version in flight (kernel-open replies wait)
        self.invalidating: set[asyncio.Task[None]] = set()
        #: nodes holding a read window, least recent first (kernel-open mode)
        self._chunks: OrderedDict[int, Node] = OrderedDict()
        self.stats = Stats()
        self.ahead = Ahead(client, self.stats, self.listed_entry, self._generation)
        root = Node(p.ROOT_ID, "/", "", "", True, mtime_ns=self.started_ns, nlookup=1 << 62)
        root.attr = self._attr(root)
        self.nodes[root.ino] = root
        self.by_path["/"] = root

    # -- inode table ----------------------------------------------------------------

    def _attr(self, n: Node) -> tuple[int, ...]:
        nlink = 2 if n.is_dir else 1
        mtime_ns = n.mtime_ns or self.started_ns  # synthetic directories, unknown mtimes
        mode = p.file_mode(n.is_dir, bool(n.link))
        size = len(readlink(n)) if n.link else n.size  # a link's size: its target's length
        return p.attr_values(
            n.ino, size, 0.0, mode, nlink, self.uid, self.gid, BLKSIZE, mtime_ns=mtime_ns
        )

    def with_link(self, ds: str, key: str, info: FileInfo) -> FileInfo:
        """``info`` with the link target the client holds for ``key`` (the client's
        answers are rebuilt from the metadata it keeps, which carries the target)."""
        if info.link or info.is_dir:
            return info
        hit = self.cache.meta.get((ds, key))
        if hit is not None and hit[0].version == info.version and hit[0].link:
            return replace(info, link=hit[0].link)
        man = self.cache.manifests.get(ds)
        e = man[1].get(key) if man is not None else None
        if e is not None and e.version == info.version and e.link:
            return replace(info, link=e.link)
        return info

    def _dataset(self, name: str) -> Dataset | None:
        hit = self.cache.datasets.get(name)
        return hit[0] if hit is not None else None

    def _generation(self, path: str) -> int | None:
        ds = self._dataset(path.split("/", 2)[1])
        return ds.generation if ds is not None else None

    def ttl(self, n: Node) -> float:
        """Seconds the kernel may trust this entry and its attributes."""
        if n.key == "" and n.ds == "":
            return TOP_TTL
        ds = self._dataset(n.ds)
        if ds is None:
            return TOP_TTL
        s = ds.policy.staleness
        return FOREVER if s == NEVER else s

    def _fresh(self, n: Node) -> bool:
        if not n.key or "/" not in n.key:
            return True  # datasets and mounts: synthetic directories
        ttl = self.ttl(n)
        return ttl >= FOREVER or time.monotonic() - n.at <= ttl

    def _child(self, parent: Node, name: str, info: FileInfo | None) -> Node:
        path = parent.path.rstrip("/") + "/" + name
        n = self.by_path.get(path)
        if n is not None and info is not None and "/" in n.key and kind(n) != kind(info):
            # a file became a link or a directory (or back): to the kernel that is a new
            # inode (it never changes an inode's type); the old one lives until FORGET
            del self.by_path[path]
            self.notify_soon(
                [p.encode_inval_entry(parent.ino, name.encode("utf-8", "surrogateescape"))]
            )
            n = None
        if n is None:
            if parent.ino == p.ROOT_ID:
                ds, key = name, ""
            else:
                ds, key = parent.ds, (parent.key + "/" + name if parent.key else name)
            n = Node(self._next_ino, path, ds, key, True)
            self._next_ino += 1
            self.nodes[n.ino] = n
            self.by_path[path] = n
        if info is not None and self._apply(n, info):
            # a new version seen by revalidation (staleness bound, TTL): the kernel's
            # pages and attributes of the old one must go now, not at the next open --
            # and, with kernel-open, before the reply that carries the new attributes
            # (a read right after it would otherwise race the invalidation and could
            # get the old pages: same size and mtime, so AUTO_INVAL_DATA keeps them)
            self.invalidate_soon(n.ino)
        n.at = time.monotonic()
        n.attr = self._attr(n)
        return n

    def _apply(self, n: Node, info: FileInfo) -> bool:
        """Take ``info`` into the node; True if it replaced a known, other version."""
        # a "<size>-<mtime_ns>" version is the source's exact mtime; metadata that came
        # as a float (a read's answer) is only within ~1 us of it
        mtime_ns = version_mtime_ns(info.size, info.version) or info.mtime_ns
        if info.version == n.version and (not mtime_ns or abs(mtime_ns - n.mtime_ns) < 1000):
            mtime_ns = n.mtime_ns or mtime_ns  # no mtime, or a rounded one: keep ours
        n.is_dir, n.size, n.mtime_ns, n.link = info.is_dir, info.size, mtime_ns, info.link
        if info.version == n.version:
            return False
        old, n.version = n.version, info.version
        n.chunk = b""
        if n.passthrough_opens == 0:
            self._drop_backing(n)  # it holds the old version's bytes
        return bool(old) and not n.is_dir

    def notify_soon(self, msgs: list[bytes]) -> None:
        """Send notifications without waiting (from a handler: never block the loop)."""
        if self.notify is None or not msgs:
            return
        task = asyncio.get_running_loop().create_task(self.notify(msgs))
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    def invalidate_soon(self, ino: int) -> None:
        """Drop the kernel's pages and attributes of ``ino`` (a new version). Without
        opens nothing else would: in kernel-open mode the daemon holds attribute replies
        until these are written (never a READ's: invalidating waits for locked pages)."""
        if self.notify is None:
            return
        task = asyncio.get_running_loop().create_task(self.notify([p.encode_inval_inode(ino)]))
        self.invalidating.add(task)
        task.add_done_callback(self.invalidating.discard)

    def _keep_chunk(self, n: Node, at: int, data: bytes) -> None:
        n.chunk_at, n.chunk = at, data
        if self.kernel_open:  # no RELEASE ever drops it: keep the last few only
            self._chunks[n.ino] = n
            self._chunks.move_to_end(n.ino)
            while len(self._chunks) > MAX_CHUNKS:
                self._chunks.popitem(last=False)[1].chunk = b""

    def _entry(self, n: Node) -> bytes:
        n.nlookup += 1
        t = self.ttl(n)
        return p.encode_entry(n.ino, t, t, n.attr)

    def _node(self, nodeid: int) -> Node:
        n = self.nodes.get(nodeid)
        if n is None:
            raise OSError(errno.ESTALE, "unknown inode")
        return n

    def forget(self, nodeid: int, nlookup: int) -> None:
        n = self.nodes.get(nodeid)
        if n is None or n.ino == p.ROOT_ID:
            return
        n.nlookup -= nlookup
        if n.nlookup <= 0 and n.opens == 0:
            self._drop_backing(n)
            self._chunks.pop(nodeid, None)
            del self.nodes[nodeid]
            if self.by_path.get(n.path) is n:
                del self.by_path[n.path]

    # -- metadata -------------------------------------------------------------------

    def op_lookup(self, nodeid: int, body: memoryview) -> Result:
        parent = self._node(nodeid)
        name = p.parse_name(body).decode("utf-8", "surrogateescape")
        n = self.by_path.get(parent.path.rstrip("/") + "/" + name)
        if n is not None and self._fresh(n):
            return self._entry(n)
        if parent.key:  # inside a mount: the client may hold the metadata already
            held = self._held(parent, name) or self._from_listing(parent, name)
            if held is not None:
                return self._entry(held)
        return self._lookup(parent, name)

    def _from_listing(self, parent: Node, name: str) -> Node | None:
        """The child from a listing of its directory the mount took (within the bound)."""
        info = self.ahead.entry(parent.path, name, self.ttl(parent))
        return self._child(parent, name, info) if info is not None else None

    def _held(self, parent: Node, name: str) -> Node | None:
        """The child from the metadata the client holds (within its bound), if any."""
        ds = self._dataset(parent.ds)
        info = self.cache.info(ds, parent.key + "/" + name) if ds is not None else None
        if info is not None and (
            info.mtime_ns or info.is_dir or version_mtime_ns(info.size, info.version)
        ):
            return self._child(parent, name, info)
        if info is not None and ds is not None:
            # held without an mtime (a read's or a locate's answer): the manifest's
            # entry, else the file's metadata, rather than a made-up time
            man = self.cache.manifests.get(ds.name)
            e = man[1].get(info.path) if man is not None and man[0] == ds.manifest else None
            if e is not None and e.version == info.version:
                return self._child(parent, name, e.info())
            self.cache.forget(ds.name, info.path)
        return None

    async def _lookup(self, parent: Node, name: str) -> Reply:
        if parent.key and await self.ahead.wait_listing(parent.path, self.ttl(parent)):
            # the directory's listing answered for it
            held = self._held(parent, name) or self._from_listing(parent, name)
            if held is not None:
                return self._entry(held)
        self.stats.client_calls += 1
        info: FileInfo | None = None
        try:
            if parent.ino == p.ROOT_ID:
                if self.only is not None and name not in self.only:
                    raise NotFound(name)
                await self.client.dataset(name)
            elif not parent.key:
                ds = await self.client.dataset(parent.ds)
                ds.mount(name)
            else:
                info = await self.client.stat(parent.path + "/" + name)
                info = self.with_link(parent.ds, parent.key + "/" + name, info)
        except (NotFound, UserError):
            # a negative entry: the kernel remembers the miss as long as it would a hit,
            # and a sync that makes the name appear invalidates it (see revalidate)
            ttl = TOP_TTL if parent.ino == p.ROOT_ID else self.ttl(parent)
            if parent.ino != p.ROOT_ID and ttl > TOP_TTL:
                if len(self.negative) < MAX_NEGATIVE:
                    self.negative[(parent.ino, name)] = parent.ds
                else:
                    ttl = TOP_TTL
            return p.encode_entry(0, ttl, 0, p.attr_values(0, 0, 0, 0, 0, 0, 0, 0))
        return self._entry(self._child(parent, name, info))

    def op_forget(self, nodeid: int, body: memoryview) -> Result:
        self.forget(nodeid, p.FORGET_IN.unpack_from(body)[0])
        return None

    def op_batch_forget(self, nodeid: int, body: memoryview) -> Result:
        for nid, nl in p.parse_forgets(body):
            self.forget(nid, nl)
        return None

    def op_getattr(self, nodeid: int, body: memoryview) -> Result:
        n = self._node(nodeid)
        if self._fresh(n):
            return p.encode_attr_out(self.ttl(n), n.attr)
        return self._getattr(n)

    async def _restat(self, n: Node) -> None:
        self.stats.client_calls += 1
        ds = self._dataset(n.ds)
        if ds is not None:
            self.cache.forget(ds.name, n.key)
        info = self.with_link(n.ds, n.key, await self.client.stat(n.path))
        parent = self.by_path.get(n.path.rsplit("/", 1)[0] or "/")
        if parent is not None:
            self._child(parent, n.path.rsplit("/", 1)[1], info)

    async def _getattr(self, n: Node) -> Reply:
        await self._restat(n)
        return p.encode_attr_out(self.ttl(n), n.attr)

    def op_statfs(self, nodeid: int, body: memoryview) -> Result:
        return p.encode_statfs(len(self.nodes))

    # -- files ----------------------------------------------------------------------

    def _large(self, n: Node) -> bool:
        ds = self._dataset(n.ds)
        return ds is not None and n.size > ds.policy.page_size

    def op_open(self, nodeid: int, body: memoryview) -> Result:
        if self.kernel_open:
            # the kernel then opens every file itself (keep_cache) and stops asking
            raise OSError(errno.ENOSYS, "opens are handled by the kernel")
        flags = p.OPEN_IN.unpack_from(body)[0]
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
            raise OSError(errno.EROFS, "read-only")
        n = self._node(nodeid)
        if not self._fresh(n):
            return self._open_async(n, stat=True)
        if self.backing_open is not None and self._large(n):
            if self._backing_ok(n):
                return self._open_passthrough(n)
            if n.opens == 0:
                return self._open_async(n, stat=False)
        return self._open_cached(n)

    def _open_cached(self, n: Node) -> bytes:
        keep = n.kept_version in ("", n.version)
        n.kept_version = n.version
        n.opens += 1
        self.stats.cached_opens += 1
        return OPEN_KEEP if keep else OPEN_DROP

    def op_release(self, nodeid: int, body: memoryview) -> Result:
        fh = p.RELEASE_IN.unpack_from(body)[0]
        n = self.nodes.get(nodeid)
        if n is None:
            return b""
        n.opens -= 1
        if fh == 1:
            self._release_passthrough(n)
            note = getattr(self.client, "note_local_read", None)
            if note is not None:
                # the kernel read the worker's file itself: count it as a local hit (the
                # whole file: the daemon never sees how much of it was read)
                note(n.path, n.size)
        if n.opens <= 0:
            n.opens = 0
            n.chunk = b""
            if n.nlookup <= 0:
                self.forget(nodeid, 0)
        return b""

    def op_read(self, nodeid: int, body: memoryview) -> Result:
        _fh, off, size = p.READ_IN.unpack_from(body)[:3]
        n = self._node(nodeid)
        self.stats.reads += 1
        if off >= n.size or size == 0:
            return b""
        size = min(size, n.size - off)
        self.stats.read_bytes += size
        chunk = n.chunk
        start = off - n.chunk_at
        if chunk and start >= 0 and start + size <= len(chunk):
            return memoryview(chunk)[start : start + size]
        ds = self._dataset(n.ds)
        if ds is None:
            return self._read(n, off, size, off, size)
        if n.size <= ds.policy.page_size:
            data = read_located(self.cache, ds, n.key, off, size)
            return data if data is not None else self._read(n, off, size, off, size)
        # large files: read whole pages once and serve the kernel's smaller reads from them
        ps = ds.policy.page_size
        w0 = off - off % ps
        w1 = min(n.size, -(-(off + size) // ps) * ps)
        data = read_located(self.cache, ds, n.key, w0, w1 - w0)
        if data is None:
            return self._read(n, w0, w1 - w0, off, size)
        self._keep_chunk(n, w0, data)
        return memoryview(data)[off - w0 : off - w0 + size]

    async def _read(self, n: Node, w0: int, wlen: int, off: int, size: int) -> Reply:
        self.stats.client_calls += 1
        data = await self.client.read(n.path, w0, wlen)
        if wlen != size:
            self._keep_chunk(n, w0, data)
        return memoryview(data)[off - w0 : off - w0 + size]

    # -- the rest -------------------------------------------------------------------

    def op_readlink(self, nodeid: int, body: memoryview) -> Result:
        n = self._node(nodeid)
        if not n.link:
            raise OSError(errno.EINVAL, "not a link")
        return readlink(n)

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Handler] = {op: self.op_rofs for op in p.WRITE_OPS}
        table.update(
            {
                p.Op.LOOKUP: self.op_lookup,
                p.Op.FORGET: self.op_forget,
                p.Op.BATCH_FORGET: self.op_batch_forget,
                p.Op.GETATTR: self.op_getattr,
                p.Op.OPEN: self.op_open,
                p.Op.READ: self.op_read,
                p.Op.RELEASE: self.op_release,
                p.Op.OPENDIR: self.op_opendir,
                p.Op.READDIR: self.op_readdir,
                p.Op.READDIRPLUS: self.op_readdirplus,
                p.Op.RELEASEDIR: self.op_releasedir,
                p.Op.STATFS: self.op_statfs,
                p.Op.ACCESS: self.op_access,
                p.Op.GETXATTR: self.op_getxattr,
                p.Op.LISTXATTR: self.op_listxattr,
                p.Op.IOCTL: self.op_ioctl,
                p.Op.READLINK: self.op_readlink,
                p.Op.INTERRUPT: self.op_interrupt,
            }
        )
        return table

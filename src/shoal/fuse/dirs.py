"""Directory handlers of the mount (OPENDIR, READDIR, READDIRPLUS, RELEASEDIR): a
directory's listing is fetched once per open handle and served from it page by page;
and the answers of a read-only mount that need no state (ACCESS, XATTR, IOCTL, writes).

A mixin of :class:`shoal.fuse.ops.FileSystem`, which owns the state named below.
"""

from __future__ import annotations

import errno
import os

from shoal.client.aio import AsyncClient
from shoal.core.types import FileInfo
from shoal.fuse import protocol as p
from shoal.fuse.ahead import Ahead
from shoal.fuse.nodes import Fail, Node, Reply, Result, Stats

#: every IOCTL's answer (the kernel hands each on and never remembers it)
NOT_A_TTY = Fail(errno.ENOTTY)


class DirectoryOps:
    """The directory half of the handlers; the inode table is the FileSystem's."""

    client: AsyncClient
    ahead: Ahead
    stats: Stats
    only: set[str] | None
    started: float
    by_path: dict[str, Node]
    _dirs: dict[int, list[FileInfo] | None]
    _next_fh: int

    # the inode table's operations, defined by FileSystem
    def _node(self, nodeid: int) -> Node:
        raise NotImplementedError

    def _child(self, parent: Node, name: str, info: FileInfo | None) -> Node:
        raise NotImplementedError

    def _entry(self, n: Node) -> bytes:
        raise NotImplementedError

    def with_link(self, ds: str, key: str, info: FileInfo) -> FileInfo:
        raise NotImplementedError

    def op_opendir(self, nodeid: int, body: memoryview) -> Result:
        n = self._node(nodeid)
        if not n.is_dir:
            raise OSError(errno.ENOTDIR, n.path)
        fh = self._next_fh
        self._next_fh += 1
        self._dirs[fh] = None
        return p.encode_open(fh, 0)

    def op_releasedir(self, nodeid: int, body: memoryview) -> Result:
        self._dirs.pop(p.RELEASE_IN.unpack_from(body)[0], None)
        return b""

    async def _listing(self, n: Node) -> list[FileInfo]:
        self.stats.client_calls += 1
        if n.ino == p.ROOT_ID:
            names = [d.name for d in await self.client.datasets()]
            if self.only is not None:
                names = [x for x in names if x in self.only]
            return [FileInfo(x, 0, "", self.started, True) for x in sorted(names)]
        if not n.key:
            ds = await self.client.dataset(n.ds)
            return [FileInfo(m.name, 0, "", self.started, True) for m in ds.mounts]
        started = self.ahead.epoch(n.path)
        out = [self.listed_entry(n.path, e) for e in await self.client.ls(n.path)]
        self.ahead.listed(n.path, out, started)  # its lookups are answered from it
        return out

    def listed_entry(self, path: str, e: FileInfo) -> FileInfo:
        """A client's listing entry of directory ``path`` as the mount shows it: named by
        its name, with the link target the client holds."""
        name = e.path.rsplit("/", 1)[1]
        key = path.split("/", 2)[2] + "/" + name
        e = self.with_link(path.split("/", 2)[1], key, e)
        return FileInfo(name, e.size, e.version, e.mtime, e.is_dir, e.mtime_ns, e.link)

    def op_readdirplus(self, nodeid: int, body: memoryview) -> Result:
        return self._readdir(nodeid, body, True)

    def op_readdir(self, nodeid: int, body: memoryview) -> Result:
        return self._readdir(nodeid, body, False)

    def _readdir(self, nodeid: int, body: memoryview, plus: bool) -> Result:
        fh, off, size = p.READ_IN.unpack_from(body)[:3]
        n = self._node(nodeid)
        if fh not in self._dirs:
            raise OSError(errno.EBADF, "unknown directory handle")
        entries = self._dirs[fh]
        if entries is None:
            return self._readdir_async(n, fh, off, size, plus)
        return self._dirents(n, entries, off, size, plus)

    async def _readdir_async(self, n: Node, fh: int, off: int, size: int, plus: bool) -> Reply:
        entries = await self._listing(n)
        if fh in self._dirs:
            self._dirs[fh] = entries
        return self._dirents(n, entries, off, size, plus)

    def _dirents(self, n: Node, entries: list[FileInfo], off: int, size: int, plus: bool) -> Reply:
        out: list[bytes] = []
        used = 0
        for i in range(off, len(entries)):
            e = entries[i]
            name = e.path.encode("utf-8", "surrogateescape")
            need = p.dirent_size(name) + (p.ENTRY_OUT.size if plus else 0)
            if used + need > size:
                break
            used += need
            if plus:
                c = self._child(n, e.path, None if not n.key else e)
                dt = p.dtype(e.is_dir, bool(e.link))
                out.append(p.encode_direntplus(self._entry(c), c.ino, i + 1, dt, name))
            else:
                c0 = self.by_path.get(n.path.rstrip("/") + "/" + e.path)
                ino = c0.ino if c0 is not None else (1 << 62) + i
                out.append(p.encode_dirent(ino, i + 1, p.dtype(e.is_dir, bool(e.link)), name))
        return b"".join(out)  # one buffer: writev takes at most IOV_MAX (1024)

    # -- answers without state --------------------------------------------------------

    def op_access(self, nodeid: int, body: memoryview) -> Result:
        if p.GETXATTR_IN.unpack_from(body)[0] & os.W_OK:
            raise OSError(errno.EROFS, "read-only")
        return b""

    def op_getxattr(self, nodeid: int, body: memoryview) -> Result:
        raise OSError(errno.ENODATA, "no attributes")

    def op_listxattr(self, nodeid: int, body: memoryview) -> Result:
        if p.GETXATTR_IN.unpack_from(body)[0] == 0:
            return p.GETXATTR_OUT.pack(0, 0)
        return b""

    def op_ioctl(self, nodeid: int, body: memoryview) -> Result:
        return NOT_A_TTY  # one per buffered open() (isatty): answered without a raise

    def op_rofs(self, nodeid: int, body: memoryview) -> Result:
        raise OSError(errno.EROFS, "read-only")

    def op_nosys(self, nodeid: int, body: memoryview) -> Result:
        # ENOSYS makes the kernel stop sending FLUSH, FSYNC, LSEEK, ... for good
        raise OSError(errno.ENOSYS, "not implemented")

    def op_interrupt(self, nodeid: int, body: memoryview) -> Result:
        return None  # requests end on their own (the client's retries are bounded)

"""The kernel's FUSE wire protocol (``include/uapi/linux/fuse.h``, 7.45): opcodes, flags
and the fixed layouts of the messages this mount reads and writes. Pure encoding and
decoding with :class:`struct.Struct`, no I/O, so it is unit-tested without a mount.

A request is ``fuse_in_header`` + an opcode-specific body; a reply is
``fuse_out_header`` + a body (or only the header, with a negative errno).
"""

from __future__ import annotations

import stat
import struct
from enum import IntEnum
from typing import NamedTuple

KERNEL_MAJOR = 7
#: the newest minor version whose layouts are written here
KERNEL_MINOR = 45
ROOT_ID = 1


class Op(IntEnum):
    LOOKUP = 1
    FORGET = 2
    GETATTR = 3
    SETATTR = 4
    READLINK = 5
    SYMLINK = 6
    MKNOD = 8
    MKDIR = 9
    UNLINK = 10
    RMDIR = 11
    RENAME = 12
    LINK = 13
    OPEN = 14
    READ = 15
    WRITE = 16
    STATFS = 17
    RELEASE = 18
    FSYNC = 20
    SETXATTR = 21
    GETXATTR = 22
    LISTXATTR = 23
    REMOVEXATTR = 24
    FLUSH = 25
    INIT = 26
    OPENDIR = 27
    READDIR = 28
    RELEASEDIR = 29
    FSYNCDIR = 30
    GETLK = 31
    SETLK = 32
    SETLKW = 33
    ACCESS = 34
    CREATE = 35
    INTERRUPT = 36
    BMAP = 37
    DESTROY = 38
    IOCTL = 39
    POLL = 40
    NOTIFY_REPLY = 41
    BATCH_FORGET = 42
    FALLOCATE = 43
    READDIRPLUS = 44
    RENAME2 = 45
    LSEEK = 46
    COPY_FILE_RANGE = 47
    SETUPMAPPING = 48
    REMOVEMAPPING = 49
    SYNCFS = 50
    TMPFILE = 51
    STATX = 52
    COPY_FILE_RANGE_64 = 53


#: operations that would change the file system: always EROFS
WRITE_OPS = frozenset(
    {
        Op.SETATTR,
        Op.SYMLINK,
        Op.MKNOD,
        Op.MKDIR,
        Op.UNLINK,
        Op.RMDIR,
        Op.RENAME,
        Op.LINK,
        Op.WRITE,
        Op.SETXATTR,
        Op.REMOVEXATTR,
        Op.CREATE,
        Op.FALLOCATE,
        Op.RENAME2,
        Op.COPY_FILE_RANGE,
        Op.TMPFILE,
        Op.COPY_FILE_RANGE_64,
        Op.SETLK,
        Op.SETLKW,
    }
)
#: requests the kernel sends without waiting for a reply
NO_REPLY = frozenset({Op.FORGET, Op.BATCH_FORGET, Op.INTERRUPT})

# INIT flags (flags | flags2 << 32)
ASYNC_READ = 1 << 0
BIG_WRITES = 1 << 5
AUTO_INVAL_DATA = 1 << 12
DO_READDIRPLUS = 1 << 13
READDIRPLUS_AUTO = 1 << 14
ASYNC_DIO = 1 << 15
NO_OPEN_SUPPORT = 1 << 17
PARALLEL_DIROPS = 1 << 18
MAX_PAGES = 1 << 22
NO_OPENDIR_SUPPORT = 1 << 24
INIT_EXT = 1 << 30
PASSTHROUGH = 1 << 37

# OPEN reply flags
FOPEN_DIRECT_IO = 1 << 0
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_CACHE_DIR = 1 << 3
FOPEN_NOFLUSH = 1 << 5
FOPEN_PASSTHROUGH = 1 << 7

#: the largest stack depth of a backing file system the kernel accepts
MAX_STACK_DEPTH = 2

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid extlen pad
#: the part of it the request loop needs (one tuple of four, not one of nine and a slice)
IN_ROUTE = struct.Struct("<IIQQ")  # len opcode unique nodeid
OUT_HEADER = struct.Struct("<IiQ")  # len error unique
INIT_IN = struct.Struct("<IIII")  # major minor max_readahead flags
INIT_IN_EXT = struct.Struct("<IIIII")  # ... flags2 (with INIT_EXT)
# major minor max_readahead flags max_background congestion_threshold max_write time_gran
# max_pages map_alignment flags2 max_stack_depth request_timeout unused[11]
INIT_OUT = struct.Struct("<IIIIHHIIHHIIH22x")
_ATTR = "QQQQQQIIIIIIIIII"  # ino size blocks atime mtime ctime *nsec mode nlink uid gid rdev blksize flags
ATTR = struct.Struct("<" + _ATTR)
ENTRY_OUT = struct.Struct("<QQQQII" + _ATTR)  # nodeid generation entry_valid attr_valid *nsec attr
ATTR_OUT = struct.Struct("<QII" + _ATTR)  # attr_valid attr_valid_nsec dummy attr
OPEN_IN = struct.Struct("<II")  # flags open_flags
OPEN_OUT = struct.Struct("<QIi")  # fh open_flags backing_id
READ_IN = struct.Struct("<QQIIQII")  # fh offset size read_flags lock_owner flags padding
RELEASE_IN = struct.Struct("<QIIQ")  # fh flags release_flags lock_owner
FORGET_IN = struct.Struct("<Q")
BATCH_FORGET_IN = struct.Struct("<II")
FORGET_ONE = struct.Struct("<QQ")
DIRENT = struct.Struct("<QQII")  # ino off namelen type
STATFS_OUT = struct.Struct("<QQQQQIIII24x")  # blocks bfree bavail files ffree bsize namelen frsize
GETXATTR_IN = struct.Struct("<II")  # size padding
GETXATTR_OUT = struct.Struct("<II")  # size padding
BACKING_MAP = struct.Struct("<iIQ")  # fd flags padding

# notifications: written to /dev/fuse unasked, with unique 0 and the code in "error"
NOTIFY_INVAL_INODE = 2
NOTIFY_INVAL_ENTRY = 3
NOTIFY_INVAL_INODE_OUT = struct.Struct("<Qqq")  # ino off len
NOTIFY_INVAL_ENTRY_OUT = struct.Struct("<QII")  # parent namelen flags


class Header(NamedTuple):
    length: int
    opcode: int
    unique: int
    nodeid: int
    uid: int
    gid: int
    pid: int


class InitIn(NamedTuple):
    major: int
    minor: int
    max_readahead: int
    flags: int  # flags | flags2 << 32


class InitOut(NamedTuple):
    minor: int
    max_readahead: int
    flags: int  # flags | flags2 << 32
    max_background: int
    congestion_threshold: int
    max_write: int
    max_pages: int
    max_stack_depth: int


def parse_header(buf: bytes | bytearray | memoryview) -> Header:
    return Header(*IN_HEADER.unpack_from(buf)[:7])


def parse_init(body: bytes | bytearray | memoryview) -> InitIn:
    major, minor, ra, flags = INIT_IN.unpack_from(body)
    if flags & INIT_EXT and len(body) >= INIT_IN_EXT.size:
        flags |= INIT_IN_EXT.unpack_from(body)[4] << 32
    return InitIn(major, minor, ra, flags)


def encode_init(out: InitOut) -> bytes:
    return INIT_OUT.pack(
        KERNEL_MAJOR,
        out.minor,
        out.max_readahead,
        out.flags & 0xFFFFFFFF,
        out.max_background,
        out.congestion_threshold,
        out.max_write,
        1,  # time_gran: nanoseconds
        out.max_pages,
        0,
        out.flags >> 32,
        out.max_stack_depth,
        0,
    )


def reply_header(unique: int, body_len: int, error: int = 0) -> bytes:
    """``error`` is a positive errno (sent negated) or 0."""
    return OUT_HEADER.pack(OUT_HEADER.size + body_len, -error, unique)


def encode_inval_inode(ino: int, off: int = 0, length: int = 0) -> bytes:
    """FUSE_NOTIFY_INVAL_INODE: the kernel drops the inode's attributes and, with
    ``off >= 0``, its cached pages from ``off`` (``length <= 0``: to the end)."""
    body = NOTIFY_INVAL_INODE_OUT.pack(ino, off, length)
    return OUT_HEADER.pack(OUT_HEADER.size + len(body), NOTIFY_INVAL_INODE, 0) + body


def encode_inval_entry(parent: int, name: bytes) -> bytes:
    """FUSE_NOTIFY_INVAL_ENTRY: the kernel forgets the name ``name`` in directory
    ``parent`` (also a negative entry), so the next access looks it up again."""
    body = NOTIFY_INVAL_ENTRY_OUT.pack(parent, len(name), 0) + name + b"\0"
    return OUT_HEADER.pack(OUT_HEADER.size + len(body), NOTIFY_INVAL_ENTRY, 0) + body


def split_time(t: float) -> tuple[int, int]:
    """Seconds as (seconds, nanoseconds), both non-negative."""
    if t <= 0:
        return 0, 0
    sec = int(t)
    return sec, int((t - sec) * 1e9)


def attr_values(
    ino: int,
    size: int,
    mtime: float,
    mode: int,
    nlink: int,
    uid: int,
    gid: int,
    blksize: int,
    mtime_ns: int | None = None,
) -> tuple[int, ...]:
    """The fields of ``fuse_attr`` in order: pack with ATTR, or append to ENTRY_OUT's.
    ``mtime_ns`` (exact nanoseconds), when given, is used instead of ``mtime``."""
    if mtime_ns is not None and mtime_ns > 0:
        sec, nsec = divmod(mtime_ns, 1_000_000_000)
    else:
        sec, nsec = split_time(mtime)
    return (
        ino,
        size,
        (size + 511) // 512,
        sec,
        sec,
        sec,
        nsec,
        nsec,
        nsec,
        mode,
        nlink,
        uid,
        gid,
        0,
        blksize,
        0,
    )


def file_mode(is_dir: bool, link: bool = False) -> int:
    if link:
        return stat.S_IFLNK | 0o777
    return stat.S_IFDIR | 0o555 if is_dir else stat.S_IFREG | 0o444


def encode_entry(
    nodeid: int, entry_valid: float, attr_valid: float, attr: tuple[int, ...]
) -> bytes:
    es, ens = split_time(entry_valid)
    as_, ans = split_time(attr_valid)
    return ENTRY_OUT.pack(nodeid, 0, es, as_, ens, ans, *attr)


def encode_attr_out(attr_valid: float, attr: tuple[int, ...]) -> bytes:
    s, ns = split_time(attr_valid)
    return ATTR_OUT.pack(s, ns, 0, *attr)


def encode_open(fh: int, flags: int, backing_id: int = 0) -> bytes:
    return OPEN_OUT.pack(fh, flags, backing_id)


def dirent_size(name: bytes) -> int:
    return (DIRENT.size + len(name) + 7) & ~7


def encode_dirent(ino: int, off: int, dtype: int, name: bytes) -> bytes:
    """One ``fuse_dirent``; ``off`` is the offset of the *next* entry."""
    pad = dirent_size(name) - DIRENT.size - len(name)
    return DIRENT.pack(ino, off, len(name), dtype) + name + b"\0" * pad


def encode_direntplus(entry: bytes, ino: int, off: int, dtype: int, name: bytes) -> bytes:
    """One ``fuse_direntplus``: an encoded entry_out, then the dirent."""
    return entry + encode_dirent(ino, off, dtype, name)


def dtype(is_dir: bool, link: bool = False) -> int:
    if link:
        return 10  # DT_LNK
    return 4 if is_dir else 8  # DT_DIR, DT_REG


def encode_statfs(files: int, bsize: int = 4096, namelen: int = 255) -> bytes:
    return STATFS_OUT.pack(0, 0, 0, files, 0, bsize, namelen, bsize, 0)


def parse_forgets(body: bytes | bytearray | memoryview) -> list[tuple[int, int]]:
    """(nodeid, nlookup) pairs of a BATCH_FORGET body."""
    count = BATCH_FORGET_IN.unpack_from(body)[0]
    base = BATCH_FORGET_IN.size
    return [FORGET_ONE.unpack_from(body, base + i * FORGET_ONE.size) for i in range(count)]


def parse_name(body: bytes | bytearray | memoryview, offset: int = 0) -> bytes:
    """A NUL-terminated name at ``offset`` of a body."""
    raw = bytes(body[offset:])
    end = raw.find(b"\0")
    return raw if end < 0 else raw[:end]

"""FUSE wire encoding against the sizes and offsets of include/uapi/linux/fuse.h."""

from __future__ import annotations

import stat

from shoal.fuse import protocol as p


def test_struct_sizes_match_the_kernel_header() -> None:
    assert p.IN_HEADER.size == 40
    assert p.OUT_HEADER.size == 16
    assert p.INIT_OUT.size == 64
    assert p.ATTR.size == 88
    assert p.ENTRY_OUT.size == 128
    assert p.ATTR_OUT.size == 104
    assert p.OPEN_OUT.size == 16
    assert p.READ_IN.size == 40
    assert p.RELEASE_IN.size == 24
    assert p.DIRENT.size == 24
    assert p.STATFS_OUT.size == 80
    assert p.BACKING_MAP.size == 16


def test_header_roundtrip() -> None:
    raw = p.IN_HEADER.pack(56, p.Op.LOOKUP, 7, 1, 1000, 1000, 42, 0, 0) + b"name\0"
    h = p.parse_header(raw)
    assert h == p.Header(56, p.Op.LOOKUP, 7, 1, 1000, 1000, 42)
    assert p.parse_name(raw, p.IN_HEADER.size) == b"name"


def test_reply_header_negates_errno() -> None:
    assert p.OUT_HEADER.unpack(p.reply_header(9, 0, 2)) == (16, -2, 9)
    assert p.OUT_HEADER.unpack(p.reply_header(9, 100)) == (116, 0, 9)


def test_init_with_flags2_and_passthrough() -> None:
    flags = p.ASYNC_READ | p.INIT_EXT
    body = p.INIT_IN_EXT.pack(7, 45, 131072, flags, (p.PASSTHROUGH >> 32)) + b"\0" * 44
    kin = p.parse_init(body)
    assert (kin.major, kin.minor, kin.max_readahead) == (7, 45, 131072)
    assert kin.flags & p.PASSTHROUGH and kin.flags & p.ASYNC_READ
    # without INIT_EXT, flags2 is not there
    old = p.parse_init(p.INIT_IN.pack(7, 31, 65536, p.ASYNC_READ))
    assert old.flags == p.ASYNC_READ

    out = p.InitOut(45, 131072, kin.flags | p.MAX_PAGES, 64, 48, 131072, 256, 2)
    raw = p.encode_init(out)
    f = p.INIT_OUT.unpack(raw)
    assert f[:4] == (7, 45, 131072, (kin.flags | p.MAX_PAGES) & 0xFFFFFFFF)
    assert f[4:10] == (64, 48, 131072, 1, 256, 0)
    assert f[10] == p.PASSTHROUGH >> 32  # flags2
    assert f[11] == 2  # max_stack_depth


def test_entry_and_attr_layout() -> None:
    attr = p.attr_values(5, 1000, 1.5, p.file_mode(False), 1, 0, 0, 4096)
    raw = p.encode_entry(5, 10.25, 3, attr)
    f = p.ENTRY_OUT.unpack(raw)
    assert f[0] == 5 and f[2] == 10 and f[3] == 3 and f[4] == 250_000_000 and f[5] == 0
    ino, size, blocks, _at, mtime, _ct, _an, mns = f[6:14]
    assert (ino, size, blocks, mtime, mns) == (5, 1000, 2, 1, 500_000_000)
    mode = f[15]
    assert stat.S_ISREG(mode) and mode & 0o777 == 0o444
    assert stat.S_ISDIR(p.file_mode(True))
    a = p.ATTR_OUT.unpack(p.encode_attr_out(1e9, attr))
    assert a[0] == 1_000_000_000 and a[3] == 5


def test_open_reply_carries_backing_id() -> None:
    raw = p.encode_open(1, p.FOPEN_PASSTHROUGH, 17)
    assert p.OPEN_OUT.unpack(raw) == (1, 1 << 7, 17)


def test_dirents_are_padded_to_8_bytes() -> None:
    for name in (b"a", b"abcdefgh", b"x" * 255):
        d = p.encode_dirent(9, 3, p.dtype(False), name)
        assert len(d) % 8 == 0 and len(d) == p.dirent_size(name)
        ino, off, namelen, typ = p.DIRENT.unpack_from(d)
        assert (ino, off, namelen, typ) == (9, 3, len(name), 8)
        assert d[24 : 24 + namelen] == name
    entry = p.encode_entry(9, 1, 1, p.attr_values(9, 0, 0, p.file_mode(True), 2, 0, 0, 0))
    plus = p.encode_direntplus(entry, 9, 1, p.dtype(True), b"dir")
    assert len(plus) == 128 + 32 and p.DIRENT.unpack_from(plus, 128)[3] == 4


def test_batch_forget_and_statfs() -> None:
    body = p.BATCH_FORGET_IN.pack(2, 0) + p.FORGET_ONE.pack(3, 1) + p.FORGET_ONE.pack(4, 7)
    assert p.parse_forgets(body) == [(3, 1), (4, 7)]
    st = p.STATFS_OUT.unpack(p.encode_statfs(10))
    assert st[3] == 10 and st[5] == 4096 and st[6] == 255


def test_write_ops_are_all_refused() -> None:
    for op in (p.Op.SETATTR, p.Op.CREATE, p.Op.MKDIR, p.Op.UNLINK, p.Op.RENAME2, p.Op.WRITE):
        assert op in p.WRITE_OPS
    assert p.Op.READ not in p.WRITE_OPS and p.Op.FORGET in p.NO_REPLY


def test_invalidation_notifications_and_nanosecond_attrs() -> None:
    msg = p.encode_inval_inode(7)
    length, code, unique = p.OUT_HEADER.unpack_from(msg)
    assert (length, code, unique) == (len(msg), p.NOTIFY_INVAL_INODE, 0)
    assert p.NOTIFY_INVAL_INODE_OUT.unpack_from(msg, p.OUT_HEADER.size) == (7, 0, 0)
    msg = p.encode_inval_entry(3, b"name.bin")
    length, code, unique = p.OUT_HEADER.unpack_from(msg)
    assert (length, code, unique) == (len(msg), p.NOTIFY_INVAL_ENTRY, 0)
    parent, namelen, _ = p.NOTIFY_INVAL_ENTRY_OUT.unpack_from(msg, p.OUT_HEADER.size)
    body = msg[p.OUT_HEADER.size + p.NOTIFY_INVAL_ENTRY_OUT.size :]
    assert (parent, namelen, body) == (3, 8, b"name.bin\0")
    ns = 1_700_000_000_123_456_789
    f = p.ATTR.unpack(p.ATTR.pack(*p.attr_values(5, 1, 0.0, 0o100444, 1, 0, 0, 4096, ns)))
    assert (f[4], f[7]) == (1_700_000_000, 123_456_789)  # mtime, mtimensec


def test_link_targets_resolve_inside_the_mount_and_versions_carry_mtimes() -> None:
    from shoal.fuse.nodes import Node, readlink, version_mtime_ns

    def node(key: str, link: str) -> Node:
        return Node(9, "/ds/" + key, "ds", key, False, link=link)

    assert readlink(node("m/link.txt", "a.txt")) == b"a.txt"
    assert readlink(node("m/d/e/link", "x/y.bin")) == b"../../x/y.bin"
    assert readlink(node("m/d/up", ".")) == b".."  # a link to the mount's root
    assert version_mtime_ns(5, "5-1700000000123456789") == 1_700_000_000_123_456_789
    assert version_mtime_ns(5, "6-17") == 0 and version_mtime_ns(5, "etag") == 0
    assert p.file_mode(False, True) & 0o170000 == stat.S_IFLNK and p.dtype(False, True) == 10

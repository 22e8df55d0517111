"""Mount-table reading and the mount(2) calls of the node plugin: read-only bind mounts
of the FUSE mount's directories, stacked binds for repairs, and their removal.

State is always read back from ``/proc/self/mountinfo``, never assumed: a bind mount
made by an earlier plugin process, or repaired over a dead one, is what the kernel
says it is.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
from dataclasses import dataclass

log = logging.getLogger("shoal.csi.mounts")

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MNT_DETACH = 0x2

MOUNTINFO = "/proc/self/mountinfo"
#: a stack of mounts deeper than this at one target is a bug, not a state to unwind
MAX_STACK = 64

_libc: ctypes.CDLL | None = None
_ESCAPE = re.compile(r"\\([0-7]{3})")


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(rc: int, what: str, path: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what} {path}: {os.strerror(e)}")


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo."""

    mount_id: int
    parent_id: int
    #: major:minor of the file system (a FUSE mount and its binds share one)
    dev: str
    #: the directory of the mounted file system this mount shows ("/ds" for a bind of
    #: the FUSE mount's directory ds)
    root: str
    point: str
    options: frozenset[str]
    fstype: str
    source: str

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def read_mountinfo(path: str = MOUNTINFO) -> list[MountEntry]:
    out = []
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            out.append(
                MountEntry(
                    mount_id=int(fields[0]),
                    parent_id=int(fields[1]),
                    dev=fields[2],
                    root=_unescape(fields[3]),
                    point=_unescape(fields[4]),
                    options=frozenset(fields[5].split(",")),
                    fstype=fields[sep + 1],
                    source=_unescape(fields[sep + 2]) if len(fields) > sep + 2 else "",
                )
            )
    return out


def stack_at(point: str, table: list[MountEntry] | None = None) -> list[MountEntry]:
    """The mounts at ``point``, bottom first (each one's parent is the one below)."""
    at = [m for m in (read_mountinfo() if table is None else table) if m.point == point]
    by_parent = {m.parent_id: m for m in at}
    ids = {m.mount_id for m in at}
    bottom = [m for m in at if m.parent_id not in ids]
    if not bottom:
        return at
    stack = [bottom[0]]
    while stack[-1].mount_id in by_parent and len(stack) < len(at):
        stack.append(by_parent[stack[-1].mount_id])
    return stack


def top_at(point: str, table: list[MountEntry] | None = None) -> MountEntry | None:
    """The mount a path lookup of ``point`` lands on, or None if none is there."""
    stack = stack_at(point, table)
    return stack[-1] if stack else None


def is_fuse(entry: MountEntry) -> bool:
    return entry.fstype == "fuse" or entry.fstype.startswith(("fuse.", "fuseblk"))


def bind_read_only(source: str, target: str) -> None:
    """Bind ``source`` at ``target`` (on top of whatever is there) and make that one
    mount read-only, nosuid and nodev. The FUSE mount itself is left as it is."""
    _check(
        _c().mount(os.fsencode(source), os.fsencode(target), None, ctypes.c_ulong(MS_BIND), None),
        "bind mount",
        target,
    )
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
    rc = _c().mount(None, os.fsencode(target), None, ctypes.c_ulong(flags), None)
    if rc != 0:
        e = ctypes.get_errno()
        umount(target, lazy=True)  # never leave a writable bind behind
        raise OSError(e, f"remount read-only {target}: {os.strerror(e)}")


def umount(target: str, lazy: bool = False) -> None:
    rc = _c().umount2(os.fsencode(target), MNT_DETACH if lazy else 0)
    _check(rc, "umount", target)


def umount_all(target: str) -> int:
    """Unmount every mount stacked at ``target``, lazily where one is busy or its file
    system is gone. Returns how many were removed."""
    n = 0
    while top_at(target) is not None:
        if n >= MAX_STACK:
            raise OSError(errno.ELOOP, f"more than {MAX_STACK} mounts stacked at {target}")
        try:
            umount(target)
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # not a mount point any more (raced)
                continue
            log.info("umount %s failed (%s); detaching lazily", target, exc.strerror)
            umount(target, lazy=True)
        n += 1
    return n

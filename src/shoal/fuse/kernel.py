"""The kernel side of a mount: /dev/fuse, mount(2) and umount2(2) through libc, the
passthrough ioctls, and the mount table. Linux only; needs CAP_SYS_ADMIN (root).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os

from shoal.fuse.protocol import BACKING_MAP

log = logging.getLogger("shoal.fuse.kernel")

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOATIME = 1024
MNT_FORCE = 1
MNT_DETACH = 2

FUSE_DEV_IOC_BACKING_OPEN = 0x4010E501
FUSE_DEV_IOC_BACKING_CLOSE = 0x4004E502

FSTYPE = "fuse.shoal"

_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(rc: int, what: str, path: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what} {path}: {os.strerror(e)}")


def open_device() -> int:
    """A fresh /dev/fuse descriptor (one per mount)."""
    try:
        return os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise OSError(errno.ENODEV, "/dev/fuse is missing: load the fuse module") from None


def mount(devfd: int, mountpoint: str, max_read: int, source: str = "shoal") -> None:
    """mount(2) a read-only FUSE file system served on ``devfd`` at ``mountpoint``.

    ``default_permissions`` lets the kernel check modes itself (no ACCESS requests);
    ``allow_other`` lets training processes of any user read.
    """
    mode = os.stat(mountpoint).st_mode
    opts = (
        f"fd={devfd},rootmode={mode & 0o170000:o},user_id={os.getuid()},group_id={os.getgid()},"
        f"default_permissions,allow_other,max_read={max_read}"
    )
    rc = _c().mount(
        source.encode(),
        os.fsencode(mountpoint),
        FSTYPE.encode(),
        ctypes.c_ulong(MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOATIME),
        opts.encode(),
    )
    _check(rc, "mount", mountpoint)


def umount(mountpoint: str, lazy: bool = False) -> None:
    rc = _c().umount2(os.fsencode(mountpoint), MNT_DETACH if lazy else 0)
    _check(rc, "umount", mountpoint)


def is_mounted(mountpoint: str) -> bool:
    """Whether a shoal FUSE file system is mounted at ``mountpoint`` (per /proc)."""
    target = os.path.abspath(mountpoint)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                sep = fields.index("-")
                point = fields[4].encode().decode("unicode_escape")
                if point == target and fields[sep + 1] == FSTYPE:
                    return True
    except OSError:
        return False
    return False


def umount_any(mountpoint: str) -> bool:
    """Unmount, falling back to a lazy unmount when busy or the daemon is gone.

    Leaves no "Transport endpoint is not connected" behind. True if something was
    unmounted.
    """
    if not is_mounted(mountpoint):
        return False
    try:
        umount(mountpoint)
    except OSError as exc:
        log.info("umount %s failed (%s); detaching lazily", mountpoint, exc.strerror)
        umount(mountpoint, lazy=True)
    return True


def backing_open(devfd: int, fd: int) -> int:
    """Register ``fd`` as a passthrough backing file; returns its backing id."""
    arg = bytearray(BACKING_MAP.pack(fd, 0, 0))
    return fcntl.ioctl(devfd, FUSE_DEV_IOC_BACKING_OPEN, arg, True)


def backing_close(devfd: int, backing_id: int) -> None:
    arg = bytearray(backing_id.to_bytes(4, "little"))
    fcntl.ioctl(devfd, FUSE_DEV_IOC_BACKING_CLOSE, arg, True)


def set_readahead(mountpoint: str, kib: int) -> bool:
    """Raise the mount's block-device-info readahead (the kernel caps INIT's at 128 KiB)."""
    dev = os.stat(mountpoint).st_dev
    path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
    try:
        with open(path, "w") as f:
            f.write(str(kib))
        return True
    except OSError as exc:
        log.debug("cannot set readahead via %s: %s", path, exc)
        return False

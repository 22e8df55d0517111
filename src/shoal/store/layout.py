"""The on-disk layout of a tier directory, its version, and its single-owner lock.

::

    <tier>/layout.json          {"format": "shoal.store.disk", "version": 1}
    <tier>/lock                 flock()ed by the process that owns the tier
    <tier>/index.sqlite         the persistent index (plus -wal / -shm)
    <tier>/seg/<id>.seg         append-only segments of small files
    <tier>/files/<xx>/<h>.data  one sparse data file per large file version

Everything the tier creates is private to the service user (files 0600, directories
0700): same-host readers get open descriptors from the worker, never open by name.

A directory with another layout version (or data but no layout file) is wiped, with a
warning: the cache is refetchable, a wrong interpretation of its bytes is not.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil

from shoal.errors import InvalidArgument

log = logging.getLogger("shoal.store.disk")

FORMAT = "shoal.store.disk"
VERSION = 1
LAYOUT_FILE = "layout.json"
INDEX_FILE = "index.sqlite"
SEG_DIR = "seg"
FILES_DIR = "files"
_OWNED = (INDEX_FILE, INDEX_FILE + "-wal", INDEX_FILE + "-shm", SEG_DIR, FILES_DIR)


def lock(root: str) -> int:
    """Take the tier's lock (InvalidArgument if another store has it open); the fd."""
    os.makedirs(root, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(root, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InvalidArgument(f"tier directory {root} is in use by another store") from None
    return fd


def unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def prepare(root: str) -> None:
    """Make ``root`` a tier directory of the current layout, wiping an incompatible one."""
    path = os.path.join(root, LAYOUT_FILE)
    expected = {"format": FORMAT, "version": VERSION}
    try:
        with open(path, encoding="utf-8") as f:
            found: object = json.load(f)
    except FileNotFoundError:
        found = None
    except (OSError, ValueError):
        found = "unreadable"
    if found == expected:
        return
    leftovers = [n for n in _OWNED if os.path.lexists(os.path.join(root, n))]
    if found is not None or leftovers:
        log.warning(
            "tier directory %s has layout %r, expected %r: discarding its cached data",
            root,
            found,
            expected,
        )
        wipe(root)
    tmp = path + ".tmp"
    with open(
        os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8"
    ) as f:
        json.dump(expected, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def wipe(root: str) -> None:
    """Remove the index and all cached data of a tier directory (not the layout or lock)."""
    for name in _OWNED:
        p = os.path.join(root, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)

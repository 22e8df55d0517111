"""Local targets of ``shoal fs cp``: what may be written, and how.

The rule (README, "Using shoal"):

- a regular file, or a name that does not exist yet, is written to a temporary name
  beside it and renamed over it once every byte is written: never a half-written file;
  a symlink to a regular file replaces the file it points to, not the link;
- a character device or a FIFO (``/dev/stdout``, ``/dev/null``, a named pipe) is
  written into directly, never replaced: renaming over ``/dev/full`` would swap a
  device node for a regular file;
- anything else (a directory where a file should go, a block device, a socket) is
  refused with a one-line error.

Every write is checked (:func:`~shoal.cli.output.write_all`); a full disk or a closed
pipe ends the command with status 1 and the target untouched (regular files) or
holding what was written (devices, FIFOs).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from shoal.cli.output import OutputError, write_all
from shoal.errors import InvalidArgument


@dataclass(frozen=True)
class Target:
    path: Path
    #: True: write into the existing node; False: temp file + rename
    direct: bool
    #: permission bits for a replaced or new regular file
    mode: int = 0o644


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


def _oserror(what: str, path: Path, exc: OSError) -> OutputError:
    return OutputError(f"cannot {what} {path}: {exc.strerror or exc}")


def make_dir(path: Path) -> None:
    """``path`` as a directory (created with its parents), or a one-line error."""
    if path.exists() and not path.is_dir():
        raise InvalidArgument(f"{path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _oserror("create directory", path, exc) from None


def local_target(dst: Path, name: str | None = None) -> Target:
    """Where a copied file goes: ``dst``, or ``dst/name`` when ``dst`` is a directory."""
    if name is not None and dst.is_dir():
        dst = dst / name
    try:
        st = os.stat(dst)  # follows symlinks: the node the bytes would land in
    except FileNotFoundError:
        if dst.is_symlink():
            raise InvalidArgument(f"{dst} is a dangling symlink") from None
        return Target(dst, False, 0o666 & ~_umask())
    except OSError as exc:
        raise _oserror("write", dst, exc) from None
    if stat.S_ISREG(st.st_mode):
        return Target(Path(os.path.realpath(dst)), False, stat.S_IMODE(st.st_mode))
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return Target(dst, True)
    kind = (
        "a directory"
        if stat.S_ISDIR(st.st_mode)
        else "a block device"
        if stat.S_ISBLK(st.st_mode)
        else "a socket"
        if stat.S_ISSOCK(st.st_mode)
        else "not a regular file"
    )
    raise InvalidArgument(
        f"refusing to write to {dst}: it is {kind} (fs cp writes regular files, "
        "character devices and FIFOs)"
    )


def write_file(target: Target, data: bytes) -> None:
    """All of ``data`` into ``target`` (see the module docstring), or OutputError."""
    what = f"fs cp: {target.path}"
    if target.direct:
        try:
            fd = os.open(target.path, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            raise _oserror("open", target.path, exc) from None
        try:
            write_all(fd, data, what)
        finally:
            os.close(fd)
        return
    parent = target.path.parent
    make_dir(parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.path.name}.", dir=parent)
    except OSError as exc:
        raise _oserror("create a file in", parent, exc) from None
    try:
        try:
            write_all(fd, data, what)
            os.fchmod(fd, target.mode)
        finally:
            os.close(fd)  # close(2) can report a deferred write error: it raises here
        os.replace(tmp, target.path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _oserror("write", target.path, exc) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

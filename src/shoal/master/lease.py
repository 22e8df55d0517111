"""Who may serve a state directory: one master at a time, a standby waiting its turn.

Two masters on one state directory would both write its SQLite files and hand out
two rings: the state would mix. So a master holds an exclusive ``flock`` on
``<state_dir>/master.lock`` for as long as it serves, taken before it opens (or
migrates) anything there. A second master started on the same directory refuses in
one line naming the holder; with ``--standby`` it waits for the lock instead, and
takes over the moment the active master's process ends -- the kernel drops the
lock of a process that exits, however it exits, SIGKILL included. The standby binds
no port while it waits, so clients and workers given both addresses
(``--master URL,URL``) keep talking to the active one, and move to the standby when
the active one's port starts refusing connections.

This is the shared-storage design: both masters see the same state directory (one
host, or a shared filesystem with working ``flock`` such as NFSv4 or CephFS, where a
dead host's lock is released when its lease expires). No etcd is needed, and no
state is copied: the standby opens exactly what the active one committed.

Fencing: the holder writes its identity (a random token, pid, host, URL) into the
lock file, and checks on every membership tick that the file still names it. Where a
shared filesystem broke the lock (the active host lost its lease while still
running), the master that finds another's token there stops serving instead of
answering from a state it no longer owns.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import threading
import time
from typing import Any

from shoal.errors import InvalidArgument

LOCK_NAME = "master.lock"


class StateLock:
    """The exclusive lock on one state directory (see the module docstring)."""

    def __init__(self, state_dir: str) -> None:
        try:
            os.makedirs(state_dir, exist_ok=True)
        except OSError as exc:
            raise InvalidArgument(f"state directory {state_dir}: {exc.strerror}") from None
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, LOCK_NAME)
        self.token = secrets.token_hex(8)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock now, or raise InvalidArgument naming the master that holds it."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise InvalidArgument(
                    f"{self.state_dir} is served by another master "
                    f"({describe(holder(self.path))}); stop it, or pass --standby to take "
                    "over when it stops"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            if self._current(fd):
                self._took(fd)
                return
            os.close(fd)  # the file was replaced while we locked it: lock the new one

    def wait(self, stop: threading.Event) -> bool:
        """Block until the lock is ours (True) or ``stop`` is set (False). The wait is
        the kernel's (a blocking flock in a daemon thread), not a poll."""
        while not stop.is_set():
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            got = threading.Event()

            def block(fd: int = fd, got: threading.Event = got) -> None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except OSError:
                    return
                got.set()

            t = threading.Thread(target=block, name="shoal-master-standby", daemon=True)
            t.start()
            while not got.is_set() and not stop.is_set():
                # woken by whichever comes first; 1 s only bounds how late a stop is seen
                got.wait(1.0)
            if not got.is_set():
                # the thread may still get the lock later: the fd stays open with it,
                # and the process is on its way out (the kernel drops it at exit)
                return False
            if self._current(fd):
                self._took(fd)
                return True
            os.close(fd)  # locked a file that was replaced meanwhile: wait on the new one
        return False

    def _current(self, fd: int) -> bool:
        """Whether ``fd`` is still the file at ``path`` (not renamed away or replaced)."""
        try:
            at = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (at.st_dev, at.st_ino) == (mine.st_dev, mine.st_ino)

    def _took(self, fd: int) -> None:
        self._fd = fd
        self.publish(None)

    def publish(self, url: str | None) -> None:
        """Write this master's identity (and its URL once it listens) into the file."""
        assert self._fd is not None
        body = {
            "token": self.token,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "url": url,
            "since": time.time(),
        }
        data = json.dumps(body).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def still_ours(self) -> bool:
        """Whether the lock file is still the one this master locked and names it (see
        Fencing above)."""
        if self._fd is None or not self._current(self._fd):
            return False
        found = holder(self.path)
        return found is not None and found.get("token") == self.token

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def holder(path: str) -> dict[str, Any] | None:
    """What the lock file at ``path`` says of its holder; None when unreadable."""
    try:
        with open(path, "rb") as f:
            found = json.loads(f.read() or b"null")
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def describe(found: dict[str, Any] | None) -> str:
    if not found:
        return "holder unknown"
    where = f"pid {found.get('pid')} on {found.get('host')}"
    return f"{where}, {found['url']}" if found.get("url") else where


def in_use(state_dir: str) -> str | None:
    """A description of the master serving ``state_dir``, or None when none does."""
    path = os.path.join(state_dir, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return describe(holder(path))
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)

"""A bounded LRU of open file descriptors, so the read path never opens a file per call."""

from __future__ import annotations

import os
from collections import OrderedDict


class FdCache:
    """Open ``O_RDWR`` descriptors by path; the least recently used is closed past ``limit``.

    Descriptors are only ever used for pread/pwrite (never the file position), so one per
    path is shared by every caller.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._fds: OrderedDict[str, int] = OrderedDict()

    def get(self, path: str, *, create: bool = False) -> int:
        """The descriptor for ``path``, opening it if needed (OSError if it cannot)."""
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        self._fds[path] = fd
        while len(self._fds) > self.limit:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    def discard(self, path: str) -> None:
        """Close the descriptor for ``path`` if it is open."""
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        while self._fds:
            _, fd = self._fds.popitem()
            try:
                os.close(fd)
            except OSError:
                pass

    def __len__(self) -> int:
        return len(self._fds)

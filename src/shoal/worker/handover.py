"""Descriptors for local clients: which backing files a reply hands over, and the
directory location answers (LOCATE_DIR) kept between requests.

Every new reader process (each DataLoader worker, every epoch) asks for the same
directories again. Working an answer out costs a lookup per file; keeping it costs
memory. Answers are kept, already encoded, until the store reports any page added,
dropped or moved (``Handover.changes``) or the dataset's generation or manifest moves,
and the descriptors they hand over stay open in the worker for as long; so a warm
answer is one dictionary lookup and one ``sendmsg``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from shoal.core.types import Dataset
from shoal.proto import wire

#: encoded directory answers kept, in bytes (about 70 bytes per file)
DIR_CACHE_BYTES = 64 << 20
#: descriptors kept open for them, at most (then everything is dropped and rebuilt)
DIR_CACHE_FDS = 1024


class Handover:
    """Descriptors to hand to a local client: one per backing file, with its identity.
    Opened here and closed by the sender once sent."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.ids: list[list[int]] = []
        self.paths: list[str] = []
        self._slot: dict[str, int] = {}

    def slot(self, path: str) -> int | None:
        """The slot of ``path``'s descriptor, opening it if needed; None when full."""
        slot = self._slot.get(path)
        if slot is None:
            if len(self.fds) >= wire.MAX_FDS:
                return None
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            st = os.fstat(fd)
            slot = self._slot[path] = len(self.fds)
            self.fds.append(fd)
            self.ids.append([st.st_dev, st.st_ino])
            self.paths.append(path)
        return slot

    def abort(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


class DirAnswers:
    """Encoded LOCATE_DIR answers with their descriptors, valid while ``stamp()`` holds.

    ``stamp`` returns None when the store cannot say whether it changed: then nothing
    is kept. Descriptors are owned here (the sender must not close them) and closed
    when the answers they serve are dropped.
    """

    def __init__(self, stamp: Callable[[], Any], limit: int = DIR_CACHE_BYTES) -> None:
        self._stamp = stamp
        self._at: Any = None
        self._limit = limit
        self._bytes = 0
        #: (dataset, directory) -> (generation, manifest, encoded meta, paths)
        self._answers: OrderedDict[tuple[str, str | None], tuple[int, str, bytes, list[str]]] = (
            OrderedDict()
        )
        #: backing file -> open descriptor, shared by every answer naming it
        self._fds: dict[str, int] = {}
        self.hits = 0

    def get(self, ds: Dataset, directory: str | None) -> tuple[bytes, list[int]] | None:
        """The encoded answer and the descriptors to send with it, if still valid."""
        if not self._valid(ds):
            return None
        hit = self._answers.get((ds.name, directory))
        if hit is None or hit[0] != ds.generation or hit[1] != ds.manifest:
            return None
        self._answers.move_to_end((ds.name, directory))
        self.hits += 1
        return hit[2], [self._fds[p] for p in hit[3]]

    def put(self, ds: Dataset, directory: str | None, meta: bytes, h: Handover) -> list[int] | None:
        """Keep an answer worked out just now; the descriptors to send with it (owned
        here from now on), or None if it is not kept (the caller sends and closes
        ``h.fds`` as usual)."""
        if not self._valid(ds) or len(meta) > self._limit // 4:
            return None
        if len(self._fds) + len(h.paths) > DIR_CACHE_FDS:
            self.clear()
        fds = []
        for path, fd in zip(h.paths, h.fds, strict=True):
            have = self._fds.get(path)
            if have is None:
                self._fds[path] = have = fd
            else:
                os.close(fd)
            fds.append(have)
        h.fds.clear()
        key = (ds.name, directory)
        old = self._answers.pop(key, None)
        if old is not None:
            self._bytes -= len(old[2])
        self._answers[key] = (ds.generation, ds.manifest, meta, h.paths)
        self._bytes += len(meta)
        while self._bytes > self._limit and len(self._answers) > 1:
            _, dropped = self._answers.popitem(last=False)
            self._bytes -= len(dropped[2])
        return fds

    def _valid(self, ds: Dataset) -> bool:
        """Whether answers may be kept now; drops everything when the store moved."""
        if ds.policy.ttl:
            return False  # an answer must not outlive a page's expiry
        at = self._stamp()
        if at is None:
            self.clear()
            return False
        if at != self._at:
            self.clear()
            self._at = at
        return True

    def clear(self) -> None:
        self._answers.clear()
        self._bytes = 0
        fds = list(self._fds.values())
        self._fds.clear()
        for fd in fds:
            os.close(fd)

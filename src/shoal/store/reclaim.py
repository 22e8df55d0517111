"""Reclaiming data files a tier's index does not track, a slice at a time.

Bytes can be on disk that the index does not know: the index was deleted or lost
while the worker was stopped, or a process crashed between creating a data file and
committing its row. Opening a tier never scans its directories (a restart serves from
the index at once); instead the worker walks ``seg/`` and ``files/<xx>/`` in the
background after start, ``budget`` directory entries per step, and unlinks every data
file that is not referenced:

- ``seg/<id>.seg`` is referenced when the tier tracks segment ``id``;
- ``files/<xx>/<hash>.data`` when a large file version of the tier has that name.

Untracked files are unlinked, not re-indexed: a segment holds raw page bytes with no
header naming them, and a data file's name is a one-way hash of its (dataset, path,
version), so nothing could say what they hold. They are only a cache: what is read
again is fetched again.

Nothing being written is touched: only the process holding the tier's lock writes in
its directory, and every file it writes is referenced from the moment it is created
(a new segment is tracked before its first append, a large file's name is in the
catalog before its first page is written), so an unreferenced file is one nobody
writes. The check is made when the entry is reached, not against a snapshot, and on
the same thread as the tier's writes. Names that are not shoal's data files, and
anything that is not a regular file, are left alone. Referenced files of an older
version of shoal that are readable by others are made private (0600) on the way.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from collections.abc import Callable, Iterator

from shoal.store import layout


class Reclaimer:
    """A resumable walk of one tier's data directories (see the module docstring)."""

    def __init__(
        self,
        root: str,
        segment_tracked: Callable[[int], bool],
        name_tracked: Callable[[str], bool],
    ) -> None:
        self.root = root
        self._segment_tracked = segment_tracked
        self._name_tracked = name_tracked
        #: directories still to walk, relative to root
        self._dirs: deque[str] = deque([layout.SEG_DIR, layout.FILES_DIR])
        self._current: str = ""
        self._it: Iterator[os.DirEntry[str]] | None = None
        self._close_dir: Callable[[], None] | None = None
        #: untracked files unlinked, and their bytes
        self.files = 0
        self.bytes = 0
        #: tracked files whose mode was made private
        self.chmodded = 0

    def step(self, budget: int) -> bool:
        """Look at up to ``budget`` entries; False once the whole walk is done."""
        for _ in range(max(1, budget)):
            entry = self._next()
            if entry is None:
                return False
            self._visit(entry)
        return True

    def _next(self) -> os.DirEntry[str] | None:
        while True:
            if self._it is not None:
                entry = next(self._it, None)
                if entry is not None:
                    return entry
                self._close()
            if not self._dirs:
                return None
            self._current = self._dirs.popleft()
            try:
                it = os.scandir(os.path.join(self.root, self._current))
            except OSError:
                continue  # absent (nothing cached there yet) or unreadable
            self._it, self._close_dir = it, it.close

    def _close(self) -> None:
        if self._close_dir is not None:
            self._close_dir()
        self._close_dir = self._it = None

    def close(self) -> None:
        self._close()
        self._dirs.clear()

    def _visit(self, entry: os.DirEntry[str]) -> None:
        rel = os.path.join(self._current, entry.name)
        try:
            if self._current == layout.FILES_DIR:
                if entry.is_dir(follow_symlinks=False) and len(entry.name) == 2:
                    self._dirs.append(rel)
                return
            if not entry.is_file(follow_symlinks=False):
                return
            if self._current == layout.SEG_DIR:
                seg_id, dot, ext = entry.name.partition(".")
                if ext != "seg" or not dot or not seg_id.isdigit():
                    return
                tracked = self._segment_tracked(int(seg_id))
            else:
                if not entry.name.endswith(".data"):
                    return
                tracked = self._name_tracked(rel)
            st = entry.stat(follow_symlinks=False)
            if tracked:
                if stat.S_IMODE(st.st_mode) & 0o077:
                    os.chmod(entry.path, 0o600)
                    self.chmodded += 1
                return
            os.unlink(entry.path)
            self.files += 1
            self.bytes += min(st.st_size, st.st_blocks * 512)
        except OSError:
            return  # gone meanwhile, or not ours to change: leave it

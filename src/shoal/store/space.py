"""A tier's real room on its filesystem, and warnings aggregated per interval.

A tier's declared capacity is a ceiling, not a promise: the filesystem under it may be
smaller than declared, shared with others, or already full. :class:`FsSpace` turns
``statvfs`` into a second quota: the most bytes the tier can hold is what it holds now
plus what the filesystem has free, less a small reserve for the index and its WAL. The
tier takes the smaller of the two, so eviction starts at its watermarks of the real
room instead of after a storm of ``ENOSPC``.

``statvfs`` is one cheap syscall, but the put path is hot: between checks the ceiling
is kept as computed (the tier's own writes move ``used`` and the free space by the same
amount, so ``used + free`` stays put), and it is checked again after ``check_puts``
puts, after ``check_bytes`` of change in ``used``, on every put while the tier is
within ``check_bytes`` of the ceiling, and at once when a write fails with ``ENOSPC``.
Others filling the same filesystem are seen at the next check.

:class:`Aggregated` logs the first occurrence of a kind of event at once and then at
most one line per interval, with the count, instead of one line per event.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

MiB = 1 << 20

#: never plan to fill the filesystem's last bytes: the index, its WAL and the
#: filesystem's own metadata need some (a fraction of the filesystem, within bounds)
RESERVE_MIN = 256 * 1024
RESERVE_MAX = 256 * MiB
RESERVE_FRACTION = 1 / 64


class FsSpace:
    """The filesystem room of one tier directory, checked at most every N puts or bytes."""

    def __init__(
        self,
        root: str,
        *,
        check_puts: int = 64,
        check_bytes: int = 4 * MiB,
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    ) -> None:
        self.root = root
        self.check_puts = check_puts
        self.check_bytes = check_bytes
        self._statvfs = statvfs
        self._ceiling: int | None = None
        self._used_then = 0
        self._puts = 0
        #: the filesystem's size at the last check (0 = unknown)
        self.fs_size = 0

    def refresh(self, used: int) -> int | None:
        """Check the filesystem now; the new ceiling (None if statvfs failed)."""
        self._puts = 0
        self._used_then = used
        try:
            st = self._statvfs(self.root)
        except OSError:
            self._ceiling = None  # cannot tell: the declared capacity alone rules
            return None
        free = st.f_bavail * st.f_frsize
        self.fs_size = st.f_blocks * st.f_frsize
        reserve = min(RESERVE_MAX, max(RESERVE_MIN, int(self.fs_size * RESERVE_FRACTION)))
        self._ceiling = max(0, used + free - reserve)
        return self._ceiling

    def ceiling(self, used: int, need: int = 0) -> int | None:
        """The most bytes the tier can hold on its filesystem, checked again when due:
        every ``check_puts`` puts, every ``check_bytes`` of change, and on every put
        while the tier is within ``check_bytes`` of it (what the tier does not count,
        its index and WAL, other users of the filesystem, then matters)."""
        self._puts += 1
        if (
            self._ceiling is None
            or self._puts >= self.check_puts
            or abs(used - self._used_then) >= self.check_bytes
            or used + need + self.check_bytes > self._ceiling
        ):
            return self.refresh(used)
        return self._ceiling

    def last(self) -> int | None:
        """The ceiling as last checked (no syscall, no counting)."""
        return self._ceiling


class Aggregated:
    """One log line per interval per kind of event, with how many there were."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = logger
        self.interval = interval
        self._clock = clock
        #: kind -> (events not yet logged, when the last line was written, last detail)
        self._pending: dict[str, tuple[int, float, str]] = {}
        #: every event noted, per kind (for tests and metrics)
        self.counts: dict[str, int] = {}

    def note(self, kind: str, what: str, detail: str) -> None:
        """Count one event; log ``what`` with the count and the latest detail when due.

        ``what`` is a %-format taking (count, seconds, detail), e.g.
        ``"tier ssd: %d puts refused in %.0fs (last: %s)"``.
        """
        self.counts[kind] = self.counts.get(kind, 0) + 1
        now = self._clock()
        n, since, _ = self._pending.get(kind, (0, -self.interval, ""))
        n += 1
        if now - since >= self.interval:
            self.log.warning(what, n, min(self.interval, now - since), detail)
            self._pending[kind] = (0, now, detail)
        else:
            self._pending[kind] = (n, since, detail)

"""A cache tier's health: normal -> unstable -> down -> probing -> normal.

A tier whose disk fails (I/O errors on reads or writes, not a full disk, which eviction
handles) must stop costing every operation an error and a log line. The tier reports
each I/O outcome here and asks :meth:`TierHealth.usable` before touching its disk; a
tier that is not usable is skipped: its puts are refused and its reads are misses,
never errors, so the worker serves from the other tiers or from under storage.

- **normal**: the first error makes it *unstable*;
- **unstable**: still used; ``errors_to_down`` errors within ``window`` seconds make
  it *down*, ``successes_to_normal`` successes in a row make it *normal* again;
- **down**: skipped for ``down_for`` seconds (doubling after each failed probe, up to
  ``down_max``), then *probing*;
- **probing**: used again; the first success makes it *normal* (and resets the
  backoff), the first error makes it *down* again.

Pure bookkeeping with an injected clock: no I/O, no logging (the caller logs the
transitions :meth:`error`, :meth:`success` and :meth:`usable` return).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

NORMAL = "normal"
UNSTABLE = "unstable"
DOWN = "down"
PROBING = "probing"


class TierHealth:
    """The state machine above; each method returns the new state when it changed."""

    def __init__(
        self,
        *,
        errors_to_down: int = 10,
        window: float = 10.0,
        successes_to_normal: int = 100,
        down_for: float = 30.0,
        down_max: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.errors_to_down = errors_to_down
        self.window = window
        self.successes_to_normal = successes_to_normal
        self.down_for = down_for
        self.down_max = down_max
        self._clock = clock
        self.state = NORMAL
        self._errors: deque[float] = deque()
        self._successes = 0
        self._backoff = down_for
        self._until = 0.0
        #: operations skipped while down (for metrics and tests)
        self.skipped = 0

    @property
    def backoff(self) -> float:
        """Seconds a tier that goes down now stays down."""
        return self._backoff

    def usable(self) -> tuple[bool, str | None]:
        """Whether to touch the disk now, and the new state if this check moved it."""
        if self.state != DOWN:
            return True, None
        if self._clock() >= self._until:
            self.state = PROBING
            return True, PROBING
        self.skipped += 1
        return False, None

    def success(self) -> str | None:
        if self.state == NORMAL:
            return None
        if self.state == PROBING:
            return self._normal()
        if self.state == UNSTABLE:
            self._successes += 1
            if self._successes >= self.successes_to_normal:
                return self._normal()
        return None

    def error(self) -> str | None:
        now = self._clock()
        self._successes = 0
        if self.state == DOWN:
            return None
        if self.state == PROBING:
            self._backoff = min(self.down_max, self._backoff * 2)
            return self._down(now)
        self._errors.append(now)
        while self._errors and self._errors[0] <= now - self.window:
            self._errors.popleft()
        if len(self._errors) >= self.errors_to_down:
            return self._down(now)
        if self.state == NORMAL:
            self.state = UNSTABLE
            return UNSTABLE
        return None

    def _down(self, now: float) -> str:
        self.state = DOWN
        self._until = now + self._backoff
        self._errors.clear()
        return DOWN

    def _normal(self) -> str:
        self.state = NORMAL
        self._errors.clear()
        self._successes = 0
        self._backoff = self.down_for
        return NORMAL

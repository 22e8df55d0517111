"""The master's membership clock: monotonic seconds that stand still while the master's
own event loop is stalled.

A worker is expired when the master has not heard from it for ``worker_expiry``
seconds. A heartbeat that reached the master's socket while its loop was busy (a large
task report, a manifest written, a slow disk) cannot be read until the loop comes back,
and the first thing the loop does then may be a tick that counts the whole stall
against the worker: at 150k files the master expired its only worker mid-load so. This
clock counts only time in which the loop could have processed a heartbeat: it runs at
most ``grace`` seconds past the last time the loop showed it was alive
(:meth:`LoopClock.alive`, from the periodic tick), and a longer gap is left out once
the loop is back. A worker that is really gone still expires, one stall later.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["LoopClock"]


class LoopClock:
    """Callable like ``time.monotonic``; never goes backwards."""

    def __init__(self, grace: float, base: Callable[[], float] = time.monotonic) -> None:
        if grace <= 0:
            raise ValueError(f"grace must be positive, not {grace}")
        self._base = base
        self.grace = grace
        self._seen = base()
        #: seconds of stalls left out so far
        self.stalled = 0.0

    def __call__(self) -> float:
        now = self._base()
        return now - self.stalled - max(0.0, now - self._seen - self.grace)

    def alive(self) -> float:
        """The loop runs: fold the stall just past (its time beyond ``grace``) into the
        seconds left out; that stall's length."""
        now = self._base()
        gap = max(0.0, now - self._seen - self.grace)
        self.stalled += gap
        self._seen = now
        return gap

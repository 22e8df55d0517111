"""The disk tier's side of its health machine (:mod:`~shoal.store.health`).

A mixin of :class:`~shoal.store.disk.DiskTier`: the tier reports each I/O outcome here
and asks :meth:`HealthReporting._down` (only while ``_is_down`` is set, so that a
healthy tier's hot paths test one attribute) before it touches its disk. One log line
per transition, never one per operation.
"""

from __future__ import annotations

import logging

from shoal.store.health import DOWN, NORMAL, UNSTABLE, TierHealth

log = logging.getLogger("shoal.store.disk")


class HealthReporting:
    """Health transitions of a tier; the attributes below are the tier's."""

    name: str
    _health: TierHealth
    #: mirrors of the health state the hot paths test (one attribute, no call)
    _is_down: bool
    _unwell: bool

    def _down(self) -> bool:
        """True while the tier is down: skip it (reads miss, puts are refused). The hot
        paths call it only when ``_is_down`` is set."""
        ok, moved = self._health.usable()
        if moved:
            log.info("tier %s: trying its disk again", self.name)
        self._is_down = not ok
        return not ok

    def _io_error(self) -> None:
        moved = self._health.error()
        self._unwell, self._is_down = True, self._health.state == DOWN
        if moved == DOWN:
            log.warning(
                "tier %s: its disk keeps failing: skipped (reads miss, puts refused) "
                "for %.0fs, then tried again",
                self.name,
                self._health.backoff,
            )
        elif moved == UNSTABLE:
            log.warning("tier %s: I/O errors on its disk: unstable", self.name)

    def _io_ok(self) -> None:
        if self._health.success() == NORMAL:
            self._unwell = False
            log.info("tier %s: its disk works again: back to normal", self.name)

    @property
    def health(self) -> str:
        """normal, unstable, down or probing."""
        return self._health.state

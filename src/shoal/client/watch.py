"""The liveness watch of one long request: while a request to a worker runs longer
than its pool's ``probe_after``, the worker is probed (a HELLO on a fresh connection);
a worker that leaves ``PROBE_MISSES`` probes in a row unanswered is taken to be hung
and the request's deadline ends at once, so the caller fails over instead of waiting
out a 30 s deadline. A worker that answers but is busy fetching keeps the request
going, probed again every ``PROBE_EVERY``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.client.conn import Pool

#: the pause between probes while a live worker is still at the request
PROBE_EVERY = 2.0
#: probes in a row without a HELLO before a worker is taken to be hung (one slow
#: HELLO under load was seen to fail a stat through the mount)
PROBE_MISSES = 2


class Watch:
    """Probes the worker's liveness while one request to it runs longer than the pool's
    probe_after; ends the request's deadline at once when the worker does not answer."""

    def __init__(self, pool: Pool, cm: asyncio.Timeout) -> None:
        self.pool = pool
        self.cm = cm
        self.hung = False
        self.done = False
        #: probes in a row the worker did not answer
        self.misses = 0
        self.loop = asyncio.get_running_loop()
        self.task: asyncio.Task[None] | None = None
        self.handle = self.loop.call_later(pool.probe_after, self._start)

    def _start(self) -> None:
        if not self.done:
            self.task = self.loop.create_task(self._probe())

    async def _probe(self) -> None:
        alive = await self.pool.alive()
        if self.done:
            return
        if alive:
            self.misses = 0
            self.handle = self.loop.call_later(PROBE_EVERY, self._start)
        elif self.misses + 1 < PROBE_MISSES:
            # one slow HELLO is a loaded machine as often as a hung worker: ask again
            self.misses += 1
            self._start()
        else:
            self.hung = True
            self.cm.reschedule(self.loop.time())  # the request's deadline ends now

    def stop(self) -> None:
        self.done = True
        self.handle.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()

"""The watchers of ``GET /api/v1/watch`` (the contract is in :mod:`shoal.proto.control`)
and the wait a finished job makes for them.

Kept in memory only: a restarted master counts a watcher again from its next poll.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shoal.core import jobs as J
from shoal.errors import InvalidArgument
from shoal.master.jobstate import Job

log = logging.getLogger("shoal.master.jobs")

#: watchers kept before those long silent are forgotten
MAX_WATCHERS = 1000
#: watchers heard from within a minute that the master keeps at most (memory bound)
HARD_LIMIT = 10_000


class Watchers:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        #: watcher id -> what it last acknowledged, and when it was last heard from
        self.table: dict[str, J.Watcher] = {}

    def begin(self, wid: str, since: int) -> None:
        """A poll with ``since``: the watcher has applied every change up to it."""
        now = self._clock()
        old = self.table.get(wid)
        if old is None and len(self.table) >= MAX_WATCHERS:
            for k, w in list(self.table.items()):
                if not w.waiting and now - w.seen > 6 * J.WATCH_RECENT:
                    del self.table[k]
            if len(self.table) >= HARD_LIMIT:
                raise InvalidArgument(f"too many watchers ({HARD_LIMIT}); try again later")
        self.table[wid] = J.Watcher(since, now, (old.waiting if old else 0) + 1)

    def end(self, wid: str) -> None:
        """The poll was answered (the watcher was heard from now)."""
        w = self.table.get(wid)
        if w is not None:
            self.table[wid] = J.Watcher(w.since, self._clock(), max(0, w.waiting - 1))

    def holding(self, job: Job, now: float) -> bool:
        """Whether a job whose tasks are all done still waits for watchers to apply the
        generation it produced; after WATCH_GRACE it stops waiting, with a warning."""
        gen = int(job.listed.get("generation", 0))
        late = J.lagging(self.table, gen, now) if gen else []
        if not late:
            return False
        began = float(job.listed.setdefault("watch_wait", now))
        if now - began < J.WATCH_GRACE:
            return True
        log.warning(
            "job %s: watchers %s did not acknowledge datasets generation %d within %.0fs;"
            " reporting it done",
            job.id,
            ", ".join(late),
            gen,
            J.WATCH_GRACE,
        )
        return False

"""The last few rings before the current one, and who cached what when each ended.

When the ring moves (a worker joins, is drained, expires), a key's new owner does not
have its files yet; the previous owner does. The master keeps the member lists of the
last :data:`KEEP` rings (for :data:`WINDOW` seconds) with, for each member, the
datasets it held cached files of when that ring ended (from its heartbeats), and
serves them with the ring (``history`` in ``GET /api/v1/ring``). A new owner that
misses asks those previous owners for the pages before it goes to under storage
(:mod:`shoal.worker.peers`); a member with nothing of the dataset is never asked, so a
cold cluster whose workers join one by one costs no peer round trips.

Kept in memory only: after a master restart the history starts empty (new owners
then fetch from under storage, as before).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shoal.core.membership import WorkerRecord

#: earlier rings kept
KEEP = 4
#: seconds an earlier ring is served after it ended
WINDOW = 1800.0


@dataclass(frozen=True)
class PastRing:
    epoch: int
    members: tuple[str, ...]
    #: member -> datasets it held cached files of when this ring ended
    holders: Mapping[str, tuple[str, ...]]
    #: when it ended, on the master's clock
    ended_at: float


def _held(rec: WorkerRecord) -> tuple[str, ...]:
    ds = rec.stats.get("datasets") if isinstance(rec.stats, Mapping) else None
    if not isinstance(ds, Mapping):
        return ()
    out = []
    for name, st in ds.items():
        n = st.get("cached_files") if isinstance(st, Mapping) else None
        if isinstance(n, int) and n > 0:
            out.append(str(name))
    return tuple(sorted(out))


class RingHistory:
    def __init__(self, epoch: int, members: Iterable[str]) -> None:
        self._epoch = epoch
        self._members = tuple(sorted(members))
        self._past: deque[PastRing] = deque(maxlen=KEEP)

    def moved(
        self, epoch: int, members: Iterable[str], records: Iterable[WorkerRecord], now: float
    ) -> None:
        """The ring is now ``members`` at ``epoch``: remember the one it replaces (an
        epoch bump that kept the members, an address change, adds nothing)."""
        new = tuple(sorted(members))
        if new != self._members and self._members:
            by_id = {r.info.id: r for r in records}
            holders = {m: _held(by_id[m]) for m in self._members if m in by_id}
            self._past.appendleft(PastRing(self._epoch, self._members, holders, now))
        self._members = new
        self._epoch = epoch

    def body(self, now: float, reachable: set[str]) -> list[dict[str, Any]]:
        """The ``history`` of a ring answer, newest first: earlier rings younger than
        WINDOW with, per member still reachable (live or draining), what it held."""
        return [
            {
                "epoch": p.epoch,
                "age_s": round(now - p.ended_at, 3),
                "workers": list(p.members),
                "holders": {m: list(ds) for m, ds in p.holders.items() if m in reachable and ds},
            }
            for p in self._past
            if now - p.ended_at <= WINDOW
        ]

"""Worker membership as a pure state machine: events in, new state and instructions out.

Workers *register* (with their address and tiers), *heartbeat* (with their latest
stats) and are *expired* by :meth:`Membership.tick` once silent for longer than
``expiry`` seconds. A re-register revives an expired worker. Any change to the set of
live workers -- or to the address of a live one, which clients read from the ring --
bumps the ring epoch, so clients holding an older ring refresh it.

Scale-in: an admin *drains* a live worker (:meth:`Membership.drain`): it leaves the
ring at once (an epoch bump: readers and new owners move on) but keeps heartbeating
and serving while it hands its cached files to their next owners, and it *leaves*
(:meth:`Membership.leave`) once they have them. A drained worker that registers again
is live again.

Nothing here does I/O, sleeps or reads a clock: the caller passes ``now`` (any
monotonic float) and carries out the returned instructions (persist a worker, persist
the epoch, tell a worker to register again). Tests drive it with plain calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from shoal.errors import InvalidArgument

WorkerState = Literal["live", "expired", "draining", "left"]
LIVE: WorkerState = "live"
EXPIRED: WorkerState = "expired"
#: out of the ring, still serving while it hands its files over
DRAINING: WorkerState = "draining"
#: drained: out of the ring for good (until it registers again)
LEFT: WorkerState = "left"


@dataclass(frozen=True)
class TierDecl:
    """A cache tier as a worker declares it when registering."""

    name: str
    path: str
    capacity: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "capacity": self.capacity}


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker tells the master about itself when it registers."""

    id: str
    host: str
    port: int
    #: Unix socket path for same-host clients ("" = none)
    uds: str = ""
    #: host identity for short-circuit reads (Kubernetes: the node name)
    node: str = ""
    tiers: tuple[TierDecl, ...] = ()
    #: its TCP port speaks TLS (``--tls-cert``): clients and peers reach it over TLS
    tls: bool = False

    def __post_init__(self) -> None:
        if not self.id or "/" in self.id or len(self.id) > 256 or self.id != self.id.strip():
            raise InvalidArgument(f"invalid worker id {self.id!r}: 1-256 characters, no '/'")
        if not 0 <= self.port <= 65535:
            raise InvalidArgument(f"invalid worker port {self.port}: use 0..65535")

    @property
    def address(self) -> tuple[str, int, str, str, bool]:
        """The fields clients read from the ring; a change here needs a new epoch."""
        return (self.host, self.port, self.uds, self.node, self.tls)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "port": self.port,
            "uds": self.uds,
            "node": self.node,
            "tiers": [t.to_dict() for t in self.tiers],
            "tls": self.tls,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkerInfo:
        return cls(
            id=d["id"],
            host=d["host"],
            port=int(d["port"]),
            uds=d.get("uds") or "",
            node=d.get("node") or "",
            tiers=tuple(
                TierDecl(t["name"], t.get("path", ""), int(t["capacity"]))
                for t in d.get("tiers") or ()
            ),
            tls=d.get("tls") is True,
        )


@dataclass(frozen=True)
class WorkerRecord:
    """The master's view of one worker."""

    info: WorkerInfo
    state: WorkerState
    #: ``now`` of the last register or heartbeat, on the caller's clock
    last_heartbeat: float
    #: the latest stats the worker sent (free-form JSON; readers tolerate missing keys)
    stats: Mapping[str, Any] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.state == LIVE

    @property
    def serving(self) -> bool:
        """Reachable on the data path: live, or draining (not in the ring)."""
        return self.state in (LIVE, DRAINING)


# --- instructions -------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerRegistered:
    """A worker's record changed in a way that should be persisted right away."""

    worker_id: str


@dataclass(frozen=True)
class WorkerHeartbeat:
    """A live worker's last-heartbeat time and stats changed (persisting may be batched)."""

    worker_id: str


@dataclass(frozen=True)
class WorkerExpired:
    """A worker missed heartbeats for longer than the expiry and left the ring."""

    worker_id: str


@dataclass(frozen=True)
class EpochBumped:
    """The ring changed; persist the new epoch before answering with it."""

    epoch: int


@dataclass(frozen=True)
class ReRegister:
    """The heartbeat came from a worker the master does not count as live."""

    worker_id: str


Instruction = WorkerRegistered | WorkerHeartbeat | WorkerExpired | EpochBumped | ReRegister


@dataclass(frozen=True)
class Transition:
    """The outcome of one event."""

    instructions: tuple[Instruction, ...]
    #: the ring epoch after the event
    epoch: int
    #: False when a heartbeat came from an unknown or expired worker
    known: bool = True

    @property
    def ring_changed(self) -> bool:
        return any(isinstance(i, EpochBumped) for i in self.instructions)


class Membership:
    """Registered workers, their liveness and the ring epoch."""

    def __init__(self, expiry: float, epoch: int = 0, workers: Iterable[WorkerRecord] = ()) -> None:
        if expiry <= 0:
            raise InvalidArgument(f"invalid worker expiry {expiry}: must be > 0 seconds")
        if epoch < 0:
            raise InvalidArgument(f"invalid ring epoch {epoch}: must be >= 0")
        self.expiry = expiry
        self._epoch = epoch
        self._workers: dict[str, WorkerRecord] = {w.info.id: w for w in workers}

    @property
    def epoch(self) -> int:
        return self._epoch

    def get(self, worker_id: str) -> WorkerRecord | None:
        return self._workers.get(worker_id)

    def records(self) -> list[WorkerRecord]:
        """Every known worker, live or expired, ordered by id."""
        return [self._workers[k] for k in sorted(self._workers)]

    def live_ids(self) -> list[str]:
        """The ids that make up the ring (sorted), for ``Ring.build(epoch, ...)``."""
        return sorted(k for k, w in self._workers.items() if w.live)

    def live(self) -> list[WorkerRecord]:
        return [w for w in self.records() if w.live]

    # --- events ----------------------------------------------------------------------------

    def register(self, info: WorkerInfo, now: float) -> Transition:
        """A worker (re)registers: it is live from now on, with this address and tiers."""
        old = self._workers.get(info.id)
        stats = old.stats if old is not None else {}
        self._workers[info.id] = WorkerRecord(info, LIVE, now, stats)
        out: list[Instruction] = [WorkerRegistered(info.id)]
        if old is None or not old.live or old.info.address != info.address:
            out.append(self._bump())
        return Transition(tuple(out), self._epoch)

    def heartbeat(
        self, worker_id: str, now: float, stats: Mapping[str, Any] | None = None
    ) -> Transition:
        """A live worker checks in; ``stats`` (when given) replaces its previous stats.

        A heartbeat from an unknown or expired worker changes nothing and asks the
        worker to register again: its address, tiers and cache may have changed while
        the master was not counting it.
        """
        old = self._workers.get(worker_id)
        if old is None or not old.serving:
            return Transition((ReRegister(worker_id),), self._epoch, known=False)
        new = replace(old, last_heartbeat=max(now, old.last_heartbeat))
        if stats is not None:
            new = replace(new, stats=stats)
        self._workers[worker_id] = new
        return Transition((WorkerHeartbeat(worker_id),), self._epoch)

    def drain(self, worker_id: str) -> Transition:
        """An admin asks a live worker to leave: it is out of the ring now (one epoch
        bump) and keeps serving until :meth:`leave`. ``known`` is False for a worker
        that is not live or draining; draining one twice changes nothing."""
        old = self._workers.get(worker_id)
        if old is None or not old.serving:
            return Transition((), self._epoch, known=False)
        if old.state == DRAINING:
            return Transition((), self._epoch)
        self._workers[worker_id] = replace(old, state=DRAINING)
        return Transition((WorkerRegistered(worker_id), self._bump()), self._epoch)

    def leave(self, worker_id: str) -> Transition:
        """A draining worker handed its files over: it is gone (not in the ring, not
        reachable). The ring does not change: it left it when the drain began."""
        old = self._workers.get(worker_id)
        if old is None or old.state != DRAINING:
            return Transition((), self._epoch, known=False)
        self._workers[worker_id] = replace(old, state=LEFT)
        return Transition((WorkerRegistered(worker_id),), self._epoch)

    def tick(self, now: float) -> Transition:
        """Expire every live (or draining) worker silent for longer than ``expiry``; one
        epoch bump when the ring lost any."""
        out: list[Instruction] = []
        ring_changed = False
        for wid in sorted(self._workers):
            w = self._workers[wid]
            if w.serving and now - w.last_heartbeat > self.expiry:
                ring_changed = ring_changed or w.live
                self._workers[wid] = replace(w, state=EXPIRED)
                out.append(WorkerExpired(wid))
        if ring_changed:
            out.append(self._bump())
        return Transition(tuple(out), self._epoch)

    def _bump(self) -> EpochBumped:
        self._epoch += 1
        return EpochBumped(self._epoch)

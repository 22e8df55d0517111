"""The master's operations, independent of HTTP: datasets, membership, ring, report.

:class:`MasterService` owns the durable state (:mod:`shoal.master.state`) and the
membership state machine (:mod:`shoal.core.membership`) and carries out the
instructions the state machine returns. Registrations, expiries and epoch bumps are
committed before the caller answers; heartbeats only mark the worker dirty and are
written in batches by :meth:`MasterService.flush` (called by the periodic tick), since
a lost heartbeat time costs nothing: a restarted master gives every worker a fresh
expiry period anyway.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from shoal.config import MasterSettings
from shoal.core.membership import (
    DRAINING,
    LIVE,
    EpochBumped,
    Membership,
    Transition,
    WorkerExpired,
    WorkerHeartbeat,
    WorkerRecord,
    WorkerRegistered,
)
from shoal.core.ring import DEFAULT_VNODES, Ring
from shoal.core.types import Dataset
from shoal.errors import InvalidArgument, NotFound, PermissionDenied
from shoal.master import validate
from shoal.master.jobs import JobManager
from shoal.master.jobstate import JobState
from shoal.master.loopclock import LoopClock
from shoal.master.metrics import Snapshot
from shoal.master.report import build_report
from shoal.master.ringhistory import RingHistory
from shoal.master.state import MasterState
from shoal.proto.control import (
    HeartbeatResponse,
    RegisterResponse,
    ReportResponse,
    RingResponse,
)

log = logging.getLogger("shoal.master.service")


class MasterService:
    """Datasets and worker membership; ``clock`` is monotonic seconds (injectable)."""

    def __init__(
        self,
        settings: MasterSettings,
        state: MasterState,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # MasterSettings validates itself (positive intervals, expiry > heartbeat)
        self.settings = settings
        self.state = state
        self._clock = clock
        now = clock()
        stored = state.load_workers()
        self.membership = Membership(
            settings.worker_expiry,
            epoch=state.ring_epoch,
            workers=[w.record(now) for w in stored],
        )
        self._dirty: set[str] = set()
        #: the rings before this one, for new owners to find moved files (ringhistory)
        self.history = RingHistory(self.membership.epoch, self.membership.live_ids())
        #: registrations refused because the id is bound to another key
        self.refused_registrations = 0
        self.jobs = JobManager(
            JobState(settings.state_dir),
            self.get_dataset,
            self.ring,
            self.state.set_manifest,
            generation=lambda: self.state.datasets_generation,
        )
        # late-bound: the job routes install the watchers' wake-up after this
        self.state.on_generation = lambda: self.jobs.on_generation()
        if stored:
            log.info(
                "reloaded %d workers (%d live) at ring epoch %d",
                len(stored),
                len(self.membership.live_ids()),
                self.membership.epoch,
            )

    # --- datasets ------------------------------------------------------------------------

    def create_dataset(self, body: Any) -> Dataset:
        ds = self.state.create_dataset(validate.parse_dataset(body, self.settings.file_roots))
        log.info("dataset %s created with %d mounts", ds.name, len(ds.mounts))
        return ds

    def get_dataset(self, name: str) -> Dataset:
        return self.state.get_dataset(name)

    def list_datasets(self) -> list[Dataset]:
        return self.state.list_datasets()

    def update_dataset(self, name: str, body: Any) -> Dataset:
        changes = validate.parse_policy_patch(body)
        current = self.state.get_dataset(name)
        policy = validate.apply_policy(current.policy, changes)
        ds = self.state.update_policy(name, policy)
        log.info("dataset %s policy updated to generation %d", name, ds.generation)
        return ds

    def delete_dataset(self, name: str) -> None:
        self.state.delete_dataset(name)
        self.jobs.dataset_deleted(name)
        log.info("dataset %s deleted", name)

    # --- workers -------------------------------------------------------------------------

    def register(self, body: Any) -> RegisterResponse:
        info = validate.parse_register(body)
        self._check_worker_key(info.id, body)
        prev = self.membership.get(info.id)
        # a live worker registers only when its process is new (a running one is told
        # to re-register only after the master restarted or expired it)
        restarted = prev is not None and prev.state == LIVE
        self._apply(self.membership.register(info, self._clock()))
        try:
            self.jobs.worker_joined(info.id, restarted)
        except Exception:  # job bookkeeping must never refuse a registration
            log.exception("worker %s: could not hand back its share of recent loads", info.id)
        log.info(
            "worker %s registered at %s:%d (node %s); ring epoch %d",
            info.id,
            info.host,
            info.port,
            info.node,
            self.membership.epoch,
        )
        return {
            "epoch": self.membership.epoch,
            "heartbeat_interval": self.settings.heartbeat_interval,
            "datasets_generation": self.state.datasets_generation,
        }

    def _check_worker_key(self, worker_id: str, body: dict[str, Any]) -> None:
        """A worker id is bound to the key it first registered with (trust on first use
        until the cluster issues credentials): a registration of that id with another
        key, or none once one is bound, is refused before it can move the ring."""
        key = body.get("key")
        if key is not None and (not isinstance(key, str) or not 16 <= len(key) <= 256):
            raise InvalidArgument("worker registration: 'key' must be a string of 16-256 chars")
        digest = hashlib.sha256((key or "").encode()).hexdigest()
        if not self.state.bind_worker_key(worker_id, digest):
            self.refused_registrations += 1
            log.warning("refused a registration of worker id %s: its key does not match", worker_id)
            raise PermissionDenied(
                f"worker id {worker_id!r} is registered with another key: a worker keeps its "
                "key in its work directory (identity); start it from that directory, or "
                "give the new worker a directory of its own"
            )

    def heartbeat(self, worker_id: str, body: Any) -> HeartbeatResponse:
        stats = validate.parse_heartbeat(body)
        # expire first, so a heartbeat arriving after the expiry is not counted as live
        self._apply(self.membership.tick(self._clock()))
        t = self.membership.heartbeat(worker_id, self._clock(), stats)
        self._apply(t)
        if not t.known:
            log.info(
                "heartbeat from unknown or expired worker %s: asking it to register", worker_id
            )
        rec = self.membership.get(worker_id)
        draining = t.known and rec is not None and rec.state == DRAINING
        left = False
        if draining and isinstance(stats, dict) and stats.get("drained") is True:
            self._apply(self.membership.leave(worker_id))
            log.info("worker %s drained: its files are with their next owners", worker_id)
            draining, left = False, True
        out: HeartbeatResponse = {
            "epoch": self.membership.epoch,
            "datasets_generation": self.state.datasets_generation,
            "known": t.known,
        }
        if draining:
            out["draining"] = True
        if left:
            out["left"] = True
        return out

    def drain(self, worker_id: str, body: Any = None, admin: bool = True) -> dict[str, Any]:
        """Take a live worker out of the ring; it hands its cached files to their next
        owners (shoal.worker.drain), then leaves. NotFound for a worker that is not
        live or draining. A worker may drain itself (its SIGTERM with a drain timeout)
        with a worker token and its identity key in ``body``; only an admin drains
        another worker."""
        if not admin:
            key = body.get("key") if isinstance(body, dict) else None
            if not isinstance(key, str) or not self.state.worker_key_matches(
                worker_id, hashlib.sha256(key.encode()).hexdigest()
            ):
                raise PermissionDenied(f"only an admin, or worker {worker_id!r} itself, drains it")
        self._apply(self.membership.tick(self._clock()))
        if self.membership.live_ids() == [worker_id]:
            raise InvalidArgument(
                f"worker {worker_id!r} is the only live worker: its files would have no owner"
            )
        t = self.membership.drain(worker_id)
        if not t.known:
            rec = self.membership.get(worker_id)
            state = rec.state if rec is not None else "unknown"
            raise NotFound(f"no live worker {worker_id!r} to drain (it is {state})")
        self._apply(t)
        if t.ring_changed:
            log.info("draining worker %s: out of the ring at epoch %d", worker_id, t.epoch)
        return {"id": worker_id, "state": DRAINING, "epoch": self.membership.epoch}

    def loop_alive(self) -> None:
        """The master's loop runs (the periodic tick): with a :class:`LoopClock`, a
        stall just past is left out of every worker's silence (logged when it was)."""
        if isinstance(self._clock, LoopClock):
            gap = self._clock.alive()
            span = gap + self._clock.grace
            # a short one is the noise of a loaded host: logged only when it would have
            # cost a worker half its expiry
            if gap > 0 and span >= self.membership.expiry / 2:
                log.warning(
                    "master loop stalled (no tick for %.3gs): not counted against the "
                    "workers' heartbeats",
                    span,
                )

    def tick(self) -> None:
        """Expire silent workers and write batched heartbeats; called periodically."""
        self._apply(self.membership.tick(self._clock()))
        self.flush()
        self.jobs.tick()

    def flush(self) -> None:
        """Persist the workers whose heartbeats have not been written yet."""
        if not self._dirty:
            return
        rows = [r for r in map(self.membership.get, sorted(self._dirty)) if r is not None]
        self._dirty.clear()
        self.state.save_workers(self._with_wall(rows))

    def _apply(self, t: Transition) -> None:
        """Carry out a transition's instructions: persist now, or mark for the next flush."""
        urgent: list[WorkerRecord] = []
        epoch: int | None = None
        for ins in t.instructions:
            if isinstance(ins, WorkerHeartbeat):
                self._dirty.add(ins.worker_id)
            elif isinstance(ins, WorkerRegistered | WorkerExpired):
                rec = self.membership.get(ins.worker_id)
                if rec is not None:
                    urgent.append(rec)
                    self._dirty.discard(ins.worker_id)
                if isinstance(ins, WorkerExpired):
                    log.warning(
                        "worker %s expired after %.3gs without a heartbeat",
                        ins.worker_id,
                        self.membership.expiry,
                    )
            elif isinstance(ins, EpochBumped):
                epoch = ins.epoch
                self.history.moved(
                    ins.epoch, self.membership.live_ids(), self.membership.records(), self._clock()
                )
        if urgent or epoch is not None:
            self.state.save_workers(self._with_wall(urgent), epoch)
        if epoch is not None:
            log.info("ring epoch %d: %d live workers", epoch, len(self.membership.live_ids()))

    def _with_wall(self, rows: list[WorkerRecord]) -> list[tuple[WorkerRecord, float]]:
        """Pair each record with its last heartbeat on the wall clock, for the state file."""
        offset = time.time() - self._clock()
        return [(r, r.last_heartbeat + offset) for r in rows]

    # --- views ---------------------------------------------------------------------------

    def ring(self) -> Ring:
        self._apply(self.membership.tick(self._clock()))
        return Ring.build(self.membership.epoch, self.membership.live_ids(), DEFAULT_VNODES)

    def ring_body(self) -> RingResponse:
        ring = self.ring()
        live = {r.info.id: r.info for r in self.membership.live()}
        serving = {r.info.id: r.info for r in self.membership.records() if r.serving}
        return {
            "epoch": ring.epoch,
            "vnodes": ring.vnodes,
            "workers": [
                {
                    "id": wid,
                    "host": live[wid].host,
                    "port": live[wid].port,
                    "uds": live[wid].uds,
                    "node": live[wid].node,
                    "tls": live[wid].tls,
                }
                for wid in ring.members
            ],
            # lets a client skip fetching the datasets when none changed
            "datasets_generation": self.state.datasets_generation,
            # earlier rings and draining workers: where new owners find moved files
            "history": self.history.body(self._clock(), set(serving)),
            "peers": [
                {
                    "id": wid,
                    "host": i.host,
                    "port": i.port,
                    "uds": i.uds,
                    "node": i.node,
                    "tls": i.tls,
                }
                for wid, i in sorted(serving.items())
                if wid not in live
            ],
        }

    def report(self) -> ReportResponse:
        now = self._clock()
        self._apply(self.membership.tick(now))
        names = [d.name for d in self.state.list_datasets()]
        report = build_report(self.membership.records(), names, now, self.membership.epoch)
        for d in report["datasets"]:
            man = self.jobs.manifest(d["name"]) if d["name"] in names else None
            extra: dict[str, Any] = d  # type: ignore[assignment]
            if man is not None:
                total = man.total_bytes
                extra["store_files"] = len(man)
                extra["store_bytes"] = total
                extra["cached_pct"] = (
                    min(100.0, 100.0 * d["cached_bytes"] / total) if total else 100.0
                )
            else:
                extra["store_files"] = extra["store_bytes"] = None
                extra["cached_pct"] = None
        return report

    def snapshot(self) -> Snapshot:
        """What a /metrics scrape reads."""
        self._apply(self.membership.tick(self._clock()))
        names = [d.name for d in self.state.list_datasets()]
        return Snapshot(self.membership.records(), names, self.membership.epoch)

    def close(self) -> None:
        self.flush()
        self.state.close()
        self.jobs.state.close()

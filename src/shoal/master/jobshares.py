"""A lost worker's share of a job, and a returning worker's share handed back.

A mixin of :class:`~shoal.master.jobs.JobManager` (its state and callbacks are the
manager's). A task whose lease is missed is handed out again, and given up after
:data:`MAX_ATTEMPTS` misses; a lost worker's load items are re-planned onto the owners
the ring names now; a worker that comes back gets ``handback`` tasks for the loads of
the last :data:`HANDBACK_WINDOW` seconds that went elsewhere while it was gone (the
job reopens until it has them), so that a finished load leaves every file where
readers look. The decisions about one task are the pure functions of
:mod:`shoal.core.jobs`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shoal.core import jobs as J
from shoal.core.manifest import Manifest
from shoal.core.ring import Ring
from shoal.core.types import Dataset
from shoal.errors import DatasetNotFound
from shoal.master.jobstate import Job, JobState, Task

log = logging.getLogger("shoal.master.jobs")

#: missed leases after which a task is given up (its files, or its job, fail)
MAX_ATTEMPTS = 3
#: a load finished this long ago still hands a returning worker its share back
HANDBACK_WINDOW = 600.0


def job_replicas(job: Job, ds: Dataset) -> int:
    return job.spec.replicas or ds.policy.replicas


def placed_locally(ds: Dataset) -> bool:
    return ds.policy.placement == "local"


class WorkerShares:
    """Lease misses, lost workers and returning workers; the attributes are the
    manager's."""

    state: JobState
    _dataset: Callable[[str], Dataset]
    _ring: Callable[[], Ring]
    _clock: Callable[[], float]
    _missed: dict[int, int]
    on_tasks: Callable[[], None]

    def _job(self, jid: str) -> Job:
        raise NotImplementedError  # the manager's

    def manifest(self, dataset: str) -> Manifest | None:
        raise NotImplementedError  # the manager's

    def _lease_missed(self, t: Task) -> None:
        """Hand a task out again; after MAX_ATTEMPTS missed leases give up on it, so a
        task that can never finish (a result the master refuses) fails its job instead
        of running forever."""
        n = self._missed[t.id] = self._missed.get(t.id, 0) + 1
        if n < MAX_ATTEMPTS:
            log.warning("task %d on %s missed its lease; handing it out again", t.id, t.worker)
            t.apply(J.abandoned(t.machine()))
            self.state.put_task(t)
            return
        why = f"task {t.id} on {t.worker} missed its lease {n} times"
        log.error("%s: giving up on it", why)
        t.apply(J.given_up(t.machine(), why, t.kind == J.T_LOAD))
        self.state.put_task(t)
        if t.kind == J.T_LIST:
            job = self._job(t.job)
            job.state, job.error, job.finished = J.FAILED, why, self._clock()
            self.state.put_job(job)

    def _reassign(self, t: Task, ring: Ring) -> set[str]:
        """Move a lost worker's task; the workers its load items went to."""
        job = self._job(t.job)
        to: set[str] = set()
        if t.kind == J.T_LOAD:
            ds = self._dataset(job.spec.dataset)
            moved = J.replan(ds.name, t.items, ring, job_replicas(job, ds), placed_locally(ds))
            self.state.add_tasks(job.id, J.T_LOAD, moved)
            t.state = J.T_REASSIGNED
            to = {w for w, _ in moved}
        elif t.kind == J.T_LIST:
            t.apply(J.abandoned(t.machine()))
            t.worker = ring.members[0]
        else:
            # a lost worker's cache is gone with it (free, invalidate), and a handback's
            # files are where the job first put them
            t.state = J.T_DONE
        self.state.put_task(t)
        return to

    # -- workers coming back ----------------------------------------------------------

    def worker_joined(self, wid: str, restarted: bool) -> None:
        """A worker registered. ``restarted``: it was live, so this is a new process and
        the attempts its old one was running are gone; run them again now rather than
        after their leases. Then hand it back its share of recent loads that were
        reassigned away from it while it was gone."""
        now = self._clock()
        if restarted:
            for t in self.state.tasks("WHERE worker = ? AND state = ?", (wid, J.T_RUNNING)):
                t.apply(J.abandoned(t.machine()))
                self.state.put_task(t)
        ring = self._ring()
        if wid not in ring.members:
            return
        woke = restarted
        recent = self.state.jobs(
            "WHERE state IN (?, ?, ?) OR (state = ? AND finished > ?)",
            (J.PENDING, J.LISTING, J.RUNNING, J.DONE, now - HANDBACK_WINDOW),
        )
        for job in recent:
            gone = self.state.tasks(
                "WHERE job = ? AND worker = ? AND state = ? AND kind = ?",
                (job.id, wid, J.T_REASSIGNED, J.T_LOAD),
            )
            later = self.state.jobs("WHERE created > ?", (job.created,)) if gone else []
            if not gone or any(
                j.spec.kind == "free" and j.spec.dataset == job.spec.dataset for j in later
            ):
                continue  # nothing went elsewhere, or the dataset was freed since
            try:
                ds = self._dataset(job.spec.dataset)
            except DatasetNotFound:
                continue  # deleted since: nothing to hand back
            man = self.manifest(ds.name) or Manifest(ds.name, [])
            items = [it for t in gone for it in t.items]
            mine = J.handback(
                ds.name, items, man.get, ring, job_replicas(job, ds), placed_locally(ds), wid
            )
            self.state.add_tasks(job.id, J.T_HANDBACK, mine)
            for t in gone:
                t.state = J.T_RETURNED
                self.state.put_task(t)
            log.info(
                "worker %s is back: handing it %d files of job %s that went elsewhere",
                wid,
                sum(len(b) for _, b in mine),
                job.id,
            )
            if job.state == J.DONE:  # reopened until the returning owner has its share
                job.state, job.finished, job.updated = J.RUNNING, 0.0, now
                self.state.put_job(job)
            woke = True
        if woke:
            self.on_tasks()

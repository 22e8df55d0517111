"""Load, free and sync jobs: the master plans them into batched tasks, hands the tasks
to the workers that own the files (they long-poll for work), adds up their progress,
re-plans the share of a lost worker, and runs cron schedules. Everything is persisted
(:mod:`shoal.master.jobstate`), so a job interrupted by a master restart resumes.

A load or sync job first lists its paths in under storage (a ``list`` task run by a
worker, with parallel listing), which refreshes the dataset's manifest; a load then
skips every file a worker already holds at its current version.

Decisions about one task (claim, report, lease missed, restart) are the pure functions
of :mod:`shoal.core.jobs`. A lost worker's share goes to the owners the ring names
instead, and back to it (``handback`` tasks; the job reopens) when it returns, so a
finished load leaves every file where readers look. A job whose listing made a new
datasets generation is done only once recent watchers acknowledged it (or after 5 s).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from shoal.core import cron
from shoal.core import jobs as J
from shoal.core.jobs import JobSpec, Progress
from shoal.core.manifest import Manifest
from shoal.core.ring import Ring
from shoal.core.types import Dataset
from shoal.errors import NotFound
from shoal.master.jobshares import (
    HANDBACK_WINDOW,
    MAX_ATTEMPTS,
    WorkerShares,
    job_replicas,
    placed_locally,
)
from shoal.master.jobstate import NO_ITEMS, Job, JobState, Schedule, Task
from shoal.master.jobviews import job_progress, job_view, schedule_view
from shoal.master.watchers import Watchers

__all__ = ["HANDBACK_WINDOW", "KEEP_FINISHED", "LEASE", "MAX_ATTEMPTS", "JobManager"]

log = logging.getLogger("shoal.master.jobs")

#: seconds a claimed task may go without a progress report before it is handed out again
LEASE = 30.0
#: finished jobs kept for `shoal job ls`
KEEP_FINISHED = 200


class JobManager(WorkerShares):
    """Jobs and schedules over :class:`~shoal.master.jobstate.JobState`; see the module
    docstring (a lost or returning worker's share: :mod:`~shoal.master.jobshares`)."""

    def __init__(
        self,
        state: JobState,
        dataset: Callable[[str], Dataset],
        ring: Callable[[], Ring],
        set_manifest: Callable[[str, str], Dataset],
        clock: Callable[[], float] = time.time,
        generation: Callable[[], int] = lambda: 0,
    ) -> None:
        self.state = state
        self._dataset = dataset
        self._ring = ring
        self._set_manifest = set_manifest
        self._clock = clock
        #: the master's datasets generation (what watchers wait on)
        self.generation = generation
        self.watch = Watchers(clock)
        self._manifests: dict[str, tuple[str, Manifest]] = {}
        #: missed leases per task (since this master started)
        self._missed: dict[int, int] = {}
        #: called whenever new tasks can be claimed (wakes long-polling workers)
        self.on_tasks: Callable[[], None] = lambda: None
        #: called when the datasets generation moved (wakes long-polling watchers)
        self.on_generation: Callable[[], None] = lambda: None
        now = clock()
        for t in state.tasks("WHERE state = ?", (J.T_RUNNING,)):
            t.apply(J.master_restarted(t.machine(), now, LEASE))
            state.put_task(t)

    # -- manifests ------------------------------------------------------------------

    def manifest(self, dataset: str) -> Manifest | None:
        ds = self._dataset(dataset)
        hit = self._manifests.get(dataset)
        if hit is not None and hit[0] == ds.manifest:
            return hit[1]
        raw = self.state.read_manifest(dataset)
        if raw is None or not ds.manifest:
            return None
        man = Manifest.from_bytes(raw)
        self._manifests[dataset] = (ds.manifest, man)
        return man

    def manifest_bytes(self, dataset: str) -> tuple[str, bytes]:
        ds = self._dataset(dataset)
        raw = self.state.read_manifest(dataset) if ds.manifest else None
        if raw is None:
            raise NotFound(
                f"dataset {dataset!r} has no manifest yet: run `shoal load "
                f"/{dataset} --metadata-only`"
            )
        return ds.manifest, raw

    def _save_manifest(self, man: Manifest) -> None:
        self.state.write_manifest(man.dataset, man.to_bytes())
        mid = f"{int(man.built_at * 1e6):x}-{len(man)}"
        self._set_manifest(man.dataset, mid)
        self._manifests[man.dataset] = (mid, man)

    def dataset_deleted(self, dataset: str) -> None:
        self.state.drop_manifest(dataset)
        self._manifests.pop(dataset, None)

    # -- submitting and controlling -------------------------------------------------

    def submit(self, spec: JobSpec, schedule: str | None = None) -> dict[str, Any]:
        self._dataset(spec.dataset)  # DatasetNotFound before anything is stored
        now = self._clock()
        if schedule is not None:
            cron.check(schedule)
            s = Schedule(
                "s-" + uuid.uuid4().hex[:10], schedule, spec, True, _next(schedule, now), "", now
            )
            self.state.put_schedule(s)
            log.info("schedule %s: %s %s at %r", s.id, spec.kind, spec.dataset, schedule)
            return self.schedule_view(s)
        return self.view(self._start(spec, now))

    def _start(self, spec: JobSpec, now: float, schedule: str = "") -> Job:
        job = Job("j-" + uuid.uuid4().hex[:10], spec, J.PENDING, now, now, schedule=schedule)
        self.state.put_job(job)
        log.info("job %s: %s of %s %s", job.id, spec.kind, spec.dataset, list(spec.prefixes())[:5])
        self.advance(job)
        return job

    def stop(self, jid: str) -> dict[str, Any]:
        if jid.startswith("s-"):
            return self.schedule_view(self._schedule_enabled(jid, False))
        job = self._job(jid)
        if job.state in J.ACTIVE:
            job.state, job.updated = J.STOPPED, self._clock()
            self.state.put_job(job)
        return self.view(job)

    def resume(self, jid: str) -> dict[str, Any]:
        if jid.startswith("s-"):
            return self.schedule_view(self._schedule_enabled(jid, True))
        job = self._job(jid)
        if job.state == J.STOPPED:
            has_tasks = bool(self.state.counts(job.id))
            if job.spec.kind in ("load", "sync") and not self._listed(job):
                job.state = J.LISTING if has_tasks else J.PENDING
            else:
                job.state = J.RUNNING if has_tasks else J.PENDING
            job.updated = self._clock()
            self.state.put_job(job)
            self.advance(job)
            self.on_tasks()
        return self.view(job)

    def _schedule_enabled(self, sid: str, enabled: bool) -> Schedule:
        for s in self.state.schedules():
            if s.id == sid:
                s.enabled = enabled
                if enabled:
                    s.next_run = _next(s.cron, self._clock())
                self.state.put_schedule(s)
                return s
        raise NotFound(f"no schedule {sid!r}")

    def _job(self, jid: str) -> Job:
        job = self.state.job(jid)
        if job is None:
            raise NotFound(f"no job {jid!r}")
        return job

    # -- views ----------------------------------------------------------------------

    def progress(self, job: Job) -> Progress:
        return job_progress(self.state, job)

    def view(self, job: Job) -> dict[str, Any]:
        return job_view(self.state, job, self._clock())

    def schedule_view(self, s: Schedule) -> dict[str, Any]:
        return schedule_view(s)

    def get(self, jid: str) -> dict[str, Any]:
        if jid.startswith("s-"):
            for s in self.state.schedules():
                if s.id == jid:
                    return self.schedule_view(s)
            raise NotFound(f"no schedule {jid!r}")
        return self.view(self._job(jid))

    def all(self) -> dict[str, Any]:
        return {
            "jobs": [self.view(j) for j in self.state.jobs()][-KEEP_FINISHED:],
            "schedules": [self.schedule_view(s) for s in self.state.schedules()],
        }

    # -- workers --------------------------------------------------------------------

    def claim(self, worker: str) -> dict[str, Any] | None:
        active = {j.id: j for j in self.state.jobs("WHERE state IN (?, ?)", (J.LISTING, J.RUNNING))}
        # the candidates without their file lists: only the task handed out needs its own
        for t in self.state.tasks(
            "WHERE worker = ? AND state = ? ORDER BY id", (worker, J.T_PENDING), with_items=False
        ):
            job = active.get(t.job)
            if job is None:
                continue
            t = self._whole(t)
            t.apply(J.claimed(t.machine(), self._clock(), LEASE))
            self.state.put_task(t)
            ds = self._dataset(job.spec.dataset)
            return {
                "id": t.id,
                "job": t.job,
                # a handback is a load like any other for the worker
                "kind": J.T_LOAD if t.kind == J.T_HANDBACK else t.kind,
                "attempt": t.attempt,
                "dataset": ds.name,
                "items": t.items,
                "verify": job.spec.verify,
            }
        return None

    def report(self, task_id: int, body: dict[str, Any]) -> dict[str, Any]:
        r = J.TaskReport.from_body(body)
        # without its items: only a stop part way replaces them (written whole, below)
        t = self.state.task(task_id, with_items=False)
        if t is None:
            raise NotFound(f"no task {task_id}")
        job = self._job(t.job)
        active = job.state in (J.LISTING, J.RUNNING)
        new, verdict = J.reported(t.machine(), r, active, self._clock(), LEASE)
        if not verdict.accepted:
            return {"stop": verdict.stop}
        t.apply(new)
        if t.kind == J.T_LIST and r.final:
            if r.entries is not None:
                self._listed_entries(job, r.entries, list(r.missing))
            elif not r.remaining:
                why = "; ".join(x for _, x in t.progress.failures[:1]) or "listing failed"
                job.state, job.error, job.finished = J.FAILED, why, self._clock()
                self.state.put_job(job)
        if t.kind == J.T_HANDBACK and r.final and t.progress.files_failed:
            log.warning(
                "handback task %d on %s: %d files could not be loaded (%s)",
                t.id,
                t.worker,
                t.progress.files_failed,
                t.progress.failures[:1],
            )
        if t.items is NO_ITEMS:
            self.state.put_task_run(t)
        else:
            self.state.put_task(t)
        if r.final:
            self.advance(job)
        return {"stop": verdict.stop}

    def _listed_entries(self, job: Job, entries: list[list[Any]], missing: list[str]) -> None:
        ds = self._dataset(job.spec.dataset)
        old = self.manifest(ds.name) or Manifest(ds.name, [])
        prefixes = job.spec.prefixes() if job.spec.files is None else []
        if job.spec.files is not None:
            # only the named files were looked at: replace exactly those
            new = old.replace_rows(job.spec.files, entries, self._clock())
        else:
            # rows straight into the table: an object per listed file held the master's
            # loop (and its heartbeats) for seconds at a million files
            new = old.merge_rows(prefixes, entries, self._clock())
        if job.spec.kind == "sync":
            changed, gone = old.diff(new, prefixes or sorted({str(r[0]) for r in entries}))
            job.listed["changed"] = [[e.path, e.version] for e in changed]
            job.listed["gone"] = gone
        job.listed["missing"] = [[p, "not found in under storage"] for p in missing]
        job.listed["done"] = True
        self._save_manifest(new)
        # what watchers must acknowledge before the job is reported done
        job.listed["generation"] = self.generation()
        self.state.put_job(job)

    def _listed(self, job: Job) -> bool:
        return bool(job.listed.get("done"))

    # -- the state machine ----------------------------------------------------------

    def advance(self, job: Job) -> None:
        """Move a job along as far as its tasks allow."""
        if job.state not in J.ACTIVE:
            return
        ring = self._ring()
        if not ring.members:
            return  # no workers yet: try again on the next tick
        spec = job.spec
        now = self._clock()
        if job.state == J.PENDING:
            if spec.kind == "free":
                self.state.add_tasks(job.id, J.T_FREE, [(w, spec.prefixes()) for w in ring.members])
                job.state = J.RUNNING
            else:
                lister = ring.owner(f"{spec.dataset}/") or ring.members[0]
                self.state.add_tasks(job.id, J.T_LIST, [(lister, spec.prefixes())])
                job.state = J.LISTING
            self.on_tasks()
        elif job.state == J.LISTING and self._listed(job):
            self._plan_after_listing(job, ring)
            self.on_tasks()
        # not elif: a job planned just now with nothing to do finishes now
        if (
            job.state == J.RUNNING
            and J.settled(self.state.counts(job.id))
            and not self.watch.holding(job, now)
        ):
            p = self.progress(job)
            job.state = J.FAILED if p.files_total and p.files_failed == p.files_total else J.DONE
            job.finished = now
            log.info(
                "job %s %s: %d done, %d skipped, %d failed",
                job.id,
                job.state,
                p.files_done,
                p.files_skipped,
                p.files_failed,
            )
        job.updated = now
        self.state.put_job(job)

    def _plan_after_listing(self, job: Job, ring: Ring) -> None:
        spec = job.spec
        ds = self._dataset(spec.dataset)
        if spec.kind == "sync":
            changed = job.listed.get("changed", [])
            gone = job.listed.get("gone", [])
            items = [[p, v] for p, v in changed] + [[p, None] for p in gone]
            if items:
                self.state.add_tasks(job.id, J.T_INVALIDATE, [(w, items) for w in ring.members])
            job.state = J.RUNNING
            return
        if spec.metadata_only:
            job.state = J.RUNNING  # no tasks: done as soon as watchers have the manifest
            return
        man = self.manifest(ds.name) or Manifest(ds.name, [])
        if spec.files is not None:
            entries = [e for f in spec.files if (e := man.get(f)) is not None]
        else:
            entries = man.select(list(spec.paths), spec.glob)
        items = [[e.path, e.size, e.version] for e in entries]
        tasks = J.plan(ds.name, items, ring, job_replicas(job, ds), placed_locally(ds))
        job.listed["files_total"] = sum(len(b) for _, b in tasks)
        job.listed["bytes_total"] = sum(int(i[1]) for _, b in tasks for i in b)
        self.state.add_tasks(job.id, J.T_LOAD, tasks)
        job.state = J.RUNNING

    def tick(self) -> None:
        """Expire leases, re-plan lost workers' shares, advance jobs, run schedules."""
        now = self._clock()
        ring = self._ring()
        live = set(ring.members)
        changed = False
        #: (lost worker, job) -> files moved, and to whom: one log line each
        moved: dict[tuple[str, str], tuple[int, set[str]]] = {}
        # without their item lists: only a lost worker's tasks need them (below)
        pending = (J.T_PENDING, J.T_RUNNING)
        for t in self.state.tasks("WHERE state IN (?, ?)", pending, with_items=False):
            if t.worker in live:
                if t.state == J.T_RUNNING and t.lease < now:
                    self._lease_missed(self._whole(t))
                    changed = True
                continue
            if not live:
                continue
            t = self._whole(t)
            changed = True
            n, to = moved.get((t.worker, t.job), (0, set()))
            moved[(t.worker, t.job)] = (n + len(t.items), to | self._reassign(t, ring))
        for (lost, jid), (n, to) in sorted(moved.items()):
            log.warning("worker %s lost: its %d files of job %s go to %s", lost, n, jid, sorted(to))
        for job in self.state.jobs("WHERE state IN (?, ?, ?)", (J.PENDING, J.LISTING, J.RUNNING)):
            self.advance(job)
        self._run_schedules(now)
        if changed:
            self.on_tasks()

    def _whole(self, t: Task) -> Task:
        """``t`` read again with its items (a task is written back whole: one read
        without them must never be put)."""
        full = self.state.task(t.id)
        if full is None:
            raise NotFound(f"task {t.id} is gone")
        return full

    # -- watchers -------------------------------------------------------------------

    def watch_begin(self, wid: str, since: int) -> None:
        """A watcher polls: its acknowledgement may let jobs that wait for it finish."""
        self.watch.begin(wid, since)
        for job in self.state.jobs("WHERE state = ?", (J.RUNNING,)):
            if "watch_wait" in job.listed:
                self.advance(job)

    def watch_end(self, wid: str) -> None:
        self.watch.end(wid)

    def _run_schedules(self, now: float) -> None:
        for s in self.state.schedules():
            if not s.enabled or s.next_run > now:
                continue
            last = self.state.job(s.last_job) if s.last_job else None
            if last is not None and last.state in J.ACTIVE:
                log.warning("schedule %s: job %s still running; skipping this run", s.id, last.id)
            else:
                try:
                    s.last_job = self._start(s.spec, now, schedule=s.id).id
                except Exception as exc:  # one bad schedule must not stop the others
                    log.error("schedule %s could not start: %s", s.id, exc)
            s.next_run = _next(s.cron, now)
            self.state.put_schedule(s)


def _next(expr: str, now: float) -> float:
    return cron.next_run(expr, now)

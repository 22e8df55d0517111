"""Load, free and sync jobs: the master plans them into batched tasks, hands the tasks
to the workers that own the files (they long-poll for work), adds up their progress,
re-plans the share of a lost worker, and runs cron schedules. Everything is persisted
(:mod:`shoal.master.jobstate`), so a job interrupted by a master restart resumes.

A load or sync job first lists its paths in under storage (a ``list`` task run by a
worker, with parallel listing), which refreshes the dataset's manifest; a load then
skips every file a worker already holds at its current version.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from croniter import croniter

from shoal.core import jobs as J
from shoal.core.jobs import JobSpec, Progress
from shoal.core.manifest import Entry, Manifest
from shoal.core.ring import Ring
from shoal.core.types import Dataset
from shoal.errors import InvalidArgument, NotFound
from shoal.master.jobstate import Job, JobState, Schedule, Task

log = logging.getLogger("shoal.master.jobs")

#: seconds a claimed task may go without a progress report before it is handed out again
LEASE = 30.0
#: missed leases after which a task is given up (its files, or its job, fail)
MAX_ATTEMPTS = 3
#: finished jobs kept for `shoal job ls`
KEEP_FINISHED = 200


class JobManager:
    def __init__(
        self,
        state: JobState,
        dataset: Callable[[str], Dataset],
        ring: Callable[[], Ring],
        set_manifest: Callable[[str, str], Dataset],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self._dataset = dataset
        self._ring = ring
        self._set_manifest = set_manifest
        self._clock = clock
        self._manifests: dict[str, tuple[str, Manifest]] = {}
        #: missed leases per task (since this master started)
        self._missed: dict[int, int] = {}
        #: called whenever new tasks can be claimed (wakes long-polling workers)
        self.on_tasks: Callable[[], None] = lambda: None
        for t in state.tasks("WHERE state = ?", (J.T_RUNNING,)):
            t.state, t.lease = J.T_PENDING, 0.0  # leases do not survive a restart
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
            if not croniter.is_valid(schedule):
                raise InvalidArgument(
                    f"invalid cron expression {schedule!r}: expected five fields, e.g. '0 3 * * *'"
                )
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
        total = Progress()
        for t in self.state.tasks("WHERE job = ? AND kind = ?", (job.id, J.T_LOAD)):
            if t.state != "reassigned":
                total.add(t.progress)
        for t in self.state.tasks(
            "WHERE job = ? AND kind IN (?, ?)", (job.id, J.T_FREE, J.T_INVALIDATE)
        ):
            total.add(t.progress)
        total.files_total = int(job.listed.get("files_total", 0))
        total.bytes_total = int(job.listed.get("bytes_total", 0))
        for path, reason in job.listed.get("missing", []):
            total.files_total += 1
            total.files_failed += 1
            if len(total.failures) < J.MAX_FAILURES:
                total.failures.append([path, reason])
        return total

    def view(self, job: Job) -> dict[str, Any]:
        p = self.progress(job)
        end = job.finished or self._clock()
        secs = max(1e-9, end - job.created)
        return {
            "id": job.id,
            "kind": job.spec.kind,
            "dataset": job.spec.dataset,
            "state": job.state,
            "spec": job.spec.to_dict(),
            "schedule": job.schedule,
            "created": job.created,
            "updated": job.updated,
            "finished": job.finished,
            "error": job.error,
            "tasks": self.state.counts(job.id),
            **p.to_dict(),
            "bytes_per_s": p.bytes_done / secs,
            "files_per_s": (p.files_done + p.files_skipped) / secs,
        }

    def schedule_view(self, s: Schedule) -> dict[str, Any]:
        return {
            "id": s.id,
            "cron": s.cron,
            "spec": s.spec.to_dict(),
            "enabled": s.enabled,
            "next_run": s.next_run,
            "last_job": s.last_job,
            "kind": "schedule",
            "dataset": s.spec.dataset,
            "state": "enabled" if s.enabled else "disabled",
        }

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
        for t in self.state.tasks(
            "WHERE worker = ? AND state = ? ORDER BY id", (worker, J.T_PENDING)
        ):
            job = active.get(t.job)
            if job is None:
                continue
            t.state, t.lease = J.T_RUNNING, self._clock() + LEASE
            self.state.put_task(t)
            ds = self._dataset(job.spec.dataset)
            return {
                "id": t.id,
                "job": t.job,
                "kind": t.kind,
                "dataset": ds.name,
                "items": t.items,
                "verify": job.spec.verify,
            }
        return None

    def report(self, task_id: int, body: dict[str, Any]) -> dict[str, Any]:
        t = self.state.task(task_id)
        if t is None:
            raise NotFound(f"no task {task_id}")
        job = self._job(t.job)
        stop = job.state not in (J.LISTING, J.RUNNING) or t.state != J.T_RUNNING
        if t.state == J.T_RUNNING:
            t.progress.add(Progress.from_dict(body.get("progress") or {}))
            t.lease = self._clock() + LEASE
            if body.get("entries") is not None and t.kind == J.T_LIST:
                self._listed_entries(job, body["entries"], body.get("missing") or [])
            listing_failed = t.kind == J.T_LIST and body.get("entries") is None
            if body.get("final") and listing_failed and not body.get("remaining"):
                why = "; ".join(r for _, r in t.progress.failures[:1]) or "listing failed"
                job.state, job.error, job.finished = J.FAILED, why, self._clock()
                self.state.put_job(job)
            if body.get("final"):
                remaining = body.get("remaining")
                if remaining:  # stopped part way: the rest waits for a resume
                    t.items, t.state = remaining, J.T_PENDING
                else:
                    t.state = J.T_DONE
            self.state.put_task(t)
            if body.get("final"):
                self.advance(job)
        return {"stop": stop}

    def _listed_entries(self, job: Job, entries: list[list[Any]], missing: list[str]) -> None:
        ds = self._dataset(job.spec.dataset)
        old = self.manifest(ds.name) or Manifest(ds.name, [])
        fresh = [Entry(str(p), int(s), str(v), float(m)) for p, s, v, m in entries]
        prefixes = job.spec.prefixes() if job.spec.files is None else []
        if job.spec.files is not None:
            # only the named files were looked at: replace exactly those
            named = set(job.spec.files)
            keep = [e for e in old.select([""]) if e.path not in named]
            new = Manifest(ds.name, [*keep, *fresh], self._clock())
        else:
            new = old.merge(prefixes, fresh, self._clock())
        if job.spec.kind == "sync":
            changed, gone = old.diff(new, prefixes or sorted({e.path for e in fresh}))
            job.listed["changed"] = [[e.path, e.version] for e in changed]
            job.listed["gone"] = gone
        job.listed["missing"] = [[p, "not found in under storage"] for p in missing]
        job.listed["done"] = True
        self._save_manifest(new)
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
        elif job.state == J.RUNNING:
            counts = self.state.counts(job.id)
            if all(k in (J.T_DONE, "reassigned") for k in counts):
                p = self.progress(job)
                job.state = (
                    J.FAILED if p.files_total and p.files_failed == p.files_total else J.DONE
                )
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
            job.state, job.finished = J.DONE, self._clock()
            return
        man = self.manifest(ds.name) or Manifest(ds.name, [])
        if spec.files is not None:
            entries = [e for f in spec.files if (e := man.get(f)) is not None]
        else:
            entries = man.select(list(spec.paths), spec.glob)
        items = [[e.path, e.size, e.version] for e in entries]
        replicas = spec.replicas or ds.policy.replicas
        tasks = J.plan(ds.name, items, ring, replicas, ds.policy.placement == "local")
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
        for t in self.state.tasks("WHERE state IN (?, ?)", (J.T_PENDING, J.T_RUNNING)):
            if t.worker in live:
                if t.state == J.T_RUNNING and t.lease < now:
                    self._lease_missed(t)
                    changed = True
                continue
            if not live:
                continue
            changed = True
            self._reassign(t, ring)
        for job in self.state.jobs("WHERE state IN (?, ?, ?)", (J.PENDING, J.LISTING, J.RUNNING)):
            self.advance(job)
        self._run_schedules(now)
        if changed:
            self.on_tasks()

    def _lease_missed(self, t: Task) -> None:
        """Hand a task out again; after MAX_ATTEMPTS missed leases give up on it, so a
        task that can never finish (a result the master refuses) fails its job instead
        of running forever."""
        n = self._missed[t.id] = self._missed.get(t.id, 0) + 1
        if n < MAX_ATTEMPTS:
            log.warning("task %d on %s missed its lease; handing it out again", t.id, t.worker)
            t.state = J.T_PENDING
            self.state.put_task(t)
            return
        why = f"task {t.id} on {t.worker} missed its lease {n} times"
        log.error("%s: giving up on it", why)
        t.state = J.T_DONE
        if t.kind == J.T_LOAD:
            failures = [[i[0], why] for i in t.items[: J.MAX_FAILURES]]
            t.progress.add(Progress(files_failed=len(t.items), failures=failures))
        self.state.put_task(t)
        if t.kind == J.T_LIST:
            job = self._job(t.job)
            job.state, job.error, job.finished = J.FAILED, why, self._clock()
            self.state.put_job(job)

    def _reassign(self, t: Task, ring: Ring) -> None:
        job = self._job(t.job)
        if t.kind == J.T_LOAD:
            ds = self._dataset(job.spec.dataset)
            replicas = job.spec.replicas or ds.policy.replicas
            moved = J.replan(ds.name, t.items, ring, replicas, ds.policy.placement == "local")
            self.state.add_tasks(job.id, J.T_LOAD, moved)
            t.state = "reassigned"
            log.warning(
                "worker %s lost: its %d files of job %s go to %s",
                t.worker,
                len(t.items),
                job.id,
                sorted(w for w, _ in moved),
            )
        elif t.kind == J.T_LIST:
            t.worker, t.state = ring.members[0], J.T_PENDING
        else:
            t.state = J.T_DONE  # a lost worker's cache is gone with it
        self.state.put_task(t)

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


def _next(cron: str, now: float) -> float:
    return float(croniter(cron, now).get_next(float))

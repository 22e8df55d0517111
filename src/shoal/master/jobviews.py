"""What the job API answers: a job's counts and view, a schedule's view.

Counts come from the tasks through :func:`shoal.core.jobs.counted`, so they add up:
``files_done + files_skipped + files_failed == files_total`` once a job is done.
"""

from __future__ import annotations

from typing import Any

from shoal.core import jobs as J
from shoal.core.jobs import Progress
from shoal.master.jobstate import Job, JobState, Schedule


def job_progress(state: JobState, job: Job) -> Progress:
    total = Progress()
    # handback tasks are left out: they re-copy files the job has counted once already
    for t in state.tasks(
        "WHERE job = ? AND kind IN (?, ?, ?)",
        (job.id, J.T_LOAD, J.T_FREE, J.T_INVALIDATE),
        with_items=False,
    ):
        total.add(J.counted(t.machine()))
    total.files_total = int(job.listed.get("files_total", 0))
    total.bytes_total = int(job.listed.get("bytes_total", 0))
    for path, reason in job.listed.get("missing", []):
        total.files_total += 1
        total.files_failed += 1
        if len(total.failures) < J.MAX_FAILURES:
            total.failures.append([path, reason])
    return total


def job_view(state: JobState, job: Job, now: float) -> dict[str, Any]:
    p = job_progress(state, job)
    end = job.finished or now
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
        "tasks": state.counts(job.id),
        **p.to_dict(),
        "bytes_per_s": p.bytes_done / secs,
        "files_per_s": (p.files_done + p.files_skipped) / secs,
    }


def schedule_view(s: Schedule) -> dict[str, Any]:
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

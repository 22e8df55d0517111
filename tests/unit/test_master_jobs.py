from dataclasses import replace
from pathlib import Path

from shoal.core.jobs import BATCH_FILES, JobSpec
from shoal.core.ring import Ring
from shoal.core.types import Dataset, Mount
from shoal.master.jobs import LEASE, MAX_ATTEMPTS, JobManager
from shoal.master.jobstate import JobState


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def manager(tmp_path: Path) -> tuple[JobManager, Clock]:
    ds = {"ds": Dataset("ds", (Mount("m", "file:///x"),))}

    def set_manifest(name: str, mid: str) -> Dataset:
        ds[name] = replace(ds[name], manifest=mid)
        return ds[name]

    clock = Clock()
    jm = JobManager(
        JobState(str(tmp_path)), ds.__getitem__, lambda: Ring.build(1, ["w1"]), set_manifest, clock
    )
    return jm, clock


def test_a_task_that_never_reports_fails_its_job_instead_of_running_forever(tmp_path: Path) -> None:
    jm, clock = manager(tmp_path)
    job = jm.submit(JobSpec("load", "ds"))
    assert job["state"] == "listing"
    for _ in range(MAX_ATTEMPTS):
        task = jm.claim("w1")
        assert task is not None and task["kind"] == "list"
        clock.t += LEASE + 1  # the worker never reports
        jm.tick()
    v = jm.get(job["id"])
    assert v["state"] == "failed" and "missed its lease" in v["error"]
    assert jm.claim("w1") is None


def test_listing_then_load_tasks_and_progress(tmp_path: Path) -> None:
    jm, _ = manager(tmp_path)
    job = jm.submit(JobSpec("load", "ds"))
    lst = jm.claim("w1")
    assert lst is not None
    n = BATCH_FILES + 188  # two tasks: one full batch and the rest
    entries = [[f"m/f{i}", 10, "v1", 0.0] for i in range(n)]
    jm.report(
        lst["id"],
        {"attempt": lst["attempt"], "seq": 1, "final": True, "entries": entries, "missing": []},
    )
    tasks = [jm.claim("w1"), jm.claim("w1")]
    assert all(t is not None and t["kind"] == "load" for t in tasks)
    assert sum(len(t["items"]) for t in tasks if t) == n  # batches of at most BATCH_FILES
    assert max(len(t["items"]) for t in tasks if t) == BATCH_FILES
    for t in tasks:
        assert t is not None
        jm.report(
            t["id"],
            {
                "attempt": t["attempt"],
                "seq": 1,
                "final": True,
                "progress": {"files_done": len(t["items"]), "bytes_done": 10 * len(t["items"])},
            },
        )
    v = jm.get(job["id"])
    assert (v["state"], v["files_done"], v["files_total"], v["bytes_done"]) == (
        "done",
        n,
        n,
        10 * n,
    )

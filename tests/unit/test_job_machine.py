"""The job decisions (core/jobs.py) with plain calls, and the JobManager carrying them
out against a real JobState: counts add up whatever order, repeats or restarts the
reports meet; reassigned work goes back to its owner; watchers hold up done."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

from shoal.core import jobs as J
from shoal.core.jobs import JobSpec, Progress, TaskReport, TaskRun
from shoal.core.ring import Ring
from shoal.core.types import Dataset, Mount
from shoal.master.jobs import LEASE, JobManager
from shoal.master.jobstate import JobState


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Env:
    """A JobManager over a real JobState, a settable ring and a fake clock."""

    def __init__(self, tmp_path: Path, workers: list[str]) -> None:
        self.dir = str(tmp_path)
        self.ds = {"ds": Dataset("ds", (Mount("m", "file:///x"),))}
        self.members = list(workers)
        self.clock = Clock()
        self.gen = 1
        self.jm = self.new_manager()

    def set_manifest(self, name: str, mid: str) -> Dataset:
        self.gen += 1
        self.ds[name] = replace(self.ds[name], manifest=mid)
        return self.ds[name]

    def new_manager(self) -> JobManager:
        """A (re)started master over the same job state."""
        return JobManager(
            JobState(self.dir),
            self.ds.__getitem__,
            lambda: Ring.build(len(self.members), self.members),
            self.set_manifest,
            self.clock,
            generation=lambda: self.gen,
        )

    def listed(self, n: int, kind: str = "load") -> str:
        """Submit a job and answer its listing with n files; the job id."""
        job = self.jm.submit(JobSpec(kind, "ds"))
        lst = self.claim_kind("list")
        entries = [[f"m/f{i:04d}", 10, "v1", 0.0] for i in range(n)]
        self.jm.report(lst["id"], body(lst, 1, Progress(), final=True, entries=entries))
        return str(job["id"])

    def claim_kind(self, kind: str) -> dict[str, Any]:
        for w in self.members:
            t = self.jm.claim(w)
            if t is not None:
                assert t["kind"] == kind, t
                return t
        raise AssertionError(f"no {kind} task to claim")

    def claims(self) -> list[dict[str, Any]]:
        out = []
        for w in self.members:
            while (t := self.jm.claim(w)) is not None:
                out.append(t)
        return out


def body(
    task: dict[str, Any], seq: int, p: Progress, final: bool = False, **extra: Any
) -> dict[str, Any]:
    return {
        "attempt": task["attempt"],
        "seq": seq,
        "progress": p.to_dict(),
        "final": final,
        **extra,
    }


def worker_of(env: Env, t: dict[str, Any]) -> str:
    task = env.jm.state.task(t["id"])
    assert task is not None
    return task.worker


def adds_up(v: dict[str, Any]) -> bool:
    return bool(v["files_done"] + v["files_skipped"] + v["files_failed"] == v["files_total"])


# -- the pure decisions ---------------------------------------------------------------


def test_a_report_counts_once_whatever_the_order() -> None:
    t = J.claimed(TaskRun(J.T_PENDING, [["a", 1, "v"], ["b", 1, "v"]]), 0.0, LEASE)
    first = TaskReport(t.attempt, 1, Progress(files_done=1))
    final = TaskReport(t.attempt, 2, Progress(files_done=2), final=True)
    t, v = J.reported(t, final, True, 1.0, LEASE)
    assert v.accepted and t.state == J.T_DONE
    for late in (first, final):  # overtaken, or repeated by a retry
        t, v = J.reported(t, late, True, 2.0, LEASE)
        assert not v.accepted
    assert J.counted(t).files_done == 2


def test_a_stale_attempt_is_told_to_stop_and_counts_nothing() -> None:
    t = J.claimed(TaskRun(J.T_PENDING, [["a", 1, "v"]]), 0.0, LEASE)
    t, _ = J.reported(t, TaskReport(1, 1, Progress(files_done=1)), True, 1.0, LEASE)
    t = J.claimed(J.abandoned(t), 40.0, LEASE)  # lease missed: handed out again
    assert J.counted(t).files_done == 0
    t, v = J.reported(t, TaskReport(1, 2, Progress(files_done=1), final=True), True, 41.0, LEASE)
    assert (v.accepted, v.stop, t.state) == (False, True, J.T_RUNNING)
    t, v = J.reported(t, TaskReport(2, 1, Progress(files_skipped=1), final=True), True, 42, LEASE)
    assert v.accepted and (J.counted(t).files_done, J.counted(t).files_skipped) == (0, 1)


def test_a_stopped_attempt_keeps_its_count_for_the_items_it_did() -> None:
    items = [["a", 1, "v"], ["b", 1, "v"], ["c", 1, "v"]]
    t = J.claimed(TaskRun(J.T_PENDING, items), 0.0, LEASE)
    stop = TaskReport(1, 1, Progress(files_done=1), final=True, remaining=items[1:])
    t, _ = J.reported(t, stop, False, 1.0, LEASE)
    assert t.state == J.T_PENDING and t.items == items[1:]
    t = J.claimed(t, 2.0, LEASE)
    t, _ = J.reported(t, TaskReport(2, 1, Progress(files_done=2), final=True), True, 3.0, LEASE)
    assert J.counted(t).files_done == 3
    assert J.counted(replace(t, state=J.T_REASSIGNED)).files_done == 3  # base only


def test_watchers_lag_until_they_poll_with_the_generation() -> None:
    w = {"a": J.Watcher(4, 100.0), "b": J.Watcher(5, 100.0), "gone": J.Watcher(1, 80.0)}
    assert J.lagging(w, 5, 101.0) == ["a"]  # "gone" has been silent for over 10 s
    assert J.lagging({"a": J.Watcher(4, 50.0, waiting=1)}, 5, 101.0) == ["a"]


# -- the manager carrying them out ------------------------------------------------------


def test_reports_in_any_order_and_repeats_add_up(tmp_path: Path) -> None:
    env = Env(tmp_path, ["w1"])
    jid = env.listed(20)
    jm = env.jm
    for t in env.claims():
        n = len(t["items"])
        jm.report(t["id"], body(t, 2, Progress(files_done=n), final=True))
        # the progress report sent before the final one arrives after it, twice
        for _ in range(2):
            assert jm.report(t["id"], body(t, 1, Progress(files_done=n - 1)))["stop"]
    v = jm.get(jid)
    assert v["state"] == "done" and v["files_done"] == 20 and adds_up(v)


def test_a_master_restart_mid_task_does_not_count_twice(tmp_path: Path) -> None:
    env = Env(tmp_path, ["w1"])
    jid = env.listed(30)
    (t,) = env.claims()
    env.jm.report(t["id"], body(t, 1, Progress(files_done=10)))
    env.jm = env.new_manager()  # the master restarts; the worker goes on with its attempt
    assert env.jm.claim("w1") is None  # still running (a fresh lease), not handed out twice
    assert env.jm.report(t["id"], body(t, 2, Progress(files_done=20))) == {"stop": False}
    env.jm.report(t["id"], body(t, 3, Progress(files_done=30), final=True))
    v = env.jm.get(jid)
    assert (v["state"], v["files_done"], v["files_skipped"]) == ("done", 30, 0)


def test_an_attempt_that_missed_its_lease_is_replaced_without_double_counting(
    tmp_path: Path,
) -> None:
    env = Env(tmp_path, ["w1"])
    jid = env.listed(30)
    (old,) = env.claims()
    env.jm.report(old["id"], body(old, 1, Progress(files_done=10)))
    env.clock.t += LEASE + 1
    env.jm.tick()
    (new,) = env.claims()
    assert new["attempt"] == old["attempt"] + 1
    assert env.jm.report(old["id"], body(old, 2, Progress(files_done=30), final=True))["stop"]
    env.jm.report(new["id"], body(new, 1, Progress(files_done=20, files_skipped=10), final=True))
    v = env.jm.get(jid)
    assert (v["files_done"], v["files_skipped"]) == (20, 10) and adds_up(v)


def test_a_returning_worker_is_handed_back_its_share_and_the_job_reopens(
    tmp_path: Path,
) -> None:
    env = Env(tmp_path, ["w1", "w2"])
    jid = env.listed(200)
    tasks = env.claims()
    lost = [t for t in tasks if worker_of(env, t) == "w2"]
    assert lost
    for t in tasks:
        if t not in lost:
            env.jm.report(t["id"], body(t, 1, Progress(files_done=len(t["items"])), final=True))
    env.members = ["w1"]  # w2 is lost: its share goes to w1
    env.jm.tick()
    for t in env.claims():
        env.jm.report(t["id"], body(t, 1, Progress(files_done=len(t["items"])), final=True))
    v = env.jm.get(jid)
    assert v["state"] == "done" and v["files_done"] == 200
    env.members = ["w1", "w2"]  # w2 comes back and owns its files again
    env.jm.worker_joined("w2", restarted=False)
    assert env.jm.get(jid)["state"] == "running"
    back = env.claims()
    assert back and {worker_of(env, t) for t in back} == {"w2"}
    assert sorted(i[0] for t in back for i in t["items"]) == sorted(
        i[0] for t in lost for i in t["items"]
    )
    for t in back:
        env.jm.report(t["id"], body(t, 1, Progress(files_done=len(t["items"])), final=True))
    v = env.jm.get(jid)
    assert v["state"] == "done" and v["files_done"] == 200 and adds_up(v)
    env.jm.worker_joined("w2", restarted=False)  # only once
    assert env.jm.get(jid)["state"] == "done"


def test_a_job_that_made_a_generation_waits_for_watchers(tmp_path: Path) -> None:
    env = Env(tmp_path, ["w1"])
    env.jm.watch_begin("mount-1", env.gen)
    env.jm.watch_end("mount-1")
    jid = env.listed(0, kind="sync")  # no changes: nothing to invalidate
    assert env.jm.get(jid)["state"] == "running"  # mount-1 has not seen the new manifest
    env.jm.watch_begin("mount-1", env.gen)  # its next poll acknowledges it
    assert env.jm.get(jid)["state"] == "done"
    # a watcher that never comes back holds a job up for WATCH_GRACE at most
    jid = env.listed(0, kind="sync")
    env.jm.watch_end("mount-1")
    env.clock.t += J.WATCH_GRACE + 0.1
    env.jm.tick()
    assert env.jm.get(jid)["state"] == "done"


def test_a_job_state_from_before_attempts_opens_and_reads(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "jobs.db")
    db.executescript(
        "CREATE TABLE tasks (id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL,"
        " worker TEXT NOT NULL, kind TEXT NOT NULL, items TEXT NOT NULL, state TEXT NOT NULL,"
        " progress TEXT NOT NULL DEFAULT '{}', lease REAL NOT NULL DEFAULT 0);"
        "INSERT INTO tasks(job, worker, kind, items, state, progress)"
        " VALUES ('j-1', 'w1', 'load', '[]', 'done', '{\"files_done\": 3}');"
    )
    db.commit()
    db.close()
    (t,) = JobState(str(tmp_path)).tasks()
    assert (t.attempt, t.seq, J.counted(t.machine()).files_done) == (0, 0, 3)


def test_a_restarted_worker_runs_its_old_process_tasks_again_at_once(tmp_path: Path) -> None:
    env = Env(tmp_path, ["w1"])
    jid = env.listed(10)
    (old,) = env.claims()
    env.jm.report(old["id"], body(old, 1, Progress(files_done=4)))
    env.jm.worker_joined("w1", restarted=True)  # a new process: no waiting for the lease
    (new,) = env.claims()
    assert new["id"] == old["id"] and new["attempt"] == old["attempt"] + 1
    env.jm.report(new["id"], body(new, 1, Progress(files_done=6, files_skipped=4), final=True))
    v = env.jm.get(jid)
    assert (v["state"], v["files_done"], v["files_skipped"]) == ("done", 6, 4)

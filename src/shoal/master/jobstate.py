"""Durable job state: jobs, their tasks and cron schedules in ``<state_dir>/jobs.db``,
and dataset manifests as files in ``<state_dir>/manifests/``.

Kept apart from ``master.db`` so that a busy load (thousands of task updates) never
contends with membership writes. Every change commits before the caller answers.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shoal.core.jobs import JobSpec, Progress, TaskRun
from shoal.master.backup import copy_db

#: task columns added after the first release: (name, declaration), for older state dirs
_ADDED_TASK_COLUMNS = (
    ("attempt", "INTEGER NOT NULL DEFAULT 0"),
    ("seq", "INTEGER NOT NULL DEFAULT 0"),
    ("run", "TEXT NOT NULL DEFAULT '{}'"),
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, spec TEXT NOT NULL, state TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL, finished REAL NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '', schedule TEXT NOT NULL DEFAULT '',
    listed TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS tasks (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, worker TEXT NOT NULL,
    kind TEXT NOT NULL, items TEXT NOT NULL, state TEXT NOT NULL,
    progress TEXT NOT NULL DEFAULT '{}', lease REAL NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0, seq INTEGER NOT NULL DEFAULT 0,
    run TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS tasks_job ON tasks(job);
CREATE INDEX IF NOT EXISTS tasks_claim ON tasks(worker, state);
CREATE TABLE IF NOT EXISTS schedules (
    id TEXT PRIMARY KEY, cron TEXT NOT NULL, spec TEXT NOT NULL, enabled INTEGER NOT NULL,
    next_run REAL NOT NULL, last_job TEXT NOT NULL DEFAULT '', created REAL NOT NULL
);
"""

#: every column but the items, in indexes: a row's columns after ``items`` (its file
#: list, ~250 KB a task) are read through that list's overflow pages, so counting a
#: job's progress read all of its file lists, on every view, tick and claim (an index
#: alone holds them; the tables' format is unchanged, an older master ignores these)
_RUN_COLUMNS = "lease, attempt, seq, progress, run"
_COVERING = f"""
CREATE INDEX IF NOT EXISTS tasks_job_run ON tasks(job, kind, state, worker, {_RUN_COLUMNS});
CREATE INDEX IF NOT EXISTS tasks_worker_run ON tasks(worker, state, id, job, kind, {_RUN_COLUMNS});
"""


@dataclass
class Job:
    id: str
    spec: JobSpec
    state: str
    created: float
    updated: float
    finished: float = 0.0
    error: str = ""
    schedule: str = ""
    #: files named by --files-from that the listing did not find (path -> reason)
    listed: dict[str, Any] = field(default_factory=dict)


@dataclass
class Task:
    id: int
    job: str
    worker: str
    kind: str
    items: list[Any]
    state: str
    #: counted for items finished by earlier attempts (see :class:`TaskRun`)
    progress: Progress
    lease: float = 0.0
    attempt: int = 0
    seq: int = 0
    #: the current attempt's latest cumulative report
    run: Progress = field(default_factory=Progress)

    def machine(self) -> TaskRun:
        """The part of the task the decisions in :mod:`shoal.core.jobs` act on."""
        return TaskRun(
            self.state, self.items, self.attempt, self.seq, self.progress, self.run, self.lease
        )

    def apply(self, r: TaskRun) -> None:
        self.state, self.items, self.attempt, self.seq = r.state, r.items, r.attempt, r.seq
        self.progress, self.run, self.lease = r.base, r.run, r.lease


@dataclass
class Schedule:
    id: str
    cron: str
    spec: JobSpec
    enabled: bool
    next_run: float
    last_job: str
    created: float


#: the items of a task read with ``with_items=False`` (never written back: put_task)
NO_ITEMS: list[Any] = []


class JobState:
    def __init__(self, state_dir: str) -> None:
        #: called with each job written (the master's routes wake those waiting on it)
        self.on_put_job: Callable[[Job], None] = lambda j: None
        os.makedirs(state_dir, exist_ok=True)
        self.dir = state_dir
        self.manifest_dir = os.path.join(state_dir, "manifests")
        os.makedirs(self.manifest_dir, exist_ok=True)
        self._db = sqlite3.connect(
            os.path.join(state_dir, "jobs.db"), isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        have = {r[1] for r in self._db.execute("PRAGMA table_info(tasks)")}
        for name, decl in _ADDED_TASK_COLUMNS:
            if name not in have:
                self._db.execute(f"ALTER TABLE tasks ADD COLUMN {name} {decl}")
        self._db.executescript(_COVERING)

    def close(self) -> None:
        self._db.close()

    def backup_into(self, dest: str) -> None:
        """An online, consistent copy of the database as a new file at ``dest``."""
        copy_db(self._db, dest)

    def _x(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        return self._db.execute(sql, args)

    # -- jobs -----------------------------------------------------------------------

    def put_job(self, j: Job) -> None:
        self._put_job(j)
        self.on_put_job(j)

    def _put_job(self, j: Job) -> None:
        self._x(
            "INSERT INTO jobs(id, spec, state, created, updated, finished, error, schedule, listed)"
            " VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET state=excluded.state,"
            " updated=excluded.updated, finished=excluded.finished, error=excluded.error,"
            " listed=excluded.listed",
            (
                j.id,
                json.dumps(j.spec.to_dict()),
                j.state,
                j.created,
                j.updated,
                j.finished,
                j.error,
                j.schedule,
                json.dumps(j.listed),
            ),
        )

    def jobs(self, where: str = "", args: tuple[Any, ...] = ()) -> list[Job]:
        rows = self._x(
            "SELECT id, spec, state, created, updated, finished, error, schedule, listed"
            f" FROM jobs {where} ORDER BY created",
            args,
        ).fetchall()
        return [
            Job(
                r[0],
                JobSpec.from_dict(json.loads(r[1])),
                r[2],
                r[3],
                r[4],
                r[5],
                r[6],
                r[7],
                json.loads(r[8]),
            )
            for r in rows
        ]

    def job(self, job_id: str) -> Job | None:
        found = self.jobs("WHERE id = ?", (job_id,))
        return found[0] if found else None

    # -- tasks ----------------------------------------------------------------------

    def add_tasks(self, job: str, kind: str, tasks: list[tuple[str, list[Any]]]) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO tasks(job, worker, kind, items, state) VALUES (?,?,?,?, 'pending')",
                [(job, w, kind, json.dumps(items)) for w, items in tasks],
            )
            self._db.execute("COMMIT")

    def tasks(
        self, where: str = "", args: tuple[Any, ...] = (), with_items: bool = True
    ) -> list[Task]:
        """Tasks matching ``where``. ``with_items=False`` leaves their item lists empty:
        counting a job's progress needs only the counts, and decoding every task's list
        of files on every job view made the master the bottleneck of a load of many
        small files (measured: 54% of the master's time at 20k files)."""
        items = "items" if with_items else "NULL"
        rows = self._x(
            f"SELECT id, job, worker, kind, {items}, state, progress, lease, attempt, seq, run"
            f" FROM tasks {where}",
            args,
        ).fetchall()
        return [
            Task(
                r[0],
                r[1],
                r[2],
                r[3],
                NO_ITEMS if r[4] is None else json.loads(r[4]),
                r[5],
                Progress.from_dict(json.loads(r[6])),
                r[7],
                r[8],
                r[9],
                Progress.from_dict(json.loads(r[10])),
            )
            for r in rows
        ]

    def task(self, task_id: int, with_items: bool = True) -> Task | None:
        found = self.tasks("WHERE id = ?", (task_id,), with_items)
        return found[0] if found else None

    def put_task_run(self, t: Task) -> None:
        """Write a task back but for its items (read with ``with_items=False``): a progress
        report decoded and re-encoded the task's whole file list each half second."""
        self._x(
            f"UPDATE tasks SET {_TASK_SET} WHERE id=?",
            (*_task_values(t), t.id),
        )

    def put_task(self, t: Task) -> None:
        if t.items is NO_ITEMS:
            raise ValueError(f"task {t.id} was read without its items: it cannot be written")
        self._x(
            f"UPDATE tasks SET items=?, {_TASK_SET} WHERE id=?",
            (json.dumps(t.items), *_task_values(t), t.id),
        )

    def counts(self, job: str) -> dict[str, int]:
        rows = self._x(
            "SELECT state, count(*) FROM tasks WHERE job = ? GROUP BY state", (job,)
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    # -- schedules ------------------------------------------------------------------

    def put_schedule(self, s: Schedule) -> None:
        self._x(
            "INSERT INTO schedules(id, cron, spec, enabled, next_run, last_job, created)"
            " VALUES (?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET enabled=excluded.enabled,"
            " next_run=excluded.next_run, last_job=excluded.last_job",
            (
                s.id,
                s.cron,
                json.dumps(s.spec.to_dict()),
                int(s.enabled),
                s.next_run,
                s.last_job,
                s.created,
            ),
        )

    def schedules(self) -> list[Schedule]:
        rows = self._x(
            "SELECT id, cron, spec, enabled, next_run, last_job, created"
            " FROM schedules ORDER BY created"
        ).fetchall()
        return [
            Schedule(r[0], r[1], JobSpec.from_dict(json.loads(r[2])), bool(r[3]), r[4], r[5], r[6])
            for r in rows
        ]

    def delete_schedule(self, sid: str) -> bool:
        return self._x("DELETE FROM schedules WHERE id = ?", (sid,)).rowcount > 0

    # -- manifests --------------------------------------------------------------------

    def manifest_path(self, dataset: str) -> str:
        return os.path.join(self.manifest_dir, dataset + ".msgpack")

    def write_manifest(self, dataset: str, raw: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".m-", dir=self.manifest_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
            os.replace(tmp, self.manifest_path(dataset))
        except BaseException:
            os.unlink(tmp)
            raise

    def read_manifest(self, dataset: str) -> bytes | None:
        try:
            with open(self.manifest_path(dataset), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def drop_manifest(self, dataset: str) -> None:
        try:
            os.unlink(self.manifest_path(dataset))
        except FileNotFoundError:
            pass


#: the columns of a task row besides its id and its (large) file list
_TASK_SET = "worker=?, state=?, progress=?, lease=?, attempt=?, seq=?, run=?"


def _task_values(t: Task) -> tuple[object, ...]:
    """The values of :data:`_TASK_SET`, in its order."""
    return (
        t.worker,
        t.state,
        json.dumps(t.progress.to_dict()),
        t.lease,
        t.attempt,
        t.seq,
        json.dumps(t.run.to_dict()),
    )

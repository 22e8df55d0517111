"""Jobs (load, free, sync) as plain data and pure decisions: validating a spec,
splitting files into batched tasks by ring owner, re-planning the share of a lost
worker, the life of one task (claim, report, lease missed, master restart) and adding
up progress. The master persists and carries these out; nothing here does I/O or reads
a clock (``now`` is passed in), so tests drive it with plain calls.

A job is never one task per file: files are grouped per owning worker into batches of
at most ``BATCH_FILES`` files or ``BATCH_BYTES`` bytes.

Counting (why a job's counts always add up): every claim of a task starts a new
*attempt*; a worker reports the cumulative progress of its attempt with a rising
sequence number, so a report that is late, repeated or from an attempt the master no
longer runs is ignored, never added twice. A task's count is ``base`` (items finished
by earlier attempts and no longer in the task) plus its current attempt's latest
report; an attempt that is abandoned (lease missed, worker lost) counts for nothing and
its items are counted by whoever runs them next. The task is done only when the final
report of the current attempt arrives, so a finished job has counted every report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from shoal.core.ring import Ring
from shoal.errors import InvalidArgument

JobKind = Literal["load", "free", "sync"]
KINDS = ("load", "free", "sync")

# job states
PENDING, LISTING, RUNNING, DONE, FAILED, STOPPED = (
    "pending",
    "listing",
    "running",
    "done",
    "failed",
    "stopped",
)
ACTIVE = (PENDING, LISTING, RUNNING)
FINAL = (DONE, FAILED)
#: states after which a job does nothing more (unless resumed)
ENDED = (DONE, FAILED, STOPPED)

# task kinds and states
T_LIST, T_LOAD, T_FREE, T_INVALIDATE = "list", "load", "free", "invalidate"
#: a load run again on a worker that came back, for the share that was reassigned away
#: from it while it was gone (not counted in the job's files: they were counted once)
T_HANDBACK = "handback"
T_PENDING, T_RUNNING, T_DONE = "pending", "running", "done"
#: the task's worker was lost and its items were planned onto other workers
T_REASSIGNED = "reassigned"
#: a reassigned task whose worker came back and was handed its share again
T_RETURNED = "returned"
#: task states in which a task will not run again
T_SETTLED = (T_DONE, T_REASSIGNED, T_RETURNED)

#: a task of tiny files is over in a fraction of a second on a fast source: 512 files
#: a task made the claims and final reports (and the master's per-task work) the limit
#: of a load of 1-4 KB files; larger files hit BATCH_BYTES first
BATCH_FILES = 4096
BATCH_BYTES = 256 << 20
#: failures kept per task (the counts are always complete)
MAX_FAILURES = 100


@dataclass(frozen=True)
class JobSpec:
    kind: str
    dataset: str
    #: key paths ('<mount>/<rel>') whose files are meant; "" = the whole dataset
    paths: tuple[str, ...] = ("",)
    glob: str | None = None
    #: an explicit list of key paths (from --files-from); None = take paths/glob
    files: tuple[str, ...] | None = None
    metadata_only: bool = False
    #: copies to load (default: the dataset's replicas)
    replicas: int | None = None
    verify: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgument(f"unknown job kind {self.kind!r}: use load, free or sync")
        if self.replicas is not None and not 1 <= self.replicas <= 16:
            raise InvalidArgument(f"invalid replicas {self.replicas}: use 1..16")
        if self.kind != "load" and (self.metadata_only or self.verify or self.replicas):
            raise InvalidArgument("--metadata-only, --verify and --replicas are for load jobs")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["paths"] = list(self.paths)
        d["files"] = None if self.files is None else list(self.files)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobSpec:
        try:
            files = d.get("files")
            return cls(
                kind=str(d["kind"]),
                dataset=str(d["dataset"]),
                paths=tuple(str(p) for p in d.get("paths") or [""]),
                glob=d.get("glob") or None,
                files=None if files is None else tuple(str(f) for f in files),
                metadata_only=bool(d.get("metadata_only", False)),
                replicas=None if d.get("replicas") is None else int(d["replicas"]),
                verify=bool(d.get("verify", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"invalid job spec: {exc}") from None

    def prefixes(self) -> list[str]:
        """What to list for this job: the given paths, or the named files' own paths."""
        if self.files is not None:
            return sorted(set(self.files))
        return list(self.paths) or [""]


@dataclass
class Progress:
    files_total: int = 0
    bytes_total: int = 0
    files_done: int = 0
    bytes_done: int = 0
    files_skipped: int = 0
    files_failed: int = 0
    failures: list[list[str]] = field(default_factory=list)

    def add(self, other: Progress) -> None:
        self.files_total += other.files_total
        self.bytes_total += other.bytes_total
        self.files_done += other.files_done
        self.bytes_done += other.bytes_done
        self.files_skipped += other.files_skipped
        self.files_failed += other.files_failed
        room = MAX_FAILURES - len(self.failures)
        if room > 0:
            self.failures.extend(other.failures[:room])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Progress:
        return cls(
            **{
                k: d.get(k, 0)
                for k in (
                    "files_total",
                    "bytes_total",
                    "files_done",
                    "bytes_done",
                    "files_skipped",
                    "files_failed",
                )
            },
            failures=list(d.get("failures") or []),
        )


Item = list[Any]  # a load item: [path, size, version]


def owners_for(path: str, dataset: str, ring: Ring, replicas: int, local: bool) -> list[str]:
    """The workers that should hold a file: ring owners, or every worker for placement=local."""
    if local:
        return list(ring.members)
    return ring.owners(f"{dataset}/{path}", replicas)


def plan(
    dataset: str,
    items: Iterable[Item],
    ring: Ring,
    replicas: int,
    local: bool = False,
    batch_files: int | None = None,
    batch_bytes: int | None = None,
) -> list[tuple[str, list[Item]]]:
    """Split load items into (worker, batch) tasks by owner."""
    # read at call time, not bound as defaults: shoal.testing shrinks batches for tests
    batch_files = batch_files or BATCH_FILES
    batch_bytes = batch_bytes or BATCH_BYTES
    per: dict[str, list[list[Item]]] = {}
    #: bytes in each worker's last batch (summing the batch per item was quadratic)
    held: dict[str, int] = {}
    for item in items:
        size = int(item[1])
        for w in owners_for(item[0], dataset, ring, replicas, local):
            batches = per.setdefault(w, [[]])
            cur = batches[-1]
            if cur and (len(cur) >= batch_files or held[w] + size > batch_bytes):
                cur = []
                batches.append(cur)
                held[w] = 0
            cur.append(item)
            held[w] = held.get(w, 0) + size
    return [(w, b) for w, batches in sorted(per.items()) for b in batches if b]


def replan(
    dataset: str, items: Sequence[Item], ring: Ring, replicas: int, local: bool
) -> list[tuple[str, list[Item]]]:
    """The share of a lost worker, given to the workers the current ring (which no longer
    has it) names instead. Walking clockwise, the owner promoted into a file's replica
    set is the last of its first ``replicas`` owners, so that is where the copy goes.
    """
    if local:
        return []  # every other worker already has its own copy planned
    out: dict[str, list[Item]] = {}
    for item in items:
        owners = ring.owners(f"{dataset}/{item[0]}", replicas)
        if owners:
            out.setdefault(owners[-1], []).append(item)
    return sorted(out.items())


def handback(
    dataset: str,
    items: Iterable[Item],
    current: Callable[[str], Any],
    ring: Ring,
    replicas: int,
    local: bool,
    worker: str,
) -> list[tuple[str, list[Item]]]:
    """The tasks that give a returning ``worker`` back the items it owns on ``ring``,
    at their ``current(path)`` manifest entry (a sync may have come since; a path with
    none is gone)."""
    fresh = []
    for it in items:
        e = current(it[0])
        if e is not None:
            fresh.append([e.path, e.size, e.version])
    return [(w, b) for w, b in plan(dataset, fresh, ring, replicas, local) if w == worker]


# -- one task's life --------------------------------------------------------------------


@dataclass(frozen=True)
class TaskReport:
    """A worker's report on the attempt it runs (``POST /api/v1/tasks/{id}``)."""

    attempt: int
    #: rises with every report of an attempt; the final one is the highest
    seq: int
    #: cumulative progress of this attempt so far (the final report: all of it)
    progress: Progress
    final: bool = False
    #: on a final report of a stopped attempt: the items it did not get to
    remaining: list[Item] | None = None
    #: a listing's result: [path, size, version, mtime] (None: the listing failed)
    entries: list[list[Any]] | None = None
    missing: tuple[str, ...] = ()

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> TaskReport:
        try:
            progress = body.get("progress") or {}
            remaining = body.get("remaining")
            entries = body.get("entries")
            if not isinstance(progress, dict):
                raise TypeError("progress must be an object")
            if remaining is not None and not isinstance(remaining, list):
                raise TypeError("remaining must be a list")
            if entries is not None and not isinstance(entries, list):
                raise TypeError("entries must be a list")
            return cls(
                attempt=int(body.get("attempt", 0)),
                seq=int(body.get("seq", 0)),
                progress=Progress.from_dict(progress),
                final=bool(body.get("final", False)),
                remaining=remaining or None,
                entries=entries,
                missing=tuple(str(m) for m in body.get("missing") or ()),
            )
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"invalid task report: {exc}") from None

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "attempt": self.attempt,
            "seq": self.seq,
            "progress": self.progress.to_dict(),
            "final": self.final,
        }
        if self.remaining:
            body["remaining"] = self.remaining
        if self.entries is not None:
            body["entries"] = self.entries
            body["missing"] = list(self.missing)
        return body


@dataclass(frozen=True)
class TaskRun:
    """What the decisions about a task need (the master keeps its id, job, worker)."""

    state: str
    items: list[Item]
    attempt: int = 0
    seq: int = 0
    #: counted for items finished by earlier attempts (no longer in ``items``)
    base: Progress = field(default_factory=Progress)
    #: the current attempt's latest cumulative report
    run: Progress = field(default_factory=Progress)
    lease: float = 0.0


def _plus(a: Progress, b: Progress) -> Progress:
    out = Progress.from_dict(a.to_dict())
    out.add(b)
    return out


def counted(t: TaskRun) -> Progress:
    """What a task contributes to its job's counts."""
    if t.state in (T_REASSIGNED, T_RETURNED):
        return t.base  # its items are counted by the tasks they moved to
    return _plus(t.base, t.run)


def claimed(t: TaskRun, now: float, lease: float) -> TaskRun:
    """A worker takes the task: a new attempt, counting from nothing."""
    return replace(
        t, state=T_RUNNING, attempt=t.attempt + 1, seq=0, run=Progress(), lease=now + lease
    )


@dataclass(frozen=True)
class Verdict:
    #: the report was taken into the counts
    accepted: bool
    #: tell the worker to stop this attempt (job stopped, or the attempt is not current)
    stop: bool


def reported(
    t: TaskRun, r: TaskReport, job_active: bool, now: float, lease: float
) -> tuple[TaskRun, Verdict]:
    """Apply a worker's report to its task."""
    if t.state != T_RUNNING or r.attempt != t.attempt:
        return t, Verdict(False, True)  # a stale attempt: whoever runs it now counts
    if r.seq <= t.seq:
        return t, Verdict(False, not job_active)  # late or repeated: already counted
    t = replace(t, seq=r.seq, run=r.progress, lease=now + lease)
    if r.final:
        base = _plus(t.base, t.run)
        if r.remaining:  # stopped part way: the rest waits for a resume
            t = replace(t, state=T_PENDING, items=r.remaining, base=base, run=Progress())
        else:
            t = replace(t, state=T_DONE, base=base, run=Progress())
    return t, Verdict(True, not job_active)


def abandoned(t: TaskRun) -> TaskRun:
    """The current attempt will not report again (lease missed): run it afresh."""
    return replace(t, state=T_PENDING, run=Progress(), lease=0.0)


def given_up(t: TaskRun, why: str, load: bool) -> TaskRun:
    """A task that missed too many leases is over; a load's unfinished items fail."""
    run = Progress()
    if load:
        run = Progress(
            files_failed=len(t.items), failures=[[i[0], why] for i in t.items[:MAX_FAILURES]]
        )
    return replace(t, state=T_DONE, base=_plus(t.base, run), run=Progress(), lease=0.0)


def master_restarted(t: TaskRun, now: float, lease: float) -> TaskRun:
    """A restarted master gives every running attempt a fresh lease period, as
    membership gives every worker a fresh expiry: a worker that is still running the
    attempt goes on reporting to it, and one that is gone misses the lease."""
    if t.state != T_RUNNING:
        return t
    return replace(t, lease=now + lease)


def settled(states: Iterable[str]) -> bool:
    """Whether a job's tasks are all finished (reassigned ones live on elsewhere)."""
    return all(s in T_SETTLED for s in states)


# -- watchers (GET /api/v1/watch) -------------------------------------------------------

#: a watcher heard from this recently holds up jobs until it acknowledges their change
WATCH_RECENT = 10.0
#: longest a job waits for lagging watchers before it is reported done anyway
WATCH_GRACE = 5.0


@dataclass(frozen=True)
class Watcher:
    #: the datasets generation it last polled with (what it has applied)
    since: int
    #: when it last polled or was answered
    seen: float
    #: polls of it in progress now
    waiting: int = 0


def lagging(watchers: Mapping[str, Watcher], generation: int, now: float) -> list[str]:
    """Recent watchers that have not yet polled with ``since >= generation``."""
    return sorted(
        wid
        for wid, w in watchers.items()
        if w.since < generation and (w.waiting or now - w.seen <= WATCH_RECENT)
    )

"""Jobs (load, free, sync) as plain data and pure decisions: validating a spec,
splitting files into batched tasks by ring owner, re-planning the share of a lost
worker, and adding up progress. The master persists and carries these out.

A job is never one task per file: files are grouped per owning worker into batches of
at most ``BATCH_FILES`` files or ``BATCH_BYTES`` bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
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

# task kinds and states
T_LIST, T_LOAD, T_FREE, T_INVALIDATE = "list", "load", "free", "invalidate"
T_PENDING, T_RUNNING, T_DONE = "pending", "running", "done"

BATCH_FILES = 512
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
    batch_files: int = BATCH_FILES,
    batch_bytes: int = BATCH_BYTES,
) -> list[tuple[str, list[Item]]]:
    """Split load items into (worker, batch) tasks by owner."""
    per: dict[str, list[list[Item]]] = {}
    for item in items:
        for w in owners_for(item[0], dataset, ring, replicas, local):
            batches = per.setdefault(w, [[]])
            cur = batches[-1]
            if cur and (
                len(cur) >= batch_files or sum(int(i[1]) for i in cur) + int(item[1]) > batch_bytes
            ):
                cur = []
                batches.append(cur)
            cur.append(item)
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

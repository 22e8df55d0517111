"""The master's HTTP control API: routes, request/response shapes and error bodies.

Worker, client and master all import this module, so a route or a field changes in one
place; worker, client and CLI call the routes through :mod:`shoal.proto.master_api`
only. Bodies are JSON, except a dataset's manifest and large task reports (msgpack);
every error response is ``{"error": {"code", "message"}}`` with ``code`` taken from
:mod:`shoal.errors`, so the far side rebuilds the same exception class with
:func:`raise_for_error`.

The control API is off the data path: workers register and heartbeat, clients fetch the
ring and dataset definitions, operators create datasets and read reports.

Watching for changes (``GET /api/v1/watch?since=N&timeout=S&watcher=ID``): a client
that caches what the master describes (the FUSE mount: kernel attributes and pages)
long-polls this route. The answer is ``{"datasets_generation": G}`` (200) as soon as the
master's datasets generation G is greater than ``since``, or when ``timeout`` seconds
(a float, default 30, capped at 60) have passed, with the current G then. ``watcher``
(required; 1-256 printable characters, stable for the process) names the watcher. The
generation moves on every dataset create, update and delete and every new manifest
(a load's or sync's listing).

The master remembers each watcher's last ``since`` and when it last polled or was
answered. A poll is the watcher's acknowledgement that it has applied every change up
to ``since``, so a watcher applies the change (invalidates what it cached) *before* it
polls again with the new G. A job that produced a new generation (``sync``; also a
load, whose listing saves a manifest) is reported ``done`` only once every watcher heard
from in the last 10 s has polled again with ``since >= `` that generation, or after 5 s
(the master then logs a WARNING naming the lagging watchers). Hence after ``shoal sync
--wait`` returns, every live watcher has applied the sync. A watcher that goes away
holds up no job for more than 5 s, and none at all once it has been silent for 10 s.
Watchers are kept in the master's memory only: after a master restart they count again
from their next poll.

Waiting for a job (``GET /api/v1/jobs/{id}?wait=S``): the job's view, as without
``wait``, but answered only once the job is ``done``, ``failed`` or ``stopped``, or
when S seconds (a float, capped at 30) have passed, with its view then. A writer that
awaits its sync job this way learns of its end when it happens, not at its next poll.
A master from before this parameter answers at once; shoal's client
(``MasterAPI.job``) then pauses 0.1 s before it returns such an early answer, so a
caller that loops on it polls that master.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict
from urllib.parse import quote

from shoal.core.ring import DEFAULT_VNODES, Ring
from shoal.errors import (
    NotFound,
    ProtocolError,
    ShoalError,
    Unavailable,
    from_code,
    http_status_of,
)

API_PREFIX = "/api/v1"

HEALTH = f"{API_PREFIX}/health"
DATASETS = f"{API_PREFIX}/datasets"
DATASET = f"{API_PREFIX}/datasets/{{name}}"
WORKER_REGISTER = f"{API_PREFIX}/workers/register"
WORKER_HEARTBEAT = f"{API_PREFIX}/workers/{{id}}/heartbeat"
RING = f"{API_PREFIX}/ring"
#: take a worker out of the ring; it hands its files over, then leaves (admin)
WORKER_DRAIN = f"{API_PREFIX}/workers/{{id}}/drain"
REPORT = f"{API_PREFIX}/report"
WATCH = f"{API_PREFIX}/watch"
JOBS = f"{API_PREFIX}/jobs"
JOB = f"{API_PREFIX}/jobs/{{id}}"
#: a worker long-polls this for a task (``?wait=S``, at most 30 s)
CLAIM = f"{API_PREFIX}/workers/{{id}}/tasks"
#: a worker reports on a task here (JSON, or msgpack for large listing results)
TASK = f"{API_PREFIX}/tasks/{{id}}"
#: the dataset's manifest as msgpack bytes, its id in the MANIFEST_HEADER
MANIFEST = f"{API_PREFIX}/datasets/{{name}}/manifest"
MANIFEST_HEADER = "X-Shoal-Manifest"
#: the master's online backup (a tar, see shoal.master.backup)
BACKUP = f"{API_PREFIX}/backup"
BACKUP_HEADER = "X-Shoal-Backup-Created"
#: tokens minted by the master (admin only)
TOKENS = f"{API_PREFIX}/tokens"
MSGPACK = "application/msgpack"
#: longest a watch poll is held open (seconds); a larger ``timeout`` is capped to it
WATCH_MAX_TIMEOUT = 60.0
WATCH_DEFAULT_TIMEOUT = 30.0
METRICS = "/metrics"

#: message used for 500 responses; the details go to the master's log, not the wire
INTERNAL_ERROR_MESSAGE = "internal error in the master; see its log"


def dataset_path(name: str) -> str:
    """``/api/v1/datasets/<name>`` with the name quoted for a URL."""
    return DATASET.format(name=quote(name, safe=""))


def job_path(job_id: str, action: str = "") -> str:
    """``/api/v1/jobs/<id>[/<action>]`` with the id quoted for a URL."""
    path = JOB.format(id=quote(job_id, safe=""))
    return f"{path}/{action}" if action else path


def heartbeat_path(worker_id: str) -> str:
    """``/api/v1/workers/<id>/heartbeat`` with the id quoted for a URL."""
    return WORKER_HEARTBEAT.format(id=quote(worker_id, safe=""))


def drain_path(worker_id: str) -> str:
    """``/api/v1/workers/<id>/drain`` with the id quoted for a URL."""
    return WORKER_DRAIN.format(id=quote(worker_id, safe=""))


def claim_path(worker_id: str) -> str:
    """``/api/v1/workers/<id>/tasks`` with the id quoted for a URL."""
    return CLAIM.format(id=quote(worker_id, safe=""))


def task_path(task_id: int) -> str:
    """``/api/v1/tasks/<id>``."""
    return TASK.format(id=int(task_id))


def manifest_path(name: str) -> str:
    """``/api/v1/datasets/<name>/manifest`` with the name quoted for a URL."""
    return MANIFEST.format(name=quote(name, safe=""))


# --- datasets ---------------------------------------------------------------------------


class MountBody(TypedDict):
    name: str
    uri: str
    options: NotRequired[dict[str, str]]


class CreateDatasetRequest(TypedDict):
    name: str
    mounts: list[MountBody]
    #: any subset of CachePolicy fields; the rest take their defaults
    policy: NotRequired[dict[str, Any]]


class PatchDatasetRequest(TypedDict):
    #: the fields to change; the others keep their current values
    policy: dict[str, Any]


class DatasetBody(TypedDict):
    """``Dataset.to_dict()``."""

    name: str
    mounts: list[MountBody]
    policy: dict[str, Any]
    generation: int


class DatasetListResponse(TypedDict):
    datasets: list[DatasetBody]


class DeleteDatasetResponse(TypedDict):
    deleted: str


class HealthResponse(TypedDict, total=False):
    ok: bool
    version: str
    #: whether the master requires tokens
    auth: bool


# --- workers and the ring ---------------------------------------------------------------


class TierDecl(TypedDict):
    name: str
    path: str
    capacity: int


class RegisterRequest(TypedDict):
    id: str
    host: str
    port: int
    uds: str
    node: str
    tiers: list[TierDecl]
    #: the TCP port speaks TLS
    tls: NotRequired[bool]


class RegisterResponse(TypedDict):
    epoch: int
    heartbeat_interval: float
    datasets_generation: int


class BytesBySource(TypedDict):
    local: int
    remote: int
    ufs: int


class TierStats(TypedDict):
    name: str
    path: str
    capacity: int
    used: int
    pages: int


class DatasetStats(TypedDict):
    cached_files: int
    cached_bytes: int
    hits: int
    misses: int
    bytes_by_source: BytesBySource


class WorkerStats(TypedDict, total=False):
    """What a worker reports in each heartbeat; every key may be missing."""

    tiers: list[TierStats]
    datasets: dict[str, DatasetStats]
    corrupt_pages: int


class HeartbeatRequest(TypedDict, total=False):
    stats: WorkerStats


class HeartbeatResponse(TypedDict):
    epoch: int
    datasets_generation: int
    #: False: the master does not know this worker (restart or expiry): register again
    known: bool
    #: the worker is out of the ring: hand its files over, then report "drained"
    draining: NotRequired[bool]
    #: the master took the worker's "drained": it has left the cluster
    left: NotRequired[bool]


class RingWorker(TypedDict):
    id: str
    host: str
    port: int
    uds: str
    node: str
    #: its TCP port speaks TLS (absent from an older master: clients decide by their CA)
    tls: NotRequired[bool]


class RingResponse(TypedDict):
    epoch: int
    vnodes: int
    workers: list[RingWorker]
    datasets_generation: int
    #: earlier rings, newest first: {epoch, age_s, workers: [id], holders: {id:
    #: [dataset]}} (shoal.master.ringhistory); new owners ask previous ones
    history: NotRequired[list[dict[str, Any]]]
    #: reachable workers not in the ring (draining), for peer transfers only
    peers: NotRequired[list[RingWorker]]


def ring_from_response(body: RingResponse) -> Ring:
    """The :class:`~shoal.core.ring.Ring` a ``GET /api/v1/ring`` answer describes;
    ProtocolError when the answer is not in that shape."""
    try:
        return Ring.build(
            int(body["epoch"]),
            [str(w["id"]) for w in body["workers"]],
            int(body.get("vnodes", DEFAULT_VNODES)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed ring answer from the master: {exc!r}") from None


# --- watch ------------------------------------------------------------------------------


class WatchResponse(TypedDict):
    datasets_generation: int


# --- report -----------------------------------------------------------------------------


class ReportDataset(TypedDict):
    name: str
    cached_files: int
    cached_bytes: int
    hits: int
    misses: int
    #: 0..1; byte-weighted when workers report bytes, else by count; 0 with no reads
    hit_ratio: float
    bytes_by_source: BytesBySource


class ReportTier(TypedDict):
    name: str
    capacity: int
    used: int
    pages: int


class ReportWorkerDataset(TypedDict):
    cached_files: int
    cached_bytes: int


class ReportWorker(TypedDict):
    id: str
    host: str
    port: int
    node: str
    state: str  # "live" | "expired" | "draining" | "left"
    last_heartbeat_age_s: float
    capacity: int
    used: int
    tiers: list[ReportTier]
    #: what the worker caches of each dataset (absent from older masters)
    datasets: NotRequired[dict[str, ReportWorkerDataset]]
    #: files_in, bytes_in (from previous owners), files_out, bytes_out (drain)
    moved: NotRequired[dict[str, int]]


class ReportTotals(TypedDict):
    epoch: int
    datasets: int
    workers_live: int
    workers_expired: int
    capacity: int
    used: int
    cached_files: int
    cached_bytes: int
    hits: int
    misses: int
    hit_ratio: float
    bytes_by_source: BytesBySource
    corrupt_pages: int
    #: files and bytes new owners got from previous owners when the ring moved
    moved_files: NotRequired[int]
    moved_bytes: NotRequired[int]
    #: files and bytes draining workers handed to their next owners
    handed_over_files: NotRequired[int]
    handed_over_bytes: NotRequired[int]


class ReportResponse(TypedDict):
    datasets: list[ReportDataset]
    workers: list[ReportWorker]
    totals: ReportTotals


# --- errors -----------------------------------------------------------------------------


class ErrorDetail(TypedDict):
    code: str
    message: str


class ErrorBody(TypedDict):
    error: ErrorDetail


def http_status(exc: BaseException) -> int:
    """The HTTP status the master answers ``exc`` with: the error table's
    (:attr:`ShoalError.http_status <shoal.errors.ShoalError>`), 500 outside the tree."""
    return http_status_of(exc)


def error_body(exc: BaseException) -> ErrorBody:
    """The JSON body for an error response: the error's code, and its message unless
    the status is 5xx (then the details are in the master's log only); anything outside
    the shoal tree is a generic ``io``."""
    if not isinstance(exc, ShoalError):
        return {"error": {"code": ShoalError.code, "message": INTERNAL_ERROR_MESSAGE}}
    message = exc.message if exc.http_status < 500 else INTERNAL_ERROR_MESSAGE
    return {"error": {"code": exc.code, "message": message}}


def raise_for_error(status: int, body: Any) -> None:
    """Raise the shoal error an error response carries; return quietly on 1xx-3xx.

    ``body`` is the decoded JSON (None when there was none or it was not JSON). An
    error in the ``{"error": {"code", "message"}}`` shape comes back as the class of
    its code. One without that body did not come from the master's error handler: a
    5xx (a proxy in the way, the master restarting) raises
    :class:`~shoal.errors.Unavailable`, a 404 :class:`~shoal.errors.NotFound`, and
    anything else :class:`~shoal.errors.ProtocolError`.
    """
    if status < 400:
        return
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict) and isinstance(detail.get("code"), str):
        message = detail.get("message")
        # an empty message: the class's own docstring says what went wrong
        raise from_code(detail["code"], message if isinstance(message, str) else "")
    if 500 <= status < 600:
        raise Unavailable(
            f"master answered HTTP {status} without an error body "
            "(a proxy in the way, or the master restarting)"
        )
    if status == 404:
        raise NotFound(f"master answered HTTP {status} without an error body")
    raise ProtocolError(f"master answered HTTP {status} without an error body")

"""The data-path server: the binary protocol of shoal.proto.wire on uvloop, over TCP
and a Unix socket.

Three parts: :class:`DataService` (here) admits connections and routes each typed
request (shoal.proto.messages) to the fast path (answered synchronously inside
``data_received``: no task, no await) or the slow path (a task), after catching up with
the dataset definitions the reader knows; :class:`~shoal.worker.ops.Ops` does each op's
work; :class:`~shoal.worker.conn.Conn` is one connection's frame loop and sends the
answers (``os.sendfile`` straight from the page store's files when the socket can take
them, open descriptors over SCM_RIGHTS to local clients instead of bytes).

Hostile or broken peers (issue 10) meet the limits of shoal.proto.wire, all checked
with integer comparisons before any work: a frame over its op's size cap is refused
before its body is buffered, all connections together buffer at most
``wire.MAX_BUFFERED`` bytes of incomplete frames, a peer holds at most
``wire.CONNS_PER_PEER`` connections, idle connections are closed after
``wire.IDLE_TIMEOUT``, and requests are checked for type, count and range when they
are decoded. A malformed frame whose length is known gets the protocol error and the
connection goes on; one that breaks the framing gets the error and a close. Refusals
are logged aggregated (one line per interval with a count), never a traceback per
frame. A ``DROP`` is honoured only if the worker's own check of the page fails.

Authentication (issue 13): with the cluster secret, :meth:`DataService.authenticate`
verifies the token of each connection's HELLO once (shoal.core.tokens) and the
connection keeps the claims; :meth:`DataService.admit_request` checks each request's
dataset against them (a set lookup) before any work, on both sockets. Refusals are
counted by reason (``shoal_worker_auth_refusals_total``) and logged aggregated with the
reason and the name the token claims, never the token; ``auth_checks`` counts the
tokens verified (one per connection).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from shoal.core.paging import pages_for_range
from shoal.core.tokens import DATASET, MISSING, Claims, claimed_name, reason, verify
from shoal.errors import (
    DatasetNotFound,
    PermissionDenied,
    ProtocolError,
    ShoalError,
    StaleLayout,
    Unauthenticated,
    Unavailable,
)
from shoal.proto import wire
from shoal.proto.messages import (
    AnyRequest,
    BatchRequest,
    DataRequest,
    DropRequest,
    HelloReply,
    HelloRequest,
    ListReply,
    ListRequest,
    LocateDirRequest,
    LocateReply,
    LocateRequest,
    ReadRequest,
    StatReply,
    StatRequest,
    TouchRequest,
)
from shoal.store.space import Aggregated
from shoal.worker.conn import Conn
from shoal.worker.handover import DirAnswers
from shoal.worker.loader import Loader, Pages
from shoal.worker.metrics import ReadLatency
from shoal.worker.ops import DATASET_LOCATE_MAX, Answer, Ops
from shoal.worker.peers import NOT_CACHED
from shoal.worker.stats import Stats

if TYPE_CHECKING:
    from shoal.proto.wire import Op

log = logging.getLogger("shoal.worker.server")

#: seconds between aggregated log lines of one kind of refusal
LOG_EVERY = 10.0
#: tries (REFRESH_PAUSE apart) to catch up with a reader's newer definitions
_CATCH_UP_TRIES = 3
_REFRESH_PAUSE = 0.2
_GIVE_UP_FOR = 2.0
_MISS = LocateReply(miss=True)
#: what a refused client is told to pass (the master says the same)
WHAT_TO_PASS = (
    "set SHOAL_TOKEN or SHOAL_TOKEN_FILE (shoal up writes one), "
    "or ask an admin for one (shoal token create)"
)

__all__ = ["DATASET_LOCATE_MAX", "Answer", "Conn", "DataService"]


def _max_conns() -> int:
    """Connections the worker accepts in all: wire.MAX_CONNS, and never more than a
    quarter of its descriptor limit (each connection takes two, and the page store and
    handed-over answers need the rest)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return wire.MAX_CONNS
    return max(16, min(wire.MAX_CONNS, soft // 4))


def _page_size(req: DataRequest) -> int:
    """The page size (layout) a reader slices the answer with; 0: none, or not checked."""
    return getattr(req, "page_size", 0) or 0


def _generation(req: DataRequest) -> int | None:
    """The dataset generation the reader knows (a worker behind it catches up)."""
    gen: int | None = getattr(req, "generation", None)
    return gen


class DataService:
    """What the data path can do; connection handling lives in :class:`Conn`."""

    def __init__(
        self,
        loader: Loader,
        stats: Stats,
        worker_id: str,
        node: str,
        secret: bytes | None = None,
    ) -> None:
        #: the cluster secret tokens are checked with; None: every connection is served
        self.secret = secret
        #: tokens verified (one per connection's HELLO), refusals by reason
        self.auth_checks = 0
        self.auth_refusals: Counter[str] = Counter()
        self.loader = loader
        self.stats = stats
        #: shoal_read_seconds: read latency by op and source (worker/metrics.py)
        self.latency = ReadLatency()
        self.worker_id = worker_id
        self.node = node
        self.epoch = 0
        #: asks the master for dataset definitions; True if anything changed
        self.refresh_datasets: Callable[[], Awaitable[bool]] | None = None
        self.dirs = DirAnswers(self._locations_stamp)
        self.ops = Ops(loader, stats, self.dirs, self.note)
        #: dataset -> when catching up with a reader's definitions last failed
        self._gave_up: dict[str, float] = {}
        #: open connections, connections per peer, bytes reserved by incomplete frames
        self.conns: set[Conn] = set()
        self.peers: dict[Any, int] = {}
        self.buffered = 0
        self.max_conns = _max_conns()
        self._sweeping = False
        #: refusals and internal errors, logged one line per interval with a count
        self.notes = Aggregated(log, LOG_EVERY)
        self._internal_at = -LOG_EVERY
        self._internal_quiet = 0

    def note(self, kind: str, detail: str) -> None:
        """Log a refused frame or connection, aggregated (one line per LOG_EVERY s)."""
        self.notes.note(kind, f"%d {kind} in the last %.0fs (last: %s)", detail)

    def internal(self, op: Op, exc: Exception) -> ShoalError:
        """An unexpected error serving ``op``: its traceback is logged at most once per
        LOG_EVERY seconds (the others are counted in the next one)."""
        now = time.monotonic()
        if now - self._internal_at >= LOG_EVERY:
            more = f" ({self._internal_quiet} more not shown)" if self._internal_quiet else ""
            log.error("internal error serving %s%s", op.name, more, exc_info=exc)
            self._internal_at, self._internal_quiet = now, 0
        else:
            self._internal_quiet += 1
        return ShoalError(f"internal error in worker serving {op.name}")

    def hello(self) -> HelloReply:
        return HelloReply(wire.VERSION, self.worker_id, self.node, self.epoch)

    # -- authentication -----------------------------------------------------------------

    def authenticate(self, hello: HelloRequest, peer: Any) -> Claims | None:
        """The claims of a HELLO's token (None: this worker checks no tokens); for a
        missing, forged, expired or malformed one, Unauthenticated saying what to pass,
        counted and logged (the reason and the name the token claims, never the token)."""
        secret = self.secret
        if secret is None:
            return None
        token = hello.token
        if not token:
            self._refused(MISSING, f"{peer}: no token")
            raise Unauthenticated(f"worker {self.worker_id} requires a token: {WHAT_TO_PASS}")
        self.auth_checks += 1
        try:
            return verify(secret, token)
        except Unauthenticated as exc:
            self._refused(reason(exc), f"{peer}: {exc.message} (sub {claimed_name(token)})")
            raise Unauthenticated(
                f"worker {self.worker_id} refused the token: {exc.message}: {WHAT_TO_PASS}"
            ) from None

    def admit_request(self, claims: Claims, req: DataRequest, peer: Any) -> None:
        """Raise unless ``claims`` (a connection's) grant ``req``: its dataset, and a
        token still within its lifetime. Every role may read data (admin, worker: peers
        read pages from each other; reader), a reader token scoped to datasets only
        those."""
        ds = claims.datasets
        if ds is not None and req.dataset not in ds:
            self._refused(DATASET, f"{peer}: {req.OP.name} of dataset {req.dataset!r} with token {claims.name!r}")  # fmt: skip
            raise PermissionDenied(f"token {claims.name!r} does not grant dataset {req.dataset!r}")
        if claims.expires is not None and time.time() >= claims.expires:
            self._refused("expired", f"{peer}: token {claims.name!r} expired on a connection")
            raise Unauthenticated(f"worker {self.worker_id}: token expired: {WHAT_TO_PASS}")

    def _refused(self, why: str, detail: str) -> None:
        self.auth_refusals[why] += 1
        self.note(f"connections or requests refused for their token ({why})", detail)

    # -- connections ------------------------------------------------------------------

    def admit(self, conn: Conn, peer: Any) -> bool:
        """Take a new connection, unless its peer or the worker has too many."""
        n = self.peers.get(peer, 0)
        if n >= wire.CONNS_PER_PEER:
            self.note("connections refused", f"{peer}: already {n} connections")
            return False
        if len(self.conns) >= self.max_conns:
            self.note(
                "connections refused", f"{peer}: the worker has {len(self.conns)} connections"
            )
            return False
        self.peers[peer] = n + 1
        self.conns.add(conn)
        if not self._sweeping:
            self._sweeping = True
            asyncio.get_running_loop().call_later(wire.IDLE_TIMEOUT / 4, self._sweep)
        return True

    def release(self, conn: Conn, peer: Any) -> None:
        if conn in self.conns:
            self.conns.discard(conn)
            n = self.peers.get(peer, 1) - 1
            if n > 0:
                self.peers[peer] = n
            else:
                self.peers.pop(peer, None)

    def _sweep(self) -> None:
        """Close connections that received nothing for IDLE_TIMEOUT seconds (checked
        every quarter of it) while no request of theirs was in flight."""
        for conn in list(self.conns):
            conn.sweep()
        if self.conns:
            asyncio.get_running_loop().call_later(wire.IDLE_TIMEOUT / 4, self._sweep)
        else:
            self._sweeping = False

    def _locations_stamp(self) -> tuple[int, int] | None:
        changes = self.loader.store.changes()
        return None if changes is None else (changes, self.loader.dead_changes)

    # -- the reader's definitions -----------------------------------------------------

    def _layout_ok(self, req: DataRequest) -> bool:
        """Whether the reader's page size (when it sends one) is the one served here: a
        reader must never slice this layout's pages with another page size."""
        ps = _page_size(req)
        if not ps:
            return True
        return int(ps) == self.loader.table.get(req.dataset).policy.page_size

    def _current(self, req: DataRequest) -> bool:
        """Whether this worker knows the dataset at least at the reader's generation (a
        reader that saw a sync must not be answered from the old manifest: under
        "never revalidate" it would keep the old version until the next change)."""
        gen = _generation(req)
        if not gen:
            return True
        return int(gen) <= self.loader.table.get(req.dataset).generation

    async def _catch_up(self, req: DataRequest) -> None:
        """Refresh the definitions from the master while the reader knows newer ones
        (bounded: with the master away, or a reader that knows a dataset deleted and
        created again since, the worker answers with what it has and does not try again
        for that dataset for _GIVE_UP_FOR seconds)."""
        if self.refresh_datasets is None or (self._current(req) and self._layout_ok(req)):
            return
        name = str(req.dataset)
        now = time.monotonic()
        if now - self._gave_up.get(name, -_GIVE_UP_FOR) < _GIVE_UP_FOR:
            return
        for attempt in range(_CATCH_UP_TRIES):
            if attempt:
                await asyncio.sleep(_REFRESH_PAUSE)  # refreshes are rate limited
            await self.refresh_datasets()
            if self._current(req) and self._layout_ok(req):
                return
        self._gave_up[name] = time.monotonic()

    async def _check_layout(self, req: DataRequest) -> None:
        await self._catch_up(req)
        if not self._layout_ok(req):
            name = req.dataset
            have = self.loader.table.get(name).policy.page_size
            raise StaleLayout(
                f"dataset {name!r} is served with page size {have}, not {_page_size(req)}"
            )

    # -- fast path ------------------------------------------------------------------

    def try_fast(self, req: AnyRequest, local: bool) -> Answer | None:
        try:
            return self._try_fast(req, local)
        except DatasetNotFound:
            return None  # maybe created a moment ago: the slow path asks the master

    def _try_fast(self, req: AnyRequest, local: bool) -> Answer | None:
        if isinstance(req, HelloRequest):
            return Answer(self.hello())
        if not (self._layout_ok(req) and self._current(req)):
            return None  # the slow path catches up, or answers StaleLayout
        ops = self.ops
        if isinstance(req, ReadRequest):
            r = req
            pages = self.loader.try_cached(r.dataset, r.path, r.version, r.offset, r.length)
            return None if pages is None else ops.read_answer(r.dataset, pages, local)
        if isinstance(req, LocateRequest):
            q = req
            if q.runs and q.offset == 0 and q.length < 0:  # a whole file, asked as a run
                whole = ops.whole_run(q.dataset, q.path, q.version)
                if whole is not None:
                    return whole
            pages = self.loader.try_cached(q.dataset, q.path, q.version, q.offset, q.length)
            return None if pages is None else ops.locate_answer(q.dataset, pages, q.ahead, q.runs)
        if isinstance(req, LocateDirRequest):
            return ops.locate_dir(req.dataset, req.directory, req.runs)
        if isinstance(req, TouchRequest):
            return ops.touch(req.dataset, req.items)
        if isinstance(req, BatchRequest):
            return ops.batch_cached(req.dataset, req.paths, local)
        return None

    # -- slow path ------------------------------------------------------------------

    async def handle(self, req: AnyRequest, local: bool) -> Answer:
        try:
            return await self._handle(req, local)
        except DatasetNotFound:
            if self.refresh_datasets is None or not await self.refresh_datasets():
                raise
            return await self._handle(req, local)

    async def _handle(self, req: AnyRequest, local: bool) -> Answer:
        ops = self.ops
        if isinstance(req, DropRequest):
            return await ops.drop(req.dataset, req.path, req.version, req.index)
        if isinstance(req, HelloRequest):
            return Answer(self.hello())
        await self._check_layout(req)
        if isinstance(req, LocateDirRequest):
            return ops.locate_dir(req.dataset, req.directory, req.runs)
        loader = self.loader
        if isinstance(req, ReadRequest):
            if req.cached_only:  # a peer's ask: never fetch (a miss is said, not loaded)
                return ops.read_answer(req.dataset, await self._cached(req), local)
            pages = await loader.read(req.dataset, req.path, req.version, req.offset, req.length)
            return ops.read_answer(req.dataset, pages, local)
        if isinstance(req, LocateRequest):
            if req.cached_only:  # never fetch: say it is a miss
                return Answer(_MISS)
            pages = await loader.read(req.dataset, req.path, req.version, req.offset, req.length)
            return ops.locate_answer(req.dataset, pages, req.ahead, req.runs)
        if isinstance(req, BatchRequest):
            return await ops.batch(req.dataset, req.paths, local)
        if isinstance(req, StatRequest):
            return Answer(StatReply(await loader.stat(req.dataset, req.path)))
        if isinstance(req, ListRequest):
            return Answer(ListReply(tuple(await loader.ls(req.dataset, req.path))))
        if isinstance(req, TouchRequest):
            return ops.touch(req.dataset, req.items)
        raise ProtocolError(f"op {req.OP.name} not handled")

    async def _cached(self, r: ReadRequest) -> Pages:
        """The cached pages a peer asks for (``cached_only``): no under-storage GET ever,
        only a held version's metadata revalidated within the staleness bound (one
        HEAD, none under "never revalidate"); Unavailable(NOT_CACHED) on any miss."""
        loader = self.loader
        pages = loader.try_cached(r.dataset, r.path, r.version, r.offset, r.length)
        if pages is not None:
            return pages
        ds = loader.table.get(r.dataset)
        held = loader.store.versions(ds.name, r.path)
        if not (r.version in held if r.version is not None else len(held) == 1):
            raise Unavailable(NOT_CACHED)
        info, _ = await loader.resolve(ds, r.path, r.version)  # a held candidate: no GET
        rng = pages_for_range(info.size, ds.policy.page_size, r.offset, r.length)
        pieces = [loader.located(ds, info, i) for i in rng]
        if any(p is None for p in pieces):
            raise Unavailable(NOT_CACHED)
        return Pages(info, rng.start, [p for p in pieces if p is not None])

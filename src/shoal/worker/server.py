"""The data-path server: the binary protocol of shoal.proto.wire on uvloop, over TCP
and a Unix socket.

Requests whose answer is already cached are answered synchronously inside
``data_received`` (no task, no await); the rest run as a task. Cached bytes leave with
``os.sendfile`` straight from the page store's files when the socket can take them, and
local clients get open descriptors (SCM_RIGHTS) instead of bytes.

Hostile or broken peers (issue 10) meet the limits of shoal.proto.wire, all checked
with integer comparisons before any work: a frame over its op's size cap is refused
before its body is buffered, all connections together buffer at most
``wire.MAX_BUFFERED`` bytes of incomplete frames, a peer holds at most
``wire.CONNS_PER_PEER`` connections, idle connections are closed after
``wire.IDLE_TIMEOUT``, and arguments are checked for type, count and range
(``wire.check_args``). A malformed frame whose length is known gets the protocol error
and the connection goes on; one that breaks the framing gets the error and a close.
Refusals are logged aggregated (one line per interval with a count), never a traceback
per frame. A ``DROP`` is honoured only if the worker's own check of the page fails.
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import resource
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import xxhash

from shoal.core.paging import page_count
from shoal.core.types import NEVER, FileKey
from shoal.errors import (
    DatasetNotFound,
    InvalidArgument,
    ProtocolError,
    ShoalError,
    StaleLayout,
    Unavailable,
)
from shoal.proto import wire
from shoal.proto.wire import Op, Status
from shoal.store.base import Location
from shoal.store.space import Aggregated
from shoal.worker.handover import DirAnswers, Handover
from shoal.worker.loader import Loader, Pages, Piece, fits
from shoal.worker.stats import Stats

log = logging.getLogger("shoal.worker.server")

_BATCH_MAX = wire.MAX_BATCH
#: a whole dataset's locations are handed over in one answer up to this many files
DATASET_LOCATE_MAX = 100_000


@dataclass(slots=True)
class Reply:
    meta: Any
    pieces: list[Piece] = field(default_factory=list)
    #: descriptors to hand over (Unix socket only); closed after sending if owned
    fds: list[int] = field(default_factory=list)
    own_fds: bool = True


def _piece_len(p: Piece) -> int:
    return p.length if isinstance(p, Location) else len(p)


def _piece_ck(p: Piece) -> int:
    return p.checksum if isinstance(p, Location) else xxhash.xxh3_64_intdigest(p)


def _ahead(args: list[Any]) -> int:
    return int(args[6]) if len(args) > 6 and args[6] else 0


def _verify(loc: Location) -> bool:
    """Whether the page's bytes on disk still match their checksum (False if unreadable);
    run in a thread: it reads a whole page."""
    try:
        fd = os.open(loc.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        data = os.pread(fd, loc.length, loc.offset)
    except OSError:
        return False
    finally:
        os.close(fd)
    return len(data) == loc.length and xxhash.xxh3_64_intdigest(data) == loc.checksum


def _max_conns() -> int:
    """Connections the worker accepts in all: wire.MAX_CONNS, and never more than a
    quarter of its descriptor limit (each connection takes two, and the page store and
    handed-over answers need the rest)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return wire.MAX_CONNS
    return max(16, min(wire.MAX_CONNS, soft // 4))


#: seconds between aggregated log lines of one kind of refusal
LOG_EVERY = 10.0


#: where each op that reads pages carries the page size (layout) the reader assumes
_LAYOUT_ARG = {Op.READ: 5, Op.LOCATE: 7, Op.LOCATE_DIR: 2}
#: where ops carry the dataset generation the reader knows (a worker behind it catches up)
_GEN_ARG = {
    Op.READ: 6,
    Op.LOCATE: 8,
    Op.LOCATE_DIR: 3,
    Op.BATCH: 2,
    Op.STAT: 2,
    Op.LIST: 2,
}
#: tries (REFRESH_PAUSE apart) to catch up with a reader's newer definitions
_CATCH_UP_TRIES = 3
_REFRESH_PAUSE = 0.2
_GIVE_UP_FOR = 2.0
#: pages one TOUCH item may bump (bounds the work of one frame)
_TOUCH_PAGES_MAX = wire.MAX_TOUCH_PAGES


class DataService:
    """What the data path can do; connection handling lives in :class:`Conn`."""

    def __init__(self, loader: Loader, stats: Stats, worker_id: str, node: str) -> None:
        self.loader = loader
        self.stats = stats
        self.worker_id = worker_id
        self.node = node
        self.epoch = 0
        #: asks the master for dataset definitions; True if anything changed
        self.refresh_datasets: Callable[[], Awaitable[bool]] | None = None
        self.dirs = DirAnswers(self._locations_stamp)
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

    # -- fast path ------------------------------------------------------------------

    def try_fast(self, op: Op, args: list[Any], local: bool) -> Reply | None:
        try:
            return self._try_fast(op, args, local)
        except DatasetNotFound:
            return None  # maybe created a moment ago: the slow path asks the master

    def _layout_ok(self, op: Op, args: list[Any]) -> bool:
        """Whether the reader's page size (when it sends one) is the one served here: a
        reader must never slice this layout's pages with another page size."""
        i = _LAYOUT_ARG.get(op)
        if i is None or len(args) <= i or not args[i]:
            return True
        return int(args[i]) == self.loader.table.get(args[0]).policy.page_size

    def _current(self, op: Op, args: list[Any]) -> bool:
        """Whether this worker knows the dataset at least at the reader's generation (a
        reader that saw a sync must not be answered from the old manifest: under
        "never revalidate" it would keep the old version until the next change)."""
        i = _GEN_ARG.get(op)
        if i is None or len(args) <= i or not args[i]:
            return True
        return int(args[i]) <= self.loader.table.get(args[0]).generation

    async def _catch_up(self, op: Op, args: list[Any]) -> None:
        """Refresh the definitions from the master while the reader knows newer ones
        (bounded: with the master away, or a reader that knows a dataset deleted and
        created again since, the worker answers with what it has and does not try again
        for that dataset for _GIVE_UP_FOR seconds)."""
        if self.refresh_datasets is None or (self._current(op, args) and self._layout_ok(op, args)):
            return
        name = str(args[0])
        now = time.monotonic()
        if now - self._gave_up.get(name, -_GIVE_UP_FOR) < _GIVE_UP_FOR:
            return
        for attempt in range(_CATCH_UP_TRIES):
            if attempt:
                await asyncio.sleep(_REFRESH_PAUSE)  # refreshes are rate limited
            await self.refresh_datasets()
            if self._current(op, args) and self._layout_ok(op, args):
                return
        self._gave_up[name] = time.monotonic()

    async def _check_layout(self, op: Op, args: list[Any]) -> None:
        await self._catch_up(op, args)
        if not self._layout_ok(op, args):
            i = _LAYOUT_ARG[op]
            have = self.loader.table.get(args[0]).policy.page_size
            raise StaleLayout(
                f"dataset {args[0]!r} is served with page size {have}, not {int(args[i])}"
            )

    def _try_fast(self, op: Op, args: list[Any], local: bool) -> Reply | None:
        if not (self._layout_ok(op, args) and self._current(op, args)):
            return None  # the slow path catches up, or answers StaleLayout
        if op == Op.READ:
            pages = self.loader.try_cached(args[0], args[1], args[4], args[2], args[3])
            return None if pages is None else self._read_reply(args[0], pages, local)
        if op == Op.LOCATE:
            pages = self.loader.try_cached(args[0], args[1], args[2], args[3], args[4])
            return None if pages is None else self._locate_reply(args[0], pages, _ahead(args))
        if op == Op.LOCATE_DIR:
            return self._locate_dir(args[0], args[1])
        if op == Op.TOUCH:
            return self._touch(args[0], args[1])
        if op == Op.HELLO:
            return Reply(
                {
                    "version": wire.VERSION,
                    "worker": self.worker_id,
                    "node": self.node,
                    "epoch": self.epoch,
                }
            )
        return None

    # -- slow path ------------------------------------------------------------------

    async def handle(self, op: Op, args: list[Any], local: bool) -> Reply:
        try:
            return await self._handle(op, args, local)
        except DatasetNotFound:
            if self.refresh_datasets is None or not await self.refresh_datasets():
                raise
            return await self._handle(op, args, local)

    async def _handle(self, op: Op, args: list[Any], local: bool) -> Reply:
        if op == Op.DROP:
            return await self._drop(args[0], args[1], args[2], args[3])
        await self._check_layout(op, args)
        if op == Op.LOCATE_DIR:
            return self._locate_dir(args[0], args[1])
        if op == Op.READ:
            pages = await self.loader.read(args[0], args[1], args[4], args[2], args[3])
            return self._read_reply(args[0], pages, local)
        if op == Op.LOCATE:
            if len(args) > 5 and args[5]:  # cached only: never fetch, say it is a miss
                return Reply({"miss": True})
            pages = await self.loader.read(args[0], args[1], args[2], args[3], args[4])
            return self._locate_reply(args[0], pages, _ahead(args))
        if op == Op.BATCH:
            return await self._batch(args[0], args[1], local)
        if op == Op.STAT:
            return Reply((await self.loader.stat(args[0], args[1])).to_wire())
        if op == Op.LIST:
            return Reply([e.to_wire() for e in await self.loader.ls(args[0], args[1])])
        raise ProtocolError(f"op {op.name} not handled")

    async def _drop(self, dataset: str, path: str, version: str, index: int) -> Reply:
        """A reader says this page failed its checksum: drop (and count) it only if the
        worker's own check of the bytes on disk fails too. Anyone can send a DROP, so a
        good page stays (counted as a refused drop) and nothing is refetched for it."""
        key = FileKey(dataset, path, version).page(index)
        store = self.loader.store
        loc = store.peek(key)
        if loc is None:
            return Reply({})
        if await asyncio.to_thread(_verify, loc):
            self.stats.refused_drops += 1
            self.note("drops of a good page refused", f"/{dataset}/{path} page {index}")
            return Reply({})
        if store.peek(key) == loc:  # still the bytes just checked
            store.drop_corrupt(key)  # counted by the store
        return Reply({})

    def _read_reply(self, dataset: str, pages: Pages, local: bool) -> Reply:
        total = sum(_piece_len(p) for p in pages.pieces)
        self.stats.served(dataset, total - min(total, pages.ufs_bytes), pages.ufs_bytes, local)
        meta = {
            "v": pages.info.version,
            "size": pages.info.size,
            "mt": pages.info.mtime,
            "first": pages.first,
            "pages": [[_piece_len(p), _piece_ck(p)] for p in pages.pieces],
        }
        return Reply(meta, pages.pieces)

    def _locate_reply(self, dataset: str, pages: Pages, ahead: int = 0) -> Reply:
        """Where the requested pages are; plus, up to ``ahead`` bytes, the already cached
        pages that follow (never fetched for this), so a sequential reader of a large
        file needs one round trip per window instead of one per page."""
        h = Handover()
        out: list[list[int]] = []
        pieces: list[Piece] = list(pages.pieces)
        if ahead > 0 and pieces:
            ds = self.loader.table.get(dataset)
            ps = ds.policy.page_size
            more = min(ahead // ps, wire.MAX_AHEAD_PAGES)
            last = min(page_count(pages.info.size, ps), pages.first + len(pieces) + more)
            for i in range(pages.first + len(pieces), last):
                # peek: the client reports what it reads
                loc = self.loader.located(ds, pages.info, i, peek=True)
                if loc is None:
                    break
                pieces.append(loc)
        try:
            for p in pieces:
                slot = h.slot(p.path) if isinstance(p, Location) else None
                if slot is None:
                    out.append([-1, 0, _piece_len(p), 0])  # read it with READ instead
                else:
                    assert isinstance(p, Location)
                    out.append([slot, p.offset, p.length, p.checksum])
        except OSError:
            h.abort()
            raise
        total = sum(_piece_len(p) for p in pages.pieces)
        # the client reads these bytes itself, right away: they count as served locally
        self.stats.served(dataset, total - min(total, pages.ufs_bytes), pages.ufs_bytes, True)
        meta = {
            "v": pages.info.version,
            "size": pages.info.size,
            "mt": pages.info.mtime,
            "first": pages.first,
            "pages": out,
            "fds": h.ids,
        }
        return Reply(meta, fds=h.fds)

    def _locate_dir(self, dataset: str, directory: str | None) -> Reply:
        """Locations of every small file of a directory (None: of the whole dataset, up to
        DATASET_LOCATE_MAX files) that is cached at the version this worker would serve,
        so a new reader process needs one round trip per directory or dataset, not one
        per file. Only under "never revalidate": otherwise each open revalidates.
        ``full`` is False when descriptors ran out and some cached files were left out."""
        ds = self.loader.table.get(dataset)
        store = self.loader.store
        if ds.policy.staleness != NEVER:
            return Reply({"items": [], "fds": [], "full": False})
        if directory is None and (store.file_count(dataset) or 0) > DATASET_LOCATE_MAX:
            return Reply({"items": [], "fds": [], "full": False})
        kept = self.dirs.get(ds, directory)
        if kept is not None:
            return Reply(wire.Packed(kept[0]), fds=kept[1], own_fds=False)
        h = Handover()
        items: list[list[Any]] = []
        full = True
        files = (
            store.files(dataset) if directory is None else store.files_in_dir(dataset, directory)
        )
        try:
            for fk in files:
                info = self.loader.current(ds, fk.path)
                if info is None or info.version != fk.version or info.size > ds.policy.page_size:
                    continue
                loc = store.peek(fk.page(0))  # the client reports its reads later
                if loc is None or not fits(loc, info.size, ds.policy.page_size, 0):
                    continue
                slot = h.slot(loc.path)
                if slot is None:
                    full = False
                    continue
                items.append(
                    [fk.path, fk.version, info.size, slot, loc.offset, loc.length, loc.checksum]
                )
        except OSError:
            h.abort()
            raise
        meta = wire.Packed(wire.pack({"items": items, "fds": h.ids, "full": full}))
        fds = self.dirs.put(ds, directory, meta, h)
        if fds is None:
            return Reply(meta, fds=h.fds)
        return Reply(meta, fds=fds, own_fds=False)

    def _touch(self, dataset: str, items: list[list[Any]]) -> Reply:
        files = nbytes = 0
        budget = _TOUCH_PAGES_MAX * 4
        for path, version, npages, size in items:
            fk = FileKey(dataset, path, version)
            n = min(int(npages), _TOUCH_PAGES_MAX, budget)
            budget -= n
            for i in range(n):
                if not self.loader.store.touch(fk.page(i)):  # bumps recency
                    break
            files += 1
            nbytes += max(0, int(size))
        self.stats.touched(dataset, files, nbytes)
        return Reply({})

    async def _batch(self, dataset: str, paths: list[str], local: bool) -> Reply:
        if len(paths) > _BATCH_MAX:
            raise InvalidArgument(f"batch of {len(paths)} files: at most {_BATCH_MAX}")
        ds = self.loader.table.get(dataset)

        async def one(path: str) -> Pages | ShoalError:
            try:
                fast = self.loader.try_cached(dataset, path, None, 0, -1)
                return (
                    fast if fast is not None else await self.loader.read(dataset, path, None, 0, -1)
                )
            except ShoalError as exc:
                return exc

        results = await asyncio.gather(*(one(p) for p in paths))
        items: list[list[Any]] = []
        pieces: list[Piece] = []
        for path, res in zip(paths, results, strict=True):
            if isinstance(res, ShoalError):
                items.append([path, res.code, res.message, 0, 0])
                continue
            if res.info.size > ds.policy.page_size:
                items.append([path, "large", res.info.version, res.info.size, 0])
                continue
            p = res.pieces[0]
            items.append([path, "", res.info.version, res.info.size, _piece_ck(p)])
            pieces.append(p)
            n = _piece_len(p)
            self.stats.served(dataset, n - min(n, res.ufs_bytes), res.ufs_bytes, local)
        return Reply({"items": items}, pieces)


class Conn(asyncio.Protocol):
    """One client connection: frames in, replies out, one request at a time."""

    def __init__(self, service: DataService, local: bool) -> None:
        self.service = service
        self.local = local
        self.buf = bytearray()
        self.busy = False
        self.transport: asyncio.Transport | None = None
        self._raw: socket.socket | None = None
        self.peer: Any = None
        #: bytes of service.buffered this connection holds for an incomplete frame
        self.reserved = 0
        #: data_received calls so far, and at the last idle sweep; sweeps seen quiet
        self.ticks = 0
        self._swept_ticks = 0
        self._quiet = 0
        #: reading paused (a request in flight or answers not taken); writing paused
        self._paused = False
        self._wpaused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # our own handle on the fd: uvloop's pseudo-socket has no sendmsg/sendfile
            self._raw = socket.socket(fileno=os.dup(sock.fileno()))
            try:
                self._raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            except OSError:
                pass
        peer = self._peer(transport)
        if not self.service.admit(self, peer):
            self._close()
            return
        self.peer = peer

    def _peer(self, transport: asyncio.BaseTransport) -> Any:
        """Who is at the other end: the remote address over TCP, the uid on the Unix
        socket (connections are counted per peer)."""
        if self.local:
            if self._raw is not None:
                try:
                    cred = self._raw.getsockopt(
                        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
                    )
                    return ("uid", struct.unpack("3i", cred)[1])
                except OSError:
                    pass
            return ("uid", None)
        name = transport.get_extra_info("peername")
        return name[0] if isinstance(name, tuple) and name else name

    def connection_lost(self, exc: Exception | None) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        self.transport = None
        self._unreserve()
        if self.peer is not None:
            self.service.release(self, self.peer)
            self.peer = None
        self.buf = bytearray()

    def _close(self) -> None:
        t = self.transport
        if t is not None:
            self.transport = None  # nothing more is read or answered
            t.close()

    def sweep(self) -> None:
        """Called every quarter of the idle timeout: close this connection once it has
        received nothing for four sweeps in a row with no request in flight."""
        if self.busy or self.ticks != self._swept_ticks:
            self._swept_ticks = self.ticks
            self._quiet = 0
            return
        self._quiet += 1
        if self._quiet >= 4:
            self._close()

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return  # refused or closing: nothing more is read
        self.ticks += 1
        self.buf += data
        if self.busy or self._wpaused:
            # one request in flight per connection, and its answer not yet taken: no
            # client sends ahead, so whoever does is held to what the kernel buffers
            if not self._paused:
                self.transport.pause_reading()
                self._paused = True
            return
        self._next()

    def pause_writing(self) -> None:
        """The peer does not take its answers: read no more requests until it does."""
        self._wpaused = True

    def resume_writing(self) -> None:
        self._wpaused = False
        self._go_on()

    def _go_on(self) -> None:
        if self.busy or self._wpaused or self.transport is None:
            return
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        self._next()

    def _unreserve(self) -> None:
        if self.reserved:
            self.service.buffered -= self.reserved
            self.reserved = 0

    def _next(self) -> None:
        hdr = wire.REQ_HDR.size
        while not self.busy and not self._wpaused and self.transport is not None:
            buf = self.buf
            if len(buf) < hdr:
                return
            body_len, op_raw, req_id = wire.REQ_HDR.unpack_from(buf)
            if body_len > wire.max_request(op_raw):
                # the framing cannot be trusted past this: answer and close, unread
                self.service.note("oversized frames refused", f"{self.peer}: {body_len} bytes")
                self._fatal(req_id, ProtocolError(f"request of {body_len} bytes is too large"))
                return
            end = hdr + body_len
            if len(buf) < end:
                if end > self.reserved:  # hold room for the whole frame, or refuse it
                    svc = self.service
                    if svc.buffered - self.reserved + end > wire.MAX_BUFFERED:
                        svc.note("frames over the buffer cap refused", f"{self.peer}: {end} bytes")
                        self._fatal(req_id, Unavailable("worker busy: too many bytes buffered"))
                        return
                    svc.buffered += end - self.reserved
                    self.reserved = end
                return
            body = buf[hdr:end]  # a copy: no view of buf may outlive the resize below
            del buf[:end]
            if self.reserved:
                self._unreserve()
                if not buf:
                    self.buf = bytearray()  # give back a large frame's room
            try:
                op = wire.check_op(op_raw)
                args = wire.check_args(op, wire.unpack(body))
            except Exception as exc:  # any malformed body: its length is known, go on
                err = exc if isinstance(exc, ShoalError) else ProtocolError(f"bad body: {exc}")
                self.service.note("malformed requests refused", f"{self.peer}: {err.message}")
                self._send_error(req_id, err)
                continue
            try:
                reply = self.service.try_fast(op, args, self.local)
            except ShoalError as exc:
                self._send_error(req_id, exc)
                continue
            except (IndexError, TypeError, ValueError) as exc:
                self._send_error(req_id, self._bad_args(op, exc))
                continue
            except Exception as exc:
                self._send_error(req_id, self.service.internal(op, exc))
                continue
            if reply is not None:
                self._answer(op, req_id, reply)
                continue
            self.busy = True
            asyncio.get_running_loop().create_task(self._slow(op, req_id, args))

    def _bad_args(self, op: Op, exc: Exception) -> ShoalError:
        self.service.note("malformed requests refused", f"{self.peer}: {op.name}: {exc!r}")
        return ProtocolError(f"bad arguments for {op.name}: {exc}")

    async def _slow(self, op: Op, req_id: int, args: list[Any]) -> None:
        try:
            reply = await self.service.handle(op, args, self.local)
        except ShoalError as exc:
            self._send_error(req_id, exc)
        except (IndexError, TypeError, ValueError) as exc:
            self._send_error(req_id, self._bad_args(op, exc))
        except Exception as exc:
            self._send_error(req_id, self.service.internal(op, exc))
        else:
            self._answer(op, req_id, reply)
        finally:
            self.busy = False
        self._go_on()

    def _fatal(self, req_id: int, exc: ShoalError) -> None:
        self._send_error(req_id, exc)
        self._unreserve()
        self._close()

    def _send_error(self, req_id: int, exc: ShoalError) -> None:
        if self.transport is not None:
            self.transport.write(wire.encode_error(req_id, self.service.epoch, exc))

    def _answer(self, op: Op, req_id: int, reply: Reply) -> None:
        """Send a reply; a connection that cannot take it is closed (never an exception
        out of the protocol's callbacks: the loop would log a traceback per frame)."""
        try:
            self._send(req_id, reply)
        except OSError as exc:
            self.service.note("answers that could not be sent", f"{self.peer}: {op.name}: {exc}")
            self._close()
        except Exception as exc:
            self.service.internal(op, exc)
            self._close()

    def _send(self, req_id: int, reply: Reply) -> None:
        t = self.transport
        if t is None:
            if reply.own_fds:
                for fd in reply.fds:
                    os.close(fd)
            return
        total = sum(_piece_len(p) for p in reply.pieces)
        head = wire.encode_response_head(Status.OK, req_id, self.service.epoch, reply.meta, total)
        if reply.fds:
            self._send_fds(head, reply.fds, reply.own_fds)
        else:
            t.write(head)
        for p in reply.pieces:
            if isinstance(p, Location):
                self._send_file(p)
            else:
                t.write(p)

    def _send_fds(self, head: bytes, fds: list[int], own: bool) -> None:
        t = self.transport
        assert t is not None and self._raw is not None
        try:
            sent = 0
            if t.get_write_buffer_size() == 0:
                try:
                    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    sent = self._raw.sendmsg([head], anc)
                except BlockingIOError:
                    sent = 0
            if sent == 0:
                # cannot attach descriptors now; the client sees no fds and falls back
                log.debug("socket busy: LOCATE answered without descriptors")
            if sent < len(head):
                t.write(head[sent:])
        finally:
            if own:
                for fd in fds:
                    os.close(fd)

    def _send_file(self, loc: Location) -> None:
        t = self.transport
        assert t is not None
        off, left = loc.offset, loc.length
        try:
            fd = os.open(loc.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("cached file %s vanished: %s", loc.path, exc)
            t.write(bytes(left))  # keep framing; the checksum makes the client retry
            return
        try:
            if self._raw is not None and t.get_write_buffer_size() == 0:
                out = self._raw.fileno()
                while left > 0:
                    try:
                        n = os.sendfile(out, fd, off, left)
                    except BlockingIOError:
                        break
                    if n == 0:
                        break
                    off += n
                    left -= n
            while left > 0:
                chunk = os.pread(fd, min(left, 8 << 20), off)
                if not chunk:
                    t.write(bytes(left))
                    break
                t.write(chunk)
                off += len(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)

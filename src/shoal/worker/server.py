"""The data-path server: the binary protocol of shoal.proto.wire on uvloop, over TCP
and a Unix socket.

Requests whose answer is already cached are answered synchronously inside
``data_received`` (no task, no await); the rest run as a task. Cached bytes leave with
``os.sendfile`` straight from the page store's files when the socket can take them, and
local clients get open descriptors (SCM_RIGHTS) instead of bytes.
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
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
)
from shoal.proto import wire
from shoal.proto.wire import Op, Status
from shoal.store.base import Location
from shoal.worker.handover import DirAnswers, Handover
from shoal.worker.loader import Loader, Pages, Piece, fits
from shoal.worker.stats import Stats

log = logging.getLogger("shoal.worker.server")

_BATCH_MAX = 4096
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
_TOUCH_PAGES_MAX = 4096


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
        if op == Op.DROP:
            key = FileKey(args[0], args[1], args[2]).page(int(args[3]))
            self.loader.store.drop_corrupt(key)  # counted by the store
            return Reply({})
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
            last = min(page_count(pages.info.size, ps), pages.first + len(pieces) + ahead // ps)
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

    def connection_lost(self, exc: Exception | None) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        while not self.busy and self.transport is not None:
            if len(self.buf) < wire.REQ_HDR.size:
                return
            body_len, op_raw, req_id = wire.REQ_HDR.unpack_from(self.buf)
            if body_len > wire.MAX_BODY:
                self._fatal(req_id, ProtocolError(f"request of {body_len} bytes is too large"))
                return
            end = wire.REQ_HDR.size + body_len
            if len(self.buf) < end:
                return
            try:
                op = wire.check_op(op_raw)
                args = wire.unpack(memoryview(self.buf)[wire.REQ_HDR.size : end])
                if not isinstance(args, list):
                    raise ProtocolError("request body is not a list")
            except (ProtocolError, ValueError) as exc:
                del self.buf[:end]
                self._fatal(
                    req_id, exc if isinstance(exc, ProtocolError) else ProtocolError(str(exc))
                )
                return
            del self.buf[:end]
            try:
                reply = self.service.try_fast(op, args, self.local)
            except ShoalError as exc:
                self._send_error(req_id, exc)
                continue
            except Exception as exc:
                self._send_error(req_id, self._internal(op, exc))
                continue
            if reply is not None:
                self._send(req_id, reply)
                continue
            self.busy = True
            asyncio.get_running_loop().create_task(self._slow(op, req_id, args))

    async def _slow(self, op: Op, req_id: int, args: list[Any]) -> None:
        try:
            reply = await self.service.handle(op, args, self.local)
        except ShoalError as exc:
            self._send_error(req_id, exc)
        except (IndexError, TypeError, ValueError) as exc:
            self._send_error(req_id, ProtocolError(f"bad arguments for {op.name}: {exc}"))
        except Exception as exc:
            self._send_error(req_id, self._internal(op, exc))
        else:
            self._send(req_id, reply)
        finally:
            self.busy = False
        self._next()

    def _internal(self, op: Op, exc: Exception) -> ShoalError:
        log.error("internal error serving %s", op.name, exc_info=exc)
        return ShoalError(f"internal error in worker serving {op.name}")

    def _fatal(self, req_id: int, exc: ShoalError) -> None:
        self._send_error(req_id, exc)
        if self.transport is not None:
            self.transport.close()

    def _send_error(self, req_id: int, exc: ShoalError) -> None:
        if self.transport is not None:
            self.transport.write(wire.encode_error(req_id, self.service.epoch, exc))

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

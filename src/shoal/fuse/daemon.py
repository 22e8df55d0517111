"""The request loop: one asyncio (uvloop) thread reads /dev/fuse, non-blocking, into
one reused buffer, and dispatches each request to the file system's handler.

Handlers answer synchronously whenever the client already holds what they need, so a
warm request costs one read(2), one handler call and one writev(2); only requests that
need a worker become tasks on the same loop, which also runs the client. One thread
keeps the inode table free of locks; the GIL would serialise handlers anyway.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Coroutine
from types import CoroutineType
from typing import Any

from prometheus_client.registry import Collector

from shoal.core.metric_names import FUSE_TIMED_OPS, Buckets, family
from shoal.errors import ShoalError, errno_of
from shoal.fuse import protocol as p
from shoal.fuse.nodes import Fail, Reply
from shoal.fuse.ops import FileSystem

log = logging.getLogger("shoal.fuse.daemon")

#: seconds a request that needs a worker may take before it fails with EIO
OP_TIMEOUT = 60.0
#: largest READ the kernel sends (pages per request * 4 KiB)
MAX_PAGES = 256
MAX_READ = MAX_PAGES * 4096
#: writes never happen (read-only), but the kernel sizes its buffer check on max_write
MAX_WRITE = 128 * 1024
BUF_SIZE = MAX_WRITE + 4096
#: replies that give the kernel a file's attributes: in kernel-open mode they wait for
#: the invalidations of new versions in flight (ops.FileSystem.invalidate_soon)
ATTR_OPS = frozenset({p.Op.LOOKUP, p.Op.GETATTR, p.Op.READDIRPLUS})


class Daemon:
    def __init__(self, devfd: int, fs: FileSystem, passthrough: bool = True) -> None:
        self.fd = devfd
        self.fs = fs
        self.want_passthrough = passthrough
        self.passthrough = False
        self.handlers = fs.handlers()
        self.counts = [0] * 64
        #: latency per opcode (& 63) for the timed ops, None for the others
        self.timed: list[Buckets | None] = [None] * 64
        for name in FUSE_TIMED_OPS:
            self.timed[p.Op[name] & 63] = Buckets()
        self.errors: dict[int, int] = {}
        self.init: p.InitOut | None = None
        self._buf = bytearray(BUF_SIZE)
        self._view = memoryview(self._buf)
        self._tasks: set[asyncio.Task[None]] = set()
        self.done: asyncio.Future[None] | None = None
        self.notifications = 0
        #: hold attribute replies behind invalidations (no open does it: kernel-open)
        self.hold = fs.kernel_open
        fs.notify = self.notify

    # -- notifications --------------------------------------------------------------

    async def notify(self, msgs: list[bytes]) -> None:
        """Write FUSE notifications (invalidations) to the kernel.

        From a thread, never from the loop: invalidating a page waits for its lock,
        which a read in flight holds until the loop answers it.
        """
        if msgs:
            await asyncio.to_thread(self._write_notifications, msgs)

    def _write_notifications(self, msgs: list[bytes]) -> None:
        for msg in msgs:
            try:
                os.write(self.fd, msg)
                self.notifications += 1
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    continue  # the kernel holds no such inode or name: nothing cached
                if exc.errno in (errno.ENODEV, errno.EBADF):
                    return  # unmounted
                log.warning("FUSE notification failed: %s", exc)

    # -- INIT -----------------------------------------------------------------------

    def negotiate(self, kin: p.InitIn) -> p.InitOut:
        """What we ask of the kernel, given what it offers."""
        want = (
            p.ASYNC_READ
            | p.BIG_WRITES
            | p.AUTO_INVAL_DATA
            | p.DO_READDIRPLUS
            | p.PARALLEL_DIROPS
            | p.ASYNC_DIO
            | p.MAX_PAGES
            | p.INIT_EXT
        )
        if self.want_passthrough:
            want |= p.PASSTHROUGH
        flags = want & kin.flags
        return p.InitOut(
            minor=min(kin.minor, p.KERNEL_MINOR),
            max_readahead=kin.max_readahead,
            flags=flags,
            max_background=64,
            congestion_threshold=48,
            max_write=MAX_WRITE,
            max_pages=MAX_PAGES,
            max_stack_depth=p.MAX_STACK_DEPTH if flags & p.PASSTHROUGH else 0,
        )

    def handshake(self) -> p.InitOut:
        """Answer the kernel's INIT (blocking; the first request after mount(2))."""
        while True:
            n = os.readv(self.fd, [self._buf])
            h = p.parse_header(self._view[:n])
            body = self._view[p.IN_HEADER.size : n]
            if h.opcode != p.Op.INIT:
                self._send(h.unique, None, errno.EIO)
                continue
            kin = p.parse_init(body)
            if kin.major != p.KERNEL_MAJOR or kin.minor < 31:
                self._send(h.unique, None, errno.EPROTO)
                raise OSError(errno.EPROTO, f"kernel FUSE {kin.major}.{kin.minor} is too old")
            out = self.negotiate(kin)
            self._send(h.unique, p.encode_init(out))
            self.init = out
            self.passthrough = bool(out.flags & p.PASSTHROUGH)
            log.info(
                "FUSE %d.%d: passthrough %s, max_readahead %d",
                kin.major,
                out.minor,
                "on" if self.passthrough else "off",
                out.max_readahead,
            )
            return out

    # -- the loop -------------------------------------------------------------------

    def _send(self, unique: int, reply: Reply, error: int = 0) -> None:
        try:
            if error:
                os.write(self.fd, p.reply_header(unique, 0, error))
            elif reply is None:
                return
            elif isinstance(reply, list):
                size = sum(len(b) for b in reply)
                os.writev(self.fd, [p.reply_header(unique, size), *reply])
            else:
                os.writev(self.fd, [p.reply_header(unique, len(reply)), reply])
        except OSError as exc:
            self._send_failed(unique, exc, error)

    def _send_failed(self, unique: int, exc: OSError, error: int) -> None:
        # ENOENT: the request was interrupted and is gone; ENODEV: unmounted
        if exc.errno in (errno.ENOENT, errno.ENODEV):
            return
        log.error("reply to request %d failed: %s", unique, exc)
        if not error:  # the kernel refused the reply: never leave the caller waiting
            self._send(unique, None, errno.EIO)

    def _fail(self, unique: int, opcode: int, exc: BaseException) -> None:
        code = errno_of(exc)  # the one table (shoal.errors)
        self.errors[code] = self.errors.get(code, 0) + 1
        if code == errno.EIO or (isinstance(exc, ShoalError) and not exc.user_fault):
            log.warning("%s failed: %s", _opname(opcode), exc)
        self._send(unique, None, code)

    def on_readable(self) -> None:
        fd, bufs, view = self.fd, [self._buf], self._view
        unpack, body_at = p.IN_ROUTE.unpack_from, p.IN_HEADER.size
        pack, out_size = p.OUT_HEADER.pack, p.OUT_HEADER.size
        readv, writev = os.readv, os.writev
        handlers, counts, timed = self.handlers, self.counts, self.timed
        clock, hold, fs = time.perf_counter, self.hold, self.fs
        while True:
            try:
                n = readv(fd, bufs)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.ENOENT):
                    continue
                self._stop(exc)
                return
            _len, opcode, unique, nodeid = unpack(view)
            slot = opcode & 63
            counts[slot] += 1
            hist = timed[slot]
            t0 = clock() if hist is not None else 0.0
            handler = handlers.get(opcode)
            if handler is None:
                if opcode == p.Op.DESTROY:
                    self._send(unique, b"")
                    self._stop(None)
                    return
                self._send(unique, None, errno.ENOSYS)
                continue
            try:
                res = handler(nodeid, view[body_at:n])
            except Exception as exc:
                self._fail(unique, opcode, exc)
                if hist is not None:  # a failed request is timed like an answered one
                    hist.observe(clock() - t0)
                continue
            if hold and fs.invalidating and opcode in ATTR_OPS:
                res = _ready(res)
            if type(res) is bytes:  # most warm answers (OPEN, RELEASE, ...): sent right here
                try:
                    writev(fd, [pack(out_size + len(res), 0, unique), res])
                except OSError as exc:
                    self._send_failed(unique, exc, 0)
            elif type(res) is CoroutineType:
                task = asyncio.get_running_loop().create_task(self._finish(unique, opcode, res, t0))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                continue
            elif type(res) is Fail:  # an expected error (IOCTL): counted, never logged
                self.errors[res] = self.errors.get(res, 0) + 1
                self._send(unique, None, res)
            elif res is not None:
                self._send(unique, res)  # type: ignore[arg-type]
            if hist is not None:
                hist.observe(clock() - t0)

    async def _finish(
        self, unique: int, opcode: int, coro: Coroutine[Any, Any, Reply], t0: float = 0.0
    ) -> None:
        try:
            reply = await asyncio.wait_for(coro, OP_TIMEOUT)
            pending = self.fs.invalidating
            if self.hold and pending and opcode in ATTR_OPS:
                await asyncio.wait(set(pending), timeout=OP_TIMEOUT)
        except Exception as exc:
            self._fail(unique, opcode, exc)
        else:
            self._send(unique, reply)
        hist = self.timed[opcode & 63]
        if hist is not None:
            hist.observe(time.perf_counter() - t0)

    def _stop(self, exc: BaseException | None) -> None:
        if exc is not None and getattr(exc, "errno", None) != errno.ENODEV:
            log.error("reading /dev/fuse failed: %s", exc)
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    async def serve(self) -> None:
        """Serve until the file system is unmounted (or :meth:`stop`)."""
        loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        os.set_blocking(self.fd, False)
        loop.add_reader(self.fd, self.on_readable)
        try:
            self.on_readable()  # anything queued before the reader was added
            await self.done
        finally:
            loop.remove_reader(self.fd)
            for t in list(self._tasks):
                t.cancel()

    def stop(self) -> None:
        self._stop(None)

    def request_counts(self) -> dict[str, int]:
        return {_opname(i): c for i, c in enumerate(self.counts) if c}


async def _ready(reply: Any) -> Reply:
    return await reply if type(reply) is CoroutineType else reply


def _opname(opcode: int) -> str:
    try:
        return p.Op(opcode).name
    except ValueError:
        return str(opcode)


class Metrics(Collector):
    """Prometheus view of one mount's counters, read at scrape time (the hot path only
    bumps plain ints). Names and meanings: :mod:`shoal.core.metric_names`."""

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon

    def collect(self) -> Any:
        d, s = self.d, self.d.fs.stats
        req = family("shoal_fuse_requests_total")
        for name, c in d.request_counts().items():
            req.add_metric([name], c)
        yield req
        err = family("shoal_fuse_errors_total")
        for code, c in d.errors.items():
            err.add_metric([errno.errorcode.get(code, str(code))], c)
        yield err
        lat = family("shoal_fuse_request_seconds")
        for opcode, b in enumerate(d.timed):
            if b is not None:
                lat.add_metric([_opname(opcode)], b.cumulative(), b.sum)
        yield lat
        yield _one("shoal_fuse_inflight", len(d._tasks))
        yield _one("shoal_fuse_read_bytes_total", s.read_bytes)
        opens = family("shoal_fuse_opens_total")
        opens.add_metric(["passthrough"], s.passthrough_opens)
        opens.add_metric(["cached"], s.cached_opens)
        yield opens
        yield _one("shoal_fuse_client_calls_total", s.client_calls)
        yield _one("shoal_fuse_notifications_total", d.notifications)
        yield _one("shoal_fuse_backing_files", s.backing_files)
        yield _one("shoal_fuse_inodes", len(d.fs.nodes))
        yield _one("shoal_fuse_passthrough", int(d.passthrough))
        cc = d.fs.cache.counters
        reads, nbytes = (
            family("shoal_fuse_client_reads_total"),
            family("shoal_fuse_client_read_bytes_total"),
        )
        for name, n, size in (
            ("short_circuit", cc.short_circuit, cc.bytes_short_circuit),
            ("local", cc.local, cc.bytes_local),
            ("remote", cc.remote, cc.bytes_remote),
            ("ufs", cc.ufs_fallback, cc.bytes_ufs),
        ):
            reads.add_metric([name], n)
            nbytes.add_metric([name], size)
        yield reads
        yield nbytes
        yield _one("shoal_fuse_client_failovers_total", cc.failovers)
        fallback = family("shoal_fallback_reads_total")
        # the client counts fallbacks by cause when it can (else: all "unknown")
        causes: dict[str, int] = getattr(cc, "fallback_causes", None) or {
            "unknown": cc.ufs_fallback
        }
        for cause, n in causes.items():
            fallback.add_metric(["fuse", cause], n)
        yield fallback


def _one(name: str, value: float) -> Any:
    """A label-less family from the metric table holding one value."""
    f = family(name)
    f.add_metric([], value)
    return f

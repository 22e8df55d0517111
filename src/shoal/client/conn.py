"""Connections to workers: raw non-blocking sockets driven by the event loop.

One request in flight per connection; a :class:`Pool` per worker keeps idle
connections for reuse. Responses are received straight into their final buffer; on a
Unix socket the first receive uses ``recvmsg`` to pick up handed-over descriptors.

A worker closes connections idle longer than ``wire.IDLE_TIMEOUT``: the pool does not
reuse connections idle that long, and a reused connection found closed before any byte
of its answer came is replaced by a fresh one once, transparently (requests are
idempotent, and one that got no answer was not served).

Every new connection starts with a ``HELLO`` (the protocol version, see
shoal.proto.wire): a worker of another version is refused with an error naming both
versions, before any other request is sent on it.

A request has one deadline (the pool's timeout) for all it does. One that takes longer
than a thirtieth of it (at least ``PROBE_MIN``: 1 s by default) makes the pool ask the
worker for a ``HELLO`` on a fresh connection (answered on the worker's event loop at
once, however busy its fetches are): a worker that does not answer that within the
same time is taken to be hung
(stopped, or its loop blocked) and the request fails with :class:`TimedOut` at once, so
the caller fails over within seconds instead of waiting out the deadline; a live worker
busy fetching keeps the request going (probed again every ``PROBE_EVERY``).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import mmap
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from shoal.errors import ProtocolError, ShoalError, Unavailable
from shoal.proto import wire
from shoal.proto.messages import HelloReply, HelloRequest, Request, decode_reply, encode_request

#: smallest receive buffer a connection keeps (grown to the largest response, power of 2)
_MIN_BUF = 1 << 20
_MAX_BUF = 16 << 20
_FD_ANC = socket.CMSG_SPACE(wire.MAX_FDS * array.array("i").itemsize)
#: seconds a request runs before the worker's liveness is probed, and the probe's own
#: timeout: a thirtieth of the request's deadline, at least PROBE_MIN (1 s for the
#: default 30 s deadline: a hung worker is left within ~2 s)
PROBE_MIN = 1.0
#: the pause between probes while a live worker is still at the request
PROBE_EVERY = 2.0
#: idle pooled connections older than this part of the worker's idle timeout are not
#: reused (the worker may be closing them right now)
_REUSE_FOR = 0.8 * wire.IDLE_TIMEOUT


class TimedOut(Unavailable):
    """The worker did not answer in time (a deadline, or a failed liveness probe): it
    is hung or overloaded, so asking it again another way (its TCP port after its Unix
    socket) will not help."""


R = TypeVar("R")
_HELLO = HelloRequest()


@dataclass(slots=True)
class Response(Generic[R]):
    """A worker's answer: the typed reply (shoal.proto.messages), its data, the worker's
    ring epoch and the descriptors it handed over."""

    reply: R
    data: bytes
    epoch: int
    fds: list[int] = field(default_factory=list)


class Connection:
    def __init__(self, sock: socket.socket, unix: bool) -> None:
        self.sock = sock
        self.unix = unix
        self._req_id = 0
        self._hdr = bytearray(wire.RESP_HDR.size)
        self._buf: mmap.mmap | None = None
        self.broken = False
        #: whether any byte of the current call's answer has come, and a whole header
        #: that answers it (a peer that speaks this framing at all)
        self.answered = False
        self.framed = False
        #: monotonic time it went back to its pool
        self.idle_since = 0.0
        #: the worker's answer to this connection's HELLO
        self.hello: HelloReply | None = None

    def _buffer(self, n: int) -> memoryview:
        if n > _MAX_BUF:  # rare huge answers: a one-off buffer, not kept per connection
            return memoryview(bytearray(n))
        if self._buf is None or len(self._buf) < n:
            if self._buf is not None:
                self._buf.close()
            size = max(_MIN_BUF, 1 << (n - 1).bit_length())
            self._buf = mmap.mmap(-1, size)
        return memoryview(self._buf)[:n]

    @classmethod
    async def open(
        cls, address: str | tuple[str, int], timeout: float, worker: str = ""
    ) -> Connection:
        """A connection that said HELLO to the worker at ``address`` (``worker``: the id
        it must have, else Unavailable: the address now belongs to another worker, as
        when a restarted worker's old port is taken by another one)."""
        loop = asyncio.get_running_loop()
        unix = isinstance(address, str)
        fam = socket.AF_UNIX if unix else socket.AF_INET
        if not unix and ":" in address[0]:
            fam = socket.AF_INET6
        sock = socket.socket(fam, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(timeout):
                await loop.sock_connect(sock, address)
        except (OSError, TimeoutError) as exc:
            sock.close()
            raise Unavailable(f"cannot connect to worker at {_fmt(address)}: {exc}") from None
        except BaseException:
            sock.close()
            raise
        if not unix:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        conn = cls(sock, unix)
        try:
            async with asyncio.timeout(timeout):
                conn.hello = (await conn.call(_HELLO)).reply
            wire.check_hello(conn.hello.version, _fmt(address))
            if worker and conn.hello.worker != worker:
                raise Unavailable(
                    f"the worker at {_fmt(address)} is {conn.hello.worker!r}, not {worker!r}"
                )
        except TimeoutError:
            conn.close()
            raise Unavailable(f"worker at {_fmt(address)} did not answer its HELLO") from None
        except ProtocolError as exc:
            conn.close()
            if conn.framed:
                raise  # a worker that answered: another version, said in its own words
            # not a shoal worker at all (its old port now someone else's): try elsewhere
            raise Unavailable(f"no shoal worker at {_fmt(address)}: {exc}") from None
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        self.broken = True
        self.sock.close()
        if self._buf is not None:
            try:
                self._buf.close()
            except BufferError:  # a view is still alive; the GC frees it later
                pass
            self._buf = None

    async def call(self, req: Request[R], want_fds: bool = False) -> Response[R]:
        """Send one request and read its response; errors from the worker are raised."""
        loop = asyncio.get_running_loop()
        self._req_id = (self._req_id + 1) & 0xFFFFFFFF
        self.answered = False
        self.framed = False
        try:
            await loop.sock_sendall(self.sock, encode_request(req, self._req_id))
            fds: list[int] = []
            hdr = memoryview(self._hdr)
            if want_fds and self.unix:
                got = await self._recv_with_fds(hdr, fds)
                hdr = hdr[got:]
            await self._recv_exact(hdr)
            status, req_id, epoch, meta_len, data_len = wire.RESP_HDR.unpack(self._hdr)
            if req_id != self._req_id:
                raise ProtocolError(f"response {req_id} for request {self._req_id}")
            self.framed = True
            meta_buf = bytearray(meta_len)
            await self._recv_exact(memoryview(meta_buf))
            data = b""
            if data_len:
                # receive into this connection's page-aligned buffer (reused, so no fresh
                # zeroed allocation and no page faults per response), then one copy out
                view = self._buffer(data_len)
                await self._recv_exact(view)
                data = bytes(view)
        except (OSError, EOFError) as exc:
            self.close()
            raise Unavailable(f"worker connection lost: {exc}") from None
        except BaseException:
            self.close()  # half-read response: the connection is unusable
            raise
        try:
            reply = decode_reply(req, status, meta_buf)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return Response(reply, data, epoch, fds)

    async def _recv_exact(self, view: memoryview) -> None:
        loop = asyncio.get_running_loop()
        while view:
            n = await loop.sock_recv_into(self.sock, view)
            if n == 0:
                raise EOFError("worker closed the connection")
            self.answered = True
            view = view[n:]

    async def _recv_with_fds(self, view: memoryview, fds: list[int]) -> int:
        loop = asyncio.get_running_loop()
        while True:
            try:
                n, anc, _flags, _ = self.sock.recvmsg_into([view], _FD_ANC)
            except BlockingIOError:
                fut: asyncio.Future[None] = loop.create_future()
                fd = self.sock.fileno()
                loop.add_reader(fd, _wake, fut)
                try:
                    await fut
                finally:
                    loop.remove_reader(fd)
                continue
            if n == 0:
                raise EOFError("worker closed the connection")
            self.answered = True
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(payload[: len(payload) - (len(payload) % a.itemsize)])
                    fds.extend(a)
            return n


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _fmt(address: str | tuple[str, int]) -> str:
    return address if isinstance(address, str) else f"{address[0]}:{address[1]}"


class Pool:
    """Idle connections to one worker address."""

    def __init__(
        self, address: str | tuple[str, int], size: int, timeout: float, worker: str = ""
    ) -> None:
        self.address = address
        #: the id of the worker expected at the address (checked at each HELLO)
        self.worker = worker
        self.size = size
        self.timeout = timeout
        self._idle: list[Connection] = []
        #: the liveness probe in flight, shared by every slow request to this worker
        self._probe: asyncio.Task[bool] | None = None
        #: when a slow request's worker is probed, and how long its HELLO may take
        self.probe_after = min(timeout, max(PROBE_MIN, timeout / 30))

    def _take(self) -> Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < _REUSE_FOR:
                return conn
            conn.close()  # the worker may be closing it: do not race it
        return None

    def _keep(self, conn: Connection) -> None:
        if not conn.broken and len(self._idle) < self.size:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()

    async def call(self, req: Request[R], want_fds: bool = False) -> Response[R]:
        watch: _Watch | None = None
        try:
            async with asyncio.timeout(self.timeout) as cm:
                watch = _Watch(self, cm)
                try:
                    return await self._call(req, want_fds)
                finally:
                    watch.stop()
        except TimeoutError:
            if watch is not None and watch.hung:
                raise TimedOut(
                    f"worker at {_fmt(self.address)} does not answer (hung?): "
                    f"no HELLO within {self.probe_after:.0f}s"
                ) from None
            raise TimedOut(f"worker at {_fmt(self.address)} timed out") from None

    async def alive(self) -> bool:
        """Whether the worker answers a HELLO on a fresh connection within probe_after
        (one probe at a time per pool, shared by whoever asks meanwhile)."""
        t = self._probe
        if t is None or t.done():
            t = self._probe = asyncio.get_running_loop().create_task(self._hello())
        return await asyncio.shield(t)

    async def _hello(self) -> bool:
        try:
            async with asyncio.timeout(self.probe_after):
                conn = await Connection.open(self.address, self.probe_after, self.worker)
                conn.close()
        except (TimeoutError, Unavailable):
            return False
        except ShoalError:
            pass  # it answered (with an error): alive
        return True

    async def _call(self, req: Request[R], want_fds: bool) -> Response[R]:
        for attempt in (0, 1):
            conn = self._take()
            reused = conn is not None
            if conn is None:
                conn = await Connection.open(self.address, self.timeout, self.worker)
            try:
                resp = await conn.call(req, want_fds)
            except Unavailable:
                conn.close()
                if reused and not conn.answered and attempt == 0:
                    continue  # closed while idle (by the worker's idle timeout): once more
                raise
            except ShoalError:
                self._keep(conn)  # an error answer: the connection is fine
                raise
            except BaseException:
                conn.close()  # a half-read answer (cancelled, timed out)
                raise
            self._keep(conn)
            return resp
        raise AssertionError("unreachable")

    def close(self) -> None:
        for c in self._idle:
            c.close()
        self._idle.clear()


class _Watch:
    """Probes the worker's liveness while one request to it runs longer than the pool's
    probe_after; ends the request's deadline at once when the worker does not answer."""

    def __init__(self, pool: Pool, cm: asyncio.Timeout) -> None:
        self.pool = pool
        self.cm = cm
        self.hung = False
        self.done = False
        self.loop = asyncio.get_running_loop()
        self.task: asyncio.Task[None] | None = None
        self.handle = self.loop.call_later(pool.probe_after, self._start)

    def _start(self) -> None:
        if not self.done:
            self.task = self.loop.create_task(self._probe())

    async def _probe(self) -> None:
        alive = await self.pool.alive()
        if self.done:
            return
        if alive:
            self.handle = self.loop.call_later(PROBE_EVERY, self._start)
        else:
            self.hung = True
            self.cm.reschedule(self.loop.time())  # the request's deadline ends now

    def stop(self) -> None:
        self.done = True
        self.handle.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()

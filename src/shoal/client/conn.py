"""Connections to workers: raw non-blocking sockets driven by the event loop.

One request in flight per connection; a :class:`Pool` per worker keeps idle
connections for reuse. Responses are received straight into their final buffer; on a
Unix socket the first receive uses ``recvmsg`` to pick up handed-over descriptors.

A worker closes connections idle longer than ``wire.IDLE_TIMEOUT``: the pool does not
reuse connections idle that long, and a reused connection found closed before any byte
of its answer came is replaced by a fresh one once, transparently (requests are
idempotent, and one that got no answer was not served).

Every new connection starts with a ``HELLO`` (the protocol version and the client's
token, see shoal.proto.wire): a worker of another version is refused with an error
naming both versions, before any other request is sent on it, and a worker that
refuses the token answers :class:`~shoal.errors.Unauthenticated` (one line saying what
to pass), raised as is: no other worker or under storage is tried for it.

A request has one deadline (the pool's timeout) for all it does. One that takes longer
than a thirtieth of it (at least ``PROBE_MIN``: 1 s by default) makes the pool ask the
worker for a ``HELLO`` on a fresh connection (answered on the worker's event loop at
once, however busy its fetches are): a worker that does not answer ``PROBE_MISSES``
such probes in a row, each within the same time, is taken to be hung
(stopped, or its loop blocked) and the request fails with :class:`TimedOut` at once, so
the caller fails over within seconds instead of waiting out the deadline; a live worker
busy fetching keeps the request going (probed again every ``PROBE_EVERY``).
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from shoal.client.watch import Watch
from shoal.core.tls import WHAT_TO_PASS, TLSRefused, looks_like_tls
from shoal.errors import ProtocolError, ShoalError, Unavailable
from shoal.proto import wire
from shoal.proto.messages import HelloReply, HelloRequest, Request, decode_reply, encode_request

#: smallest receive buffer a connection keeps (grown to the largest response, power of 2)
_MIN_BUF = 1 << 20
_MAX_BUF = 16 << 20
#: seconds a request runs before the worker's liveness is probed, and the probe's own
#: timeout: a thirtieth of the request's deadline, at least PROBE_MIN (1 s for the
#: default 30 s deadline: a hung worker is left within ~3 s)
PROBE_MIN = 1.0
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
        #: TLS over the socket (memory BIOs: the loop's sock_* calls move the records)
        self.tls: ssl.SSLObject | None = None
        self._tls_in = self._tls_out = ssl.MemoryBIO()

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
        cls,
        address: str | tuple[str, int],
        timeout: float,
        worker: str = "",
        hello: HelloRequest = _HELLO,
        tls: ssl.SSLContext | None = None,
    ) -> Connection:
        """A connection that said ``hello`` (carrying the client's token) to the worker
        at ``address`` (``worker``: the id it must have, else Unavailable: the address
        now belongs to another worker, as when a restarted worker's old port is taken
        by another one), over TLS with ``tls`` (TCP only)."""
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
                if tls is not None and not unix:
                    await conn._handshake(tls, address[0], _fmt(address))
                conn.hello = (await conn.call(hello)).reply
            wire.check_hello(conn.hello.version, _fmt(address))
            if worker and conn.hello.worker != worker:
                raise Unavailable(
                    f"the worker at {_fmt(address)} is {conn.hello.worker!r}, not {worker!r}"
                )
        except TimeoutError:
            conn.close()
            raise Unavailable(f"worker at {_fmt(address)} did not answer its HELLO") from None
        except (ProtocolError, Unavailable) as exc:
            conn.close()
            if (
                not isinstance(address, str)
                and conn.tls is None
                and (
                    looks_like_tls(bytes(conn._hdr[:3]))
                    or (not conn.answered and await _speaks_tls(address, timeout))
                )
            ):
                raise TLSRefused(
                    f"worker at {_fmt(address)} speaks TLS and this client does not: {WHAT_TO_PASS}"
                ) from None
            if isinstance(exc, Unavailable):
                raise
            if conn.framed:
                raise  # a worker that answered: another version, said in its own words
            # not a shoal worker at all (its old port now someone else's): try elsewhere
            raise Unavailable(f"no shoal worker at {_fmt(address)}: {exc}") from None
        except BaseException:
            conn.close()
            raise
        return conn

    async def _handshake(self, ctx: ssl.SSLContext, host: str, where: str) -> None:
        """TLS over this connection's socket, the worker's certificate checked against
        the client's CA (TLSRefused, one line, when it is not trusted)."""
        loop = asyncio.get_running_loop()
        self._tls_in, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ctx.wrap_bio(self._tls_in, self._tls_out, server_hostname=host)
        try:
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    await self._flush()
                    data = await loop.sock_recv(self.sock, 1 << 16)
                    if not data:
                        raise EOFError("closed during the TLS handshake") from None
                    self._tls_in.write(data)
            await self._flush()
        except ssl.SSLCertVerificationError as exc:
            raise TLSRefused(
                f"worker at {where}: its TLS certificate is not trusted "
                f"({exc.verify_message}): {WHAT_TO_PASS}"
            ) from None
        except ssl.SSLError as exc:
            raise TLSRefused(
                f"worker at {where} does not speak TLS ({exc.reason}): unset tls_ca and "
                "SHOAL_TLS_CA, or start the worker with --tls-cert and --tls-key"
            ) from None
        except (OSError, EOFError) as exc:
            raise Unavailable(f"worker at {where}: TLS handshake failed: {exc}") from None
        self.tls = tls

    async def _flush(self) -> None:
        out = self._tls_out.read()
        if out:
            await asyncio.get_running_loop().sock_sendall(self.sock, out)

    async def _sendall(self, data: bytes) -> None:
        if self.tls is None:
            await asyncio.get_running_loop().sock_sendall(self.sock, data)
            return
        self.tls.write(data)  # into a memory BIO: never wants to wait
        await self._flush()

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
        self._req_id = (self._req_id + 1) & 0xFFFFFFFF
        self.answered = False
        self.framed = False
        fds: list[int] = []  # received with the answer's first bytes; ours until returned
        try:
            await self._sendall(encode_request(req, self._req_id))
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
            _close_all(fds)
            raise Unavailable(f"worker connection lost: {exc}") from None
        except BaseException:
            self.close()  # half-read response (cancelled, timed out): the connection is unusable
            _close_all(fds)
            raise
        try:
            reply = decode_reply(req, status, meta_buf)
        except BaseException:
            _close_all(fds)
            raise
        return Response(reply, data, epoch, fds)

    async def _recv_exact(self, view: memoryview) -> None:
        loop = asyncio.get_running_loop()
        tls = self.tls
        while view and tls is not None:
            try:
                got: int = tls.read(len(view), view)  # type: ignore[assignment]  # into view: a count
            except ssl.SSLWantReadError:
                await self._flush()  # anything the TLS layer has to say first
                data = await loop.sock_recv(self.sock, 1 << 18)
                if not data:
                    raise EOFError("worker closed the connection") from None
                self._tls_in.write(data)
                continue
            except ssl.SSLZeroReturnError:
                raise EOFError("worker closed the TLS session") from None
            if got == 0:
                raise EOFError("worker closed the connection")
            self.answered = True
            view = view[got:]
        while view:
            n = await loop.sock_recv_into(self.sock, view)
            if n == 0:
                raise EOFError("worker closed the connection")
            self.answered = True
            view = view[n:]

    async def _recv_with_fds(self, view: memoryview, fds: list[int]) -> int:
        loop = asyncio.get_running_loop()
        wire.make_room_for_fds()
        while True:
            try:
                n, anc, _flags, _ = self.sock.recvmsg_into([view], wire.FD_ANC)
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
            fds.extend(wire.fds_of(anc))
            return n


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    fds.clear()


async def _speaks_tls(address: tuple[str, int], timeout: float) -> bool:
    """Whether the TCP ``address`` that closed a plain connection without a word takes
    a TLS handshake (certificate not checked: nothing is sent past the handshake), so
    that a client without the CA is told so instead of failing over to nobody."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(min(timeout, 5.0)):
            _r, w = await asyncio.open_connection(*address, ssl=ctx)
    except (OSError, TimeoutError, ssl.SSLError):
        return False
    w.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await w.wait_closed()
    return True


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _fmt(address: str | tuple[str, int]) -> str:
    return address if isinstance(address, str) else f"{address[0]}:{address[1]}"


class Pool:
    """Idle connections to one worker address."""

    def __init__(
        self,
        address: str | tuple[str, int],
        size: int,
        timeout: float,
        worker: str = "",
        token: str = "",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
        #: TLS to a TCP address (shoal.core.tls.client_context; None: plain)
        self.tls = None if isinstance(address, str) else tls
        #: the id of the worker expected at the address (checked at each HELLO)
        self.worker = worker
        #: each new connection's HELLO, with the client's token ("": none)
        self.greeting = HelloRequest(token=token) if token else _HELLO
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
        watch: Watch | None = None
        try:
            async with asyncio.timeout(self.timeout) as cm:
                watch = Watch(self, cm)
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
                conn = await Connection.open(
                    self.address, self.probe_after, self.worker, self.greeting, self.tls
                )
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
                conn = await Connection.open(
                    self.address, self.timeout, self.worker, self.greeting, self.tls
                )
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

"""Connections to workers: raw non-blocking sockets driven by the event loop.

One request in flight per connection; a :class:`Pool` per worker keeps idle
connections for reuse. Responses are received straight into their final buffer; on a
Unix socket the first receive uses ``recvmsg`` to pick up handed-over descriptors.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import mmap
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from shoal.errors import ProtocolError, ShoalError, Unavailable
from shoal.proto import wire
from shoal.proto.wire import Op, Status

#: smallest receive buffer a connection keeps (grown to the largest response, power of 2)
_MIN_BUF = 1 << 20
_MAX_BUF = 16 << 20
_FD_ANC = socket.CMSG_SPACE(wire.MAX_FDS * array.array("i").itemsize)


@dataclass(slots=True)
class Response:
    meta: Any
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
    async def open(cls, address: str | tuple[str, int], timeout: float) -> Connection:
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
        if not unix:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        return cls(sock, unix)

    def close(self) -> None:
        self.broken = True
        self.sock.close()
        if self._buf is not None:
            try:
                self._buf.close()
            except BufferError:  # a view is still alive; the GC frees it later
                pass
            self._buf = None

    async def call(self, op: Op, args: list[Any], want_fds: bool = False) -> Response:
        """Send one request and read its response; errors from the worker are raised."""
        loop = asyncio.get_running_loop()
        self._req_id = (self._req_id + 1) & 0xFFFFFFFF
        try:
            await loop.sock_sendall(self.sock, wire.encode_request(op, self._req_id, args))
            fds: list[int] = []
            hdr = memoryview(self._hdr)
            if want_fds and self.unix:
                got = await self._recv_with_fds(hdr, fds)
                hdr = hdr[got:]
            await self._recv_exact(hdr)
            status, req_id, epoch, meta_len, data_len = wire.RESP_HDR.unpack(self._hdr)
            if req_id != self._req_id:
                raise ProtocolError(f"response {req_id} for request {self._req_id}")
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
        meta = wire.unpack(meta_buf)
        if status != Status.OK:
            for fd in fds:
                os.close(fd)
            raise wire.decode_error(meta)
        return Response(meta, data, epoch, fds)

    async def _recv_exact(self, view: memoryview) -> None:
        loop = asyncio.get_running_loop()
        while view:
            n = await loop.sock_recv_into(self.sock, view)
            if n == 0:
                raise EOFError("worker closed the connection")
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

    def __init__(self, address: str | tuple[str, int], size: int, timeout: float) -> None:
        self.address = address
        self.size = size
        self.timeout = timeout
        self._idle: list[Connection] = []

    async def call(self, op: Op, args: list[Any], want_fds: bool = False) -> Response:
        conn = self._idle.pop() if self._idle else await Connection.open(self.address, self.timeout)
        try:
            async with asyncio.timeout(self.timeout):
                resp = await conn.call(op, args, want_fds)
        except TimeoutError:
            conn.close()
            raise Unavailable(f"worker at {_fmt(self.address)} timed out") from None
        except ShoalError:
            if not conn.broken and len(self._idle) < self.size:
                self._idle.append(conn)
            raise
        if len(self._idle) < self.size:
            self._idle.append(conn)
        else:
            conn.close()
        return resp

    def close(self) -> None:
        for c in self._idle:
            c.close()
        self._idle.clear()

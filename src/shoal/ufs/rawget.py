"""Plain-HTTP GETs read straight into the body's own buffer, for :mod:`shoal.ufs.s3get`.

Why not aiohttp for these: profiled in a worker during a cold sequential pass (pages of
1 MiB), about 40% of its CPU went into aiohttp's response path: the parser copies each
socket read into a new bytes object, the stream reader queues them, wakes the reader,
pauses and resumes the transport every 128 KiB and joins the chunks again at the end,
after a request built through several layers of header multidicts. Here a connection
is an :class:`asyncio.BufferedProtocol`: the head is read into a small scratch buffer,
then the transport reads the body straight into a buffer of exactly the announced
length (never past it, so nothing of a later answer can leak into this one), one
request at a time per connection.

Only the shapes a GET of S3 answers with are taken here: a status line, headers and a
body framed by ``Content-Length``. Anything else (chunked or unframed bodies, 1xx) is
:class:`Unframed`, and the caller sends that request again through aiohttp. A
connection is reused only after an answer read exactly to its end and without
``Connection: close``; any failure, timeout or cancellation closes it.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import aiohttp
from multidict import CIMultiDict

#: idle keep-alive connections kept per origin and loop (aiohttp kept up to 256)
IDLE_MAX = 256
_HEAD_MAX = 64 * 1024
#: what a head is first read into: S3's heads are under 1 KiB, and what follows them in
#: the same read (the start of the body) is copied once into the body's buffer
_SCRATCH = 16 * 1024


class Unframed(Exception):
    """An answer this module does not read (no Content-Length, chunked, 1xx)."""


class _Conn(asyncio.BufferedProtocol):
    """One HTTP/1.1 connection; :meth:`get` sends one request and reads its answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self._scratch = bytearray(_SCRATCH)
        self._head = bytearray()
        self._body: bytearray | None = None
        self._got = 0
        self._want = 0
        self._done: asyncio.Future[None] | None = None
        self._keep = True
        self.status = 0
        self.headers: CIMultiDict[str] = CIMultiDict()
        #: whether any byte of the current answer arrived
        self.answered = False
        self._last = 0.0
        self._silence = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.BufferedProtocol ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        # never an empty buffer (uvloop treats one as a fatal error): past a complete
        # body, reads go to the scratch buffer, where any byte fails the connection
        if self._body is not None and self._got < self._want:
            return memoryview(self._body)[self._got :]
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        self._last = self._loop.time()
        self.answered = True
        if self._done is None or self._done.done():
            self._fail(ConnectionError("bytes from the store with no request outstanding"))
            return
        if self._body is not None:
            # (the future is done once the body is: bytes past it were refused above)
            self._got += nbytes
            if self._got == self._want:
                self._finish()
            return
        self._head += self._scratch[:nbytes]
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > _HEAD_MAX:
                self._fail(ConnectionError("an answer's head is over 64 KiB"))
            return
        try:
            self._parse_head(bytes(self._head[:end]))
        except (Unframed, ConnectionError) as exc:
            self._fail(exc)
            return
        except (ValueError, UnicodeError):
            self._fail(ConnectionError("a malformed answer head"))
            return
        rest = self._head[end + 4 :]
        self._head = bytearray()
        if len(rest) > self._want:
            self._fail(ConnectionError("the store sent more than the announced body"))
            return
        self._body = bytearray(self._want)
        self._body[: len(rest)] = rest
        self._got = len(rest)
        if self._got == self._want:
            self._finish()

    def eof_received(self) -> bool:
        self._fail(ConnectionResetError("the store closed the connection mid-answer"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(exc or ConnectionResetError("the store closed the connection"))

    # -- one exchange --------------------------------------------------------------

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise ConnectionError(f"not an HTTP/1.x answer: {lines[0][:40]!r}")
        self.status = int(rest[:3])
        headers: CIMultiDict[str] = CIMultiDict()
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ConnectionError("a malformed header line")
            headers.add(name.strip(), value.strip())
        self.headers = headers
        if self.status < 200 or "Transfer-Encoding" in headers:
            raise Unframed(f"HTTP {self.status}")
        length = headers.getall("Content-Length", [])
        if len(length) != 1 or not length[0].isdigit():
            raise Unframed("no single Content-Length")
        self._want = int(length[0])
        connection = headers.get("Connection", "").lower()
        self._keep = "close" not in connection and version != "HTTP/1.0"

    def _finish(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self._keep = False
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)
        self.close()

    def _check_silence(self) -> None:
        self._timer = None
        if self._done is None or self._done.done():
            return
        left = self._last + self._silence - self._loop.time()
        if left > 0:
            self._timer = self._loop.call_later(left, self._check_silence)
            return
        self._fail(TimeoutError(f"the store was silent for {self._silence:g} s"))

    async def get(self, request: bytes, read_timeout: float) -> tuple[int, Any, bytes]:
        """(status, headers, body) of one request; the connection stays usable only if
        :attr:`keep` says so afterwards."""
        assert self.transport is not None
        self._done = self._loop.create_future()
        self._body, self._got, self._want, self._head = None, 0, 0, bytearray()
        self.answered = False
        self._silence = read_timeout
        self._last = self._loop.time()
        self._timer = self._loop.call_later(read_timeout, self._check_silence)
        try:
            self.transport.write(request)
            await self._done
        except BaseException:
            self._keep = False
            self.close()
            raise
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        body = self._body
        self._body = None
        assert body is not None
        return self.status, self.headers, bytes(body)

    @property
    def keep(self) -> bool:
        return self._keep and not self.closed

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class RawPool:
    """Keep-alive connections to one plain-HTTP origin, for the loop and process that
    made them (a pool met from another loop or after fork starts empty)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._idle: list[_Conn] = []
        self._owner: tuple[asyncio.AbstractEventLoop, int] | None = None

    async def _connect(self, connect_timeout: float) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(loop), self.host, self.port),
                connect_timeout,
            )
        except TimeoutError:
            # the type the retry loop reads as "the store did not accept a connection"
            raise aiohttp.ConnectionTimeoutError(
                f"connecting to {self.host}:{self.port} took over {connect_timeout:g} s"
            ) from None
        return proto

    def _take(self) -> _Conn | None:
        owner = (asyncio.get_running_loop(), os.getpid())
        if self._owner != owner:
            self._idle, self._owner = [], owner  # another loop's or process's sockets
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                conn.reused = True
                return conn
        return None

    async def get(self, request: bytes, timeouts: tuple[float, float]) -> tuple[int, Any, bytes]:
        """Send ``request`` (a whole HTTP/1.1 GET) and read its answer. A reused
        connection the store closed while idle (nothing at all came back) is replaced
        by a fresh one once, as any keep-alive client does for an idempotent GET."""
        connect, read = timeouts
        conn = self._take()
        if conn is not None:
            try:
                return self._settle(conn, await conn.get(request, read))
            except OSError as exc:
                # a silent store is not an idle close: its time is the attempt's
                if conn.answered or isinstance(exc, TimeoutError):
                    raise
        conn = await self._connect(connect)
        return self._settle(conn, await conn.get(request, read))

    def _settle(self, conn: _Conn, answer: tuple[int, Any, bytes]) -> tuple[int, Any, bytes]:
        if conn.keep and len(self._idle) < IDLE_MAX:
            self._idle.append(conn)
        else:
            conn.close()
        return answer

    def close(self) -> None:
        idle, self._idle = self._idle, []
        try:
            mine = self._owner == (asyncio.get_running_loop(), os.getpid())
        except RuntimeError:
            mine = False
        if mine:  # another loop's transports are not ours to touch (as FastGet.close)
            for conn in idle:
                conn.close()

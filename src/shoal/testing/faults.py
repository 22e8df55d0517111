"""Fault injection for tests: a TCP fault proxy in front of a store, and wrappers that
make an :class:`~shoal.ufs.base.UnderStore` or a page-store tier fail on chosen calls
(:mod:`shoal.testing.faultystores`, re-exported here).

The proxy works below HTTP, on the byte streams, so what a store client sees is what a
real network does to it: a slow link, a peer that accepts and never answers, a reset,
a response cut short. Its mode is switched at run time, from any thread::

    with MotoServer() as moto, FaultProxy(moto.endpoint) as proxy:
        # point the dataset's endpoint_url at proxy.endpoint
        proxy.set(Mode.BLACKHOLE)      # existing and new connections hang
        proxy.set(Mode.TRUNCATE, truncate_after=1000)
        proxy.set(Mode.PASS)
        proxy.stats()                  # {"connections": 3, "resets": 1, ...}

Only 127.0.0.1 is bound; nothing here touches global state.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import socket
import struct
import threading
from types import TracebackType
from urllib.parse import urlsplit

from shoal.testing.faultystores import FaultyPageStore, FaultyUnderStore

CHUNK = 64 * 1024


class Mode(enum.Enum):
    #: forward bytes both ways
    PASS = "pass"
    #: forward, but wait ``latency`` seconds before each chunk in either direction
    LATENCY = "latency"
    #: accept and read, never forward and never answer (a dead peer whose TCP lives)
    BLACKHOLE = "blackhole"
    #: close connections with a TCP reset: new ones on accept, live ones at once
    RESET = "reset"
    #: forward requests; forward each response's head and then only ``truncate_after``
    #: bytes of its body, then close the connection
    TRUNCATE = "truncate"


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST rather than a FIN (SO_LINGER 0), as a crashed peer would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport = writer.transport
    with contextlib.suppress(Exception):
        transport.abort()


class FaultProxy:
    """A TCP proxy from ``127.0.0.1:<free port>`` to ``upstream`` whose faults are
    switched at run time. ``upstream`` is ``http://host:port`` or ``host:port``;
    ``endpoint`` is the proxy's own ``http://127.0.0.1:port``."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream if "//" in upstream else "tcp://" + upstream)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream needs a host and port: {upstream!r}")
        self.upstream_host: str = parts.hostname
        self.upstream_port: int = parts.port
        self.endpoint = ""
        self.port = 0
        self._mode = Mode.PASS
        self.latency = 0.0
        self.truncate_after = 0
        self._lock = threading.Lock()
        self._stats: collections.Counter[str] = collections.Counter()
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None

    # -- control (any thread) ---------------------------------------------------------

    @property
    def mode(self) -> Mode:
        return self._mode

    def set(
        self, mode: Mode, *, latency: float | None = None, truncate_after: int | None = None
    ) -> None:
        """Switch to ``mode``; RESET also resets every live connection."""
        if latency is not None:
            if latency < 0:
                raise ValueError("latency must be >= 0")
            self.latency = latency
        if truncate_after is not None:
            if truncate_after < 0:
                raise ValueError("truncate_after must be >= 0")
            self.truncate_after = truncate_after
        self._mode = mode
        if mode is Mode.RESET and self._loop is not None:
            fut = asyncio.run_coroutine_threadsafe(self._reset_all(), self._loop)
            fut.result(10)

    def reset_connections(self) -> None:
        """Reset every live connection now (e.g. those a blackhole left hanging, so that
        the client retries at once on a fresh one instead of waiting out its timeout)."""
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._reset_all(), self._loop).result(10)

    def stats(self) -> dict[str, int]:
        """Counters: connections, requests (client chunks), resets, truncated, dropped
        (client chunks swallowed by a blackhole), bytes_up, bytes_down."""
        with self._lock:
            return dict(self._stats)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    # -- serving ----------------------------------------------------------------------

    async def _reset_all(self) -> None:
        for w in list(self._writers):
            _rst(w)
            self._count("resets")

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self._count("connections")
        if self._mode is Mode.RESET:
            self._count("resets")
            _rst(cw)
            return
        self._writers.add(cw)
        uw: asyncio.StreamWriter | None = None
        try:
            if self._mode is Mode.BLACKHOLE:
                # never connect upstream: read and swallow until the client gives up
                await self._swallow(cr)
                return
            try:
                ur, uw = await asyncio.open_connection(self.upstream_host, self.upstream_port)
            except OSError:
                _rst(cw)
                return
            self._writers.add(uw)
            # a new request resets the body budget of the response that follows it
            state = _RespState()
            up = asyncio.ensure_future(self._pump_up(cr, uw, cw, state))
            down = asyncio.ensure_future(self._pump_down(ur, cw, uw, state))
            _, pending = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            for t in pending:
                t.cancel()
            for t in pending:
                with contextlib.suppress(BaseException):
                    await t
        finally:
            for w in (cw, uw):
                if w is None:
                    continue
                self._writers.discard(w)
                with contextlib.suppress(Exception):
                    w.close()

    async def _swallow(self, cr: asyncio.StreamReader) -> None:
        while True:
            data = await cr.read(CHUNK)
            if not data:
                return
            self._count("dropped")

    async def _pump_up(
        self,
        cr: asyncio.StreamReader,
        uw: asyncio.StreamWriter,
        cw: asyncio.StreamWriter,
        state: _RespState,
    ) -> None:
        while True:
            data = await cr.read(CHUNK)
            if not data:
                with contextlib.suppress(Exception):
                    uw.write_eof()
                # keep the other direction going until upstream finishes its answer
                await asyncio.Event().wait()
            mode = self._mode
            if mode is Mode.BLACKHOLE:
                self._count("dropped")
                continue
            if mode is Mode.RESET:
                self._count("resets")
                _rst(cw)
                _rst(uw)
                return
            if mode is Mode.LATENCY and self.latency > 0:
                await asyncio.sleep(self.latency)
            self._count("requests")
            self._count("bytes_up", len(data))
            state.new_request()
            uw.write(data)
            await uw.drain()

    async def _pump_down(
        self,
        ur: asyncio.StreamReader,
        cw: asyncio.StreamWriter,
        uw: asyncio.StreamWriter,
        state: _RespState,
    ) -> None:
        while True:
            data = await ur.read(CHUNK)
            if not data:
                with contextlib.suppress(Exception):
                    cw.write_eof()
                return
            mode = self._mode
            if mode is Mode.BLACKHOLE:
                continue  # the answer never arrives
            if mode is Mode.RESET:
                self._count("resets")
                _rst(cw)
                _rst(uw)
                return
            if mode is Mode.LATENCY and self.latency > 0:
                await asyncio.sleep(self.latency)
            if mode is Mode.TRUNCATE:
                keep = state.allow(data, self.truncate_after)
                if keep is not None:
                    cw.write(data[:keep])
                    self._count("bytes_down", keep)
                    with contextlib.suppress(Exception):
                        await cw.drain()
                    self._count("truncated")
                    # a FIN, not a reset: a reset would discard the bytes let through
                    # that the client has not read yet
                    with contextlib.suppress(Exception):
                        cw.close()
                        await cw.wait_closed()
                    _rst(uw)
                    return
            self._count("bytes_down", len(data))
            cw.write(data)
            await cw.drain()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            _rst(w)
        self._writers.clear()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    def start(self) -> FaultProxy:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), loop).result(10)
        return self

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class _RespState:
    """Where the current response of one connection is: its head ends at the first
    blank line, then ``truncate_after`` body bytes are let through."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.in_body = False
        self.body = 0

    def new_request(self) -> None:
        self.head.clear()
        self.in_body = False
        self.body = 0

    def allow(self, data: bytes, limit: int) -> int | None:
        """None: forward all of ``data``; else forward only that many bytes and cut."""
        offset = 0
        if not self.in_body:
            before = len(self.head)
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return None
            self.in_body = True
            offset = end + 4 - before
        room = limit - self.body
        rest = len(data) - offset
        if rest <= room:
            self.body += rest
            return None
        return offset + room


__all__ = ["CHUNK", "FaultProxy", "FaultyPageStore", "FaultyUnderStore", "Mode"]

"""Blocking reads over TCP on the caller's thread: the sync client's remote path.

Measured by the remote benchmark (issue 13), a 1 MiB read over TCP paid a fixed cost
per request larger than its copy: the synchronous façade's hop to the event-loop
thread and back (a semaphore, a condition, ``run_coroutine_threadsafe``), asyncio's
``sock_recv_into`` adding and removing a reader each time the socket ran dry, and a
copy of the answer out of the receive buffer. Here the caller's own thread sends the
typed READ on a blocking connection of its own to the worker and receives the answer
with ``recv`` (``MSG_WAITALL``: one system call for the whole data, straight into the
bytes returned, no user-space copy), and a sequential reader asks for
:data:`~shoal.client.ahead.AHEAD` bytes at once (the async path's read-ahead, shared).

A sequential reader's requests are pipelined: with each read it sends the request for
the window after it, before it receives its own answer, so the worker streams the next
window while the caller checks and consumes this one (one synchronous stream measured
0.31-0.43x raw TCP, serialized: the worker idle while the client received and hashed,
and the other way round). The worker answers a connection's requests in order; the
answer sent ahead is taken by the read that starts where it starts, or, when another
read of this thread comes first, received and kept as read-ahead bytes (never dropped
unread into the stream). It is used only within :data:`~shoal.client.ahead.MAX_AGE`
seconds of its request and only for the very request the client would send now (same
version, generation, offset and length), and checked as any answer is.

The path is an accelerator, never a second implementation of the rules: it runs only
when everything it needs is already known and fresh (the dataset's definition and the
ring within ``ring_refresh``, the file's owner healthy and on another host), sends the
version the client knows, checks the reply's version, layout and every page's xxh3
exactly as :meth:`AsyncClient._read_from <shoal.client.aio.AsyncClient._read_from>`
does, and opens connections with the same HELLO (version, token, worker id) and TLS
context as the worker's :class:`~shoal.client.conn.Pool`. Anything else -- a
connection that fails or times out, a stale version or layout, a bad checksum -- gives
up (None) and the caller asks the async path, which fails over, reports and falls
back as it always does. A worker's definite error answer (NotFound, ...) is raised
as the async path would raise it.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import xxhash

from shoal.client.ahead import AHEAD, MAX_AGE
from shoal.client.cache import WorkerAddr
from shoal.client.conn import _REUSE_FOR, Pool
from shoal.client.routing import EXTRA_OWNERS, SUSPECT_FOR
from shoal.core.types import Dataset, FileInfo, NsPath, split_path
from shoal.errors import (
    CorruptData,
    ProtocolError,
    ShoalError,
    StaleLayout,
    StaleVersion,
    Unavailable,
)
from shoal.proto import wire
from shoal.proto.messages import ReadRequest, Request, decode_reply, encode_request

if TYPE_CHECKING:
    from shoal.client.aio import AsyncClient

_xxh3 = xxhash.xxh3_64_intdigest
#: errors after which the async path is asked instead (it fails over and reports)
_RETRY_ASYNC = (StaleVersion, CorruptData, StaleLayout, Unavailable, ProtocolError)


class _Sent:
    """A READ sent ahead on a connection: its answer follows the current one."""

    __slots__ = ("at", "ds", "req")

    def __init__(self, ds: Dataset, req: ReadRequest) -> None:
        self.ds = ds
        self.req = req
        self.at = time.monotonic()


class _Conn:
    """One blocking connection to a worker, used by one thread at a time. Requests may
    be pipelined: the worker answers them in order, and :meth:`recv` takes the oldest
    answer not yet received."""

    __slots__ = (
        "__weakref__",
        "address",
        "ahead",
        "answered",
        "idle_since",
        "req_id",
        "sent",
        "sock",
        "tls",
    )

    def __init__(self, sock: socket.socket, address: tuple[str, int], tls: bool) -> None:
        self.sock = sock
        self.address = address
        self.tls = tls
        #: the id of the last request sent
        self.req_id = 0
        #: ids of the requests sent whose answers are not received yet, oldest first
        self.sent: deque[int] = deque()
        #: the read sent ahead (its answer is the last in ``sent``), if any
        self.ahead: _Sent | None = None
        self.idle_since = time.monotonic()
        self.answered = False

    def send(self, req: Request[Any]) -> None:
        self.req_id = (self.req_id + 1) & 0xFFFFFFFF
        if not self.sent:
            self.answered = False
        self.sock.sendall(encode_request(req, self.req_id))
        self.sent.append(self.req_id)

    def recv(self) -> tuple[int, int, bytearray, bytes]:
        """(status, epoch, meta, data) of the oldest answer not yet received; OSError,
        EOFError or ProtocolError when the connection is unusable."""
        status, epoch, meta, data_len = self.recv_head()
        data = self.recv_data(data_len) if data_len else b""
        return status, epoch, meta, data

    def recv_head(self) -> tuple[int, int, bytearray, int]:
        """(status, epoch, meta, data length) of the oldest answer not yet received: its
        data is next on the connection, to be taken whole by :meth:`recv_data` calls
        (or the connection closed) before anything else is received."""
        rid, sock = self.sent.popleft(), self.sock
        hdr = bytearray(wire.RESP_HDR.size)
        wire.recv_exactly(sock, memoryview(hdr))
        self.answered = True
        status, req_id, epoch, meta_len, data_len = wire.RESP_HDR.unpack(hdr)
        if req_id != rid:
            raise ProtocolError(f"response {req_id} for request {rid}")
        meta = bytearray(meta_len)
        wire.recv_exactly(sock, memoryview(meta))
        return status, epoch, meta, data_len

    def recv_data(self, n: int) -> bytes:
        """The next ``n`` bytes of an answer's data."""
        return _recv_bytes(self.sock, n, self.tls)

    def close(self) -> None:
        self.ahead = None
        try:
            self.sock.close()
        except OSError:
            pass


def _recv_bytes(sock: socket.socket, n: int, tls: bool) -> bytes:
    """``n`` bytes: on a plain socket one ``recv(MSG_WAITALL)`` into the bytes object
    itself; a short one (a signal, a debugger's stop, the receive timeout) is completed
    and joined (one copy)."""
    if tls:  # records of at most 16 KB: into one buffer, one copy out
        buf = bytearray(n)
        wire.recv_exactly(sock, memoryview(buf))
        return bytes(buf)
    parts = []
    left = n
    while left:
        data = sock.recv(left, socket.MSG_WAITALL)
        if not data:
            raise EOFError("worker closed the connection")
        if len(data) == n:
            return data
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


class BlockingReads:
    """Per-thread blocking connections to remote workers, and the reads over them."""

    def __init__(self, aio: AsyncClient, on_epoch: Callable[[], None]) -> None:
        self.aio = aio
        self.cache = aio.cache
        self.settings = aio.settings
        #: a reply's ring epoch is newer than the ring: refresh it (on the loop)
        self.on_epoch = on_epoch
        self._local = threading.local()
        #: every connection of every thread (closed by close())
        self._all: weakref.WeakSet[_Conn] = weakref.WeakSet()
        #: worker id -> until when this path leaves it to the async one
        self._down: dict[str, float] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def read(self, path: str, offset: int, length: int) -> bytes | None:
        """Bytes [offset, offset+length) over a blocking connection, or None: ask the
        async path (see the module docstring)."""
        if self._closed or offset < 0 or length == 0 or length < -1:
            return None
        try:
            np = split_path(path)
        except ShoalError:
            return None
        now = time.monotonic()
        ds = self.dataset(np.dataset, now)
        if ds is None or not np.rel:
            return None
        placed = self.placed(ds, np, now)
        if placed is None:
            return None
        key, w = placed
        ahead = self.aio._ahead
        info = self.cache.info(ds, key)
        ask, then = length, None
        if length > 0 and ahead.sequential(ds, key, offset):
            # a sequential reader: one request for its next reads, and (when the file
            # goes on past them) the one after it sent along, pipelined
            ask = max(length, AHEAD)
            if info is not None and offset + ask < info.size:
                then = _Sent(ds, self._request(ds, key, offset + ask, ask, info))
        ahead.begin(ds, key)
        data = None
        try:
            data = self._read_from(w, ds, self._request(ds, key, offset, ask, info), then)
        finally:
            # not served here: the async path's read of it is the one that counts
            ahead.end(ds, key, offset, length if data is not None else 0)
        if data is None or ask == length or len(data) <= length:
            return data
        ahead.keep(ds, key, offset, data)
        return data[:length]

    def dataset(self, name: str, now: float) -> Dataset | None:
        """The dataset's definition when it and the ring are known and fresh."""
        c = self.cache
        hit = c.datasets.get(name)
        fresh = self.settings.ring_refresh
        if hit is None or c.ring is None or now - c.checked_at > fresh or now - c.ring_at > fresh:
            return None
        return hit[0]

    def placed(self, ds: Dataset, np: NsPath, now: float) -> tuple[str, WorkerAddr] | None:
        """(key in its mount, the remote worker to ask) of a file path, or None."""
        try:
            ds.mount(np.mount)
        except ShoalError:
            return None
        key = np.key_path
        w = self.owner(ds, key, now)
        return None if w is None else (key, w)

    def owner(self, ds: Dataset, key: str, now: float) -> WorkerAddr | None:
        """The worker the async path would ask first, when it is remote and healthy
        (Router.owners' order); else None."""
        router = self.aio.router
        ring = self.cache.ring
        assert ring is not None
        ids = ring.owners(f"{ds.name}/{key}", ds.policy.replicas + EXTRA_OWNERS)
        addrs = [self.cache.workers[i] for i in ids if i in self.cache.workers]
        if ds.policy.placement == "local":
            addrs.sort(key=lambda w: w.node != self.settings.node)
        suspect = router._suspect
        for w in addrs:
            if suspect.get(w.id, 0.0) > now:
                continue
            if router.is_local(w) or self._down.get(w.id, 0.0) > now or not w.host:
                return None  # the short circuit's, or left to the async path
            return w
        return None

    @staticmethod
    def _request(
        ds: Dataset, key: str, offset: int, length: int, info: FileInfo | None
    ) -> ReadRequest:
        """The READ the async path would send, in the version the client knows."""
        version = info.version if info is not None else None
        ps = ds.policy.page_size
        return ReadRequest(ds.name, key, offset, length, version, ps, ds.generation)

    def _read_from(
        self, w: WorkerAddr, ds: Dataset, req: ReadRequest, then: _Sent | None
    ) -> bytes | None:
        got = self._call(w, req, then)
        return None if got is None else self._check(ds, req, got)

    def _check(
        self, ds: Dataset, req: ReadRequest, got: tuple[int, int, bytearray, bytes]
    ) -> bytes | None:
        """The bytes of ``req``'s answer, checked as the async path checks them, or None
        (the async path asks again); a worker's definite error is raised."""
        c = self.cache
        key, offset, length = req.path, req.offset, req.length
        ps = ds.policy.page_size
        status, epoch, meta, data = got
        try:
            m = decode_reply(req, status, meta)
        except StaleVersion:
            c.forget(ds.name, key)
            return None
        except _RETRY_ASYNC:
            return None
        ring = c.ring
        if ring is not None and epoch > ring.epoch:
            self.on_epoch()
        if self.aio.router.layout_moved(ds):
            return None
        c.remember(ds.name, FileInfo(key, m.size, m.version, m.mtime))
        view = memoryview(data)
        pos = 0
        for n, ck in m.pages:
            if len(view[pos : pos + n]) != n or _xxh3(view[pos : pos + n]) != ck:
                return None  # the async path reads it again, reports and refetches
            pos += n
        start = offset - m.first * ps
        end = len(data) if length < 0 else start + length
        out = data if start == 0 and end >= len(data) else data[start:end]
        want = max(0, (m.size if length < 0 else min(m.size, offset + length)) - offset)
        if pos != len(data) or len(out) != want:
            return None  # a reply that does not cover the range: never returned
        c.counters.remote += 1
        c.counters.bytes_remote += len(data)
        return out

    def _call(
        self, w: WorkerAddr, req: ReadRequest, then: _Sent | None = None
    ) -> tuple[int, int, bytearray, bytes] | None:
        """``req``'s answer on this thread's connection to ``w`` (a reused one found
        closed before any byte of an answer is replaced once), with ``then`` sent
        ahead after it; or None."""
        for attempt in (0, 1):
            took = self.take(w, pipelined=True)
            if took is None:
                return None
            conn, reused = took
            try:
                got = self._exchange(conn, req, then)
            except Exception:  # OSError, EOFError, ProtocolError, ...: the async path's
                conn.close()
                if reused and not conn.answered and attempt == 0:
                    continue
                self.failed(w)
                return None
            self.keep(w, conn)
            return got
        return None

    def _exchange(
        self, conn: _Conn, req: ReadRequest, then: _Sent | None
    ) -> tuple[int, int, bytearray, bytes]:
        """Send what is not in flight yet of ``req`` and ``then``, then receive ``req``'s
        answer: the one sent ahead when it is this very request and fresh."""
        p = conn.ahead
        if p is not None and (p.req != req or time.monotonic() - p.at > MAX_AGE):
            self._set_aside(conn)
            p = None
        conn.ahead = None
        if p is None:
            conn.send(req)
        if then is not None:
            conn.send(then.req)
            conn.ahead = then
        return conn.recv()

    def _set_aside(self, conn: _Conn) -> None:
        """Receive the answer sent ahead on ``conn`` (another request comes first) and
        keep its bytes as read-ahead when they are fresh and check out."""
        p, conn.ahead = conn.ahead, None
        if p is None:
            return
        got = conn.recv()
        if time.monotonic() - p.at > MAX_AGE:
            return  # too old to be served: dropped
        try:
            data = self._check(p.ds, p.req, got)
        except ShoalError:
            return
        if data is not None:
            self.aio._ahead.keep(p.ds, p.req.path, p.req.offset, data)

    def take(self, w: WorkerAddr, pipelined: bool = False) -> tuple[_Conn, bool] | None:
        """This thread's connection to ``w`` and whether it was reused (then it may
        have been closed by the worker while idle), or None: ask the async path. Unless
        ``pipelined``, an answer still in flight on it is received first."""
        conns: dict[str, _Conn] | None = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        pool = self.aio.router._pool(w, False)
        addr = pool.address
        if isinstance(addr, str):
            return None
        conn = conns.pop(w.id, None)
        if conn is not None:
            if conn.address == addr and time.monotonic() - conn.idle_since < _REUSE_FOR:
                if conn.ahead is None or pipelined:
                    return conn, True
                try:
                    self._set_aside(conn)
                    return conn, True
                except Exception:  # OSError, EOFError, ProtocolError: a new connection
                    pass
            conn.close()
        conn = self._open(w, pool, addr)
        return None if conn is None else (conn, False)

    def keep(self, w: WorkerAddr, conn: _Conn) -> None:
        """``conn`` answered whole: this thread's connection to ``w`` again."""
        conn.idle_since = time.monotonic()
        old = self._local.conns.get(w.id)
        if old is not None and old is not conn:
            old.close()
        self._local.conns[w.id] = conn

    def failed(self, w: WorkerAddr) -> None:
        """``w`` failed on this path: leave it to the async path for a while."""
        self._down[w.id] = time.monotonic() + SUSPECT_FOR

    def _open(self, w: WorkerAddr, pool: Pool, addr: tuple[str, int]) -> _Conn | None:
        """A connection that said the pool's HELLO (token, version, worker id), over
        the pool's TLS context; None (and the async path is asked) on any failure."""
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection(addr, timeout=pool.probe_after)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            except OSError:
                pass
            if pool.tls is not None:
                sock = pool.tls.wrap_socket(sock, server_hostname=addr[0])
            # blocking from here, each wait bounded by the kernel (SO_RCVTIMEO): a
            # worker slower than the liveness probe's time is left to the async path
            sock.settimeout(None)
            tv = struct.pack("ll", int(pool.probe_after), int(pool.probe_after % 1 * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
            conn = _Conn(sock, addr, pool.tls is not None)
            conn.send(pool.greeting)
            status, _epoch, meta, _data = conn.recv()
            hello = decode_reply(pool.greeting, status, meta)
            wire.check_hello(hello.version, f"{addr[0]}:{addr[1]}")
            if pool.worker and hello.worker != pool.worker:
                raise Unavailable(f"the worker at {addr} is {hello.worker!r}")
        except Exception:  # OSError, ShoalError, ssl.SSLError, ...: the async path's
            if sock is not None:
                sock.close()
            self.failed(w)
            return None
        self._all.add(conn)
        return conn

    def close(self) -> None:
        """Close every thread's connections; later reads go the async way."""
        self._closed = True
        for conn in list(self._all):
            conn.close()

"""The worker's answers over TCP (shoal.worker.conn.Conn) when the socket fills: the
located pages go on with sendfile as it drains (never read into the worker), in
order with the answer's other pieces, one answer at a time, and a client that leaves
mid-answer leaves no descriptor open."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import uvloop

from shoal.proto import wire
from shoal.proto.messages import (
    HelloReply,
    HelloRequest,
    ReadReply,
    ReadRequest,
    encode_request,
)
from shoal.store.base import Location
from shoal.worker.conn import Conn
from shoal.worker.ops import Answer

SIZE = 12 << 20


class _Service:
    """What Conn asks of the DataService: every READ is answered from ``path``."""

    epoch = 3

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.buffered = 0
        self.conns: set[Conn] = set()
        self.notes: list[str] = []
        self.latency = self
        self.released: asyncio.Event | None = None

    def observe(self, *_a: Any) -> None:
        pass

    def admit(self, conn: Conn, peer: Any) -> bool:
        self.conns.add(conn)
        return True

    def release(self, conn: Conn, peer: Any) -> None:
        self.conns.discard(conn)
        if self.released is not None:
            self.released.set()

    def note(self, kind: str, detail: str) -> None:
        self.notes.append(kind)

    def authenticate(self, req: Any, peer: Any) -> None:
        return None

    def internal(self, op: Any, exc: Exception) -> Exception:
        raise AssertionError(f"internal error: {exc!r}")

    def try_fast(self, req: Any, local: bool) -> Answer:
        if isinstance(req, HelloRequest):
            return Answer(HelloReply(wire.VERSION, "w", "n", self.epoch))
        half = SIZE // 2
        pieces: list[Any] = [
            Location(self.path, req.offset, half, 0),
            b"-middle-",
            Location(self.path, req.offset + half, half, 0),
        ]
        return Answer(ReadReply("v", SIZE, 0.0, 0, [[SIZE + 8, 0]]), pieces)


def _recv_exact(s: socket.socket, n: int, chunk: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = s.recv(min(chunk, n - len(out)))
        if not got:
            raise EOFError(f"closed after {len(out)} of {n} bytes")
        out += got
    return bytes(out)


def _answer(s: socket.socket, chunk: int) -> tuple[int, bytes]:
    head = _recv_exact(s, wire.RESP_HDR.size, chunk)
    status, req_id, _epoch, meta_len, data_len = wire.RESP_HDR.unpack(head)
    assert status == wire.Status.OK
    _recv_exact(s, meta_len, chunk)
    return req_id, _recv_exact(s, data_len, chunk)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    p = tmp_path / "pages"
    p.write_bytes(os.urandom(SIZE + 4096))
    return p


def _serve(svc: _Service, client: Any) -> Any:
    """Run a Conn server on uvloop and ``client(port)`` in a thread; its result."""

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Conn(svc, False), "127.0.0.1", 0)  # type: ignore[arg-type]
        port = server.sockets[0].getsockname()[1]
        try:
            return await asyncio.wait_for(asyncio.to_thread(client, port), 60)
        finally:
            server.close()
            for c in list(svc.conns):
                c._close()
            await asyncio.sleep(0)

    return uvloop.run(main())


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # the worker's socket fills
    s.sendall(encode_request(HelloRequest(), 1))
    _answer(s, 1 << 16)
    return s


def test_pages_go_on_with_sendfile_as_the_socket_drains(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    preads: list[int] = []
    real = os.pread

    def pread(fd: int, n: int, off: int) -> bytes:
        preads.append(n)
        return real(fd, n, off)

    monkeypatch.setattr(os, "pread", pread)
    svc = _Service(data)
    raw = data.read_bytes()

    def client(port: int) -> list[tuple[int, bytes]]:
        with _connect(port) as s:
            # two requests at once: the second is answered only after the first is out
            s.sendall(encode_request(ReadRequest("ds", "f", 0, -1), 2))
            s.sendall(encode_request(ReadRequest("ds", "f", 4096, -1), 3))
            return [_answer(s, 16 << 10), _answer(s, 16 << 10)]

    (id1, got1), (id2, got2) = _serve(svc, client)
    half = SIZE // 2
    assert (id1, id2) == (2, 3)
    assert got1 == raw[:half] + b"-middle-" + raw[half:SIZE]
    assert got2 == raw[4096 : 4096 + half] + b"-middle-" + raw[4096 + half : 4096 + SIZE]
    assert preads == []  # every page went out with sendfile
    assert svc.notes == []


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_client_gone_mid_answer_leaves_no_descriptor_open(data: Path) -> None:
    svc = _Service(data)
    gone = threading.Event()

    def client(port: int) -> None:
        with _connect(port) as s:
            s.sendall(encode_request(ReadRequest("ds", "f", 0, -1), 2))
            _recv_exact(s, 1 << 20, 1 << 16)  # some of the answer, then leave
        gone.set()

    before = _open_fds()

    def run() -> None:
        async def main() -> None:
            loop = asyncio.get_running_loop()
            server = await loop.create_server(lambda: Conn(svc, False), "127.0.0.1", 0)  # type: ignore[arg-type]
            port = server.sockets[0].getsockname()[1]
            svc.released = asyncio.Event()
            await asyncio.wait_for(asyncio.to_thread(client, port), 60)
            await asyncio.wait_for(svc.released.wait(), 30)  # the worker saw it go
            server.close()
            await server.wait_closed()

        uvloop.run(main())

    run()
    assert gone.is_set()
    assert _open_fds() <= before


def test_a_peer_that_stops_reading_mid_answer_is_swept(data: Path) -> None:
    svc = _Service(data)
    stalled = threading.Event()
    done = threading.Event()

    def client(port: int) -> None:
        with _connect(port) as s:
            s.sendall(encode_request(ReadRequest("ds", "f", 0, -1), 2))
            _recv_exact(s, 1 << 20, 1 << 16)
            stalled.set()  # reads no more, stays connected
            done.wait(30)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Conn(svc, False), "127.0.0.1", 0)  # type: ignore[arg-type]
        port = server.sockets[0].getsockname()[1]
        svc.released = asyncio.Event()
        reader = asyncio.ensure_future(asyncio.to_thread(client, port))
        try:
            await asyncio.wait_for(asyncio.to_thread(stalled.wait, 30), 40)
            (conn,) = svc.conns
            assert conn._sending  # the rest of the answer waits for the socket
            for _ in range(5):  # as the idle sweeps would, one per quarter timeout
                conn.sweep()
            await asyncio.wait_for(svc.released.wait(), 30)
        finally:
            done.set()
            await reader
            server.close()

    uvloop.run(main())

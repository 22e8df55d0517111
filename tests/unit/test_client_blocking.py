"""shoal.client.blocking's pieces without a cluster: the receive helpers, the framing
checks, and the cases it leaves to the async path (returns None)."""

from __future__ import annotations

import socket
import threading

import pytest

from shoal.client import blockbatch
from shoal.client.aio import AsyncClient
from shoal.client.blocking import BlockingReads, _Conn, _recv_bytes
from shoal.config import ClientSettings
from shoal.errors import ProtocolError
from shoal.proto import wire
from shoal.proto.messages import HelloRequest


def _send_in_pieces(s: socket.socket, data: bytes, close: bool) -> threading.Thread:
    def run() -> None:
        for i in range(0, len(data), 65_537):
            s.sendall(data[i : i + 65_537])
        if close:
            s.close()

    t = threading.Thread(target=run)
    t.start()
    return t


def test_recv_bytes_is_exact_over_many_pieces() -> None:
    a, b = socket.socketpair()
    data = bytes(range(256)) * 20_000
    t = _send_in_pieces(b, data, close=False)
    assert _recv_bytes(a, len(data), tls=False) == data
    t.join()
    t = _send_in_pieces(b, data, close=False)
    assert _recv_bytes(a, len(data), tls=True) == data  # the recv_into way
    t.join()
    a.close()
    b.close()


def test_recv_bytes_raises_when_the_peer_closes_early() -> None:
    a, b = socket.socketpair()
    t = _send_in_pieces(b, b"x" * 1000, close=True)
    with pytest.raises(EOFError):
        _recv_bytes(a, 5000, tls=False)
    t.join()
    a.close()


def test_an_answer_to_another_request_is_refused() -> None:
    a, b = socket.socketpair()
    conn = _Conn(a, ("127.0.0.1", 1), tls=False)
    conn.send(HelloRequest())
    b.recv(1 << 16)
    b.sendall(wire.RESP_HDR.pack(0, conn.req_id + 1, 0, 0, 0))
    with pytest.raises(ProtocolError, match="response"):
        conn.recv()
    conn.close()
    b.close()


def test_what_it_does_not_know_is_left_to_the_async_path() -> None:
    aio = AsyncClient(ClientSettings(master="http://127.0.0.1:1"))
    b = BlockingReads(aio, lambda: None)
    assert b.read("/ds/m/f", 0, 1 << 20) is None  # no dataset, no ring
    assert b.read("not a path", 0, 1) is None
    assert b.read("/ds/m/f", 0, 0) is None
    assert blockbatch.cat_many(b, ["/ds/m/f"]) is None
    b.close()
    assert b.read("/ds/m/f", 0, 1) is None
    assert blockbatch.cat_many(b, ["/ds/m/f"]) is None

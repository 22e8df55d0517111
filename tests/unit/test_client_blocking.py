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


def _batch_answer(
    peer: socket.socket, req_id: int, files: list[tuple[str, bytes, int, bool]], cut: int = 0
) -> None:
    """A worker's BATCH answer: (path, bytes, checksum, ok) per file; ``cut``: close
    the connection that many bytes before the data's end."""
    from shoal.proto.messages import BatchItem, BatchReply, ItemStatus, encode_reply

    items = tuple(
        BatchItem(p, ItemStatus.OK, "v1", len(d), ck) if ok else BatchItem(p, ItemStatus.NOT_SMALL)
        for p, d, ck, ok in files
    )
    data = b"".join(d for _, d, _, ok in files if ok)
    frame = encode_reply(req_id, 0, BatchReply(items), len(data)) + data
    peer.sendall(frame[: len(frame) - cut])
    if cut:
        peer.close()


@pytest.mark.parametrize("cut", [0, 50_000])
def test_a_batch_answer_is_received_file_by_file_and_checked(cut: int) -> None:
    """Each file is its own bytes, checked against its xxh3: a bad one and one the
    batch does not carry go to the async path, and a connection that dies in the data
    keeps the files received before it and leaves the rest to the async path."""
    import xxhash

    from shoal.client.cache import WorkerAddr
    from shoal.core.types import Dataset, Mount
    from shoal.proto.messages import BatchRequest

    aio = AsyncClient(ClientSettings(master="http://127.0.0.1:1"))
    b = BlockingReads(aio, lambda: None)
    b._local.conns = {}
    ds = Dataset("ds", (Mount("m", "file:///x"),))
    w = WorkerAddr("w1", "10.0.0.2", 1, "", "n2")
    a, peer = socket.socketpair()
    conn = _Conn(a, ("10.0.0.2", 1), tls=False)
    good = [bytes([i]) * (100_000 + i) for i in range(3)]
    h = xxhash.xxh3_64_intdigest
    files = [
        ("m/a", good[0], h(good[0]), True),
        ("m/b", good[1], h(good[1]) ^ 1, True),  # corrupt on the way
        ("m/big", b"", 0, False),
        ("m/c", good[2], h(good[2]), True),
    ]
    items = [(f"/ds/{p}", p) for p, *_ in files]
    req = BatchRequest("ds", tuple(p for p, *_ in files), 1)
    conn.send(req)
    peer.recv(1 << 16)
    t = threading.Thread(target=_batch_answer, args=(peer, conn.req_id, files, cut))
    t.start()
    out: blockbatch.Out = {}
    rest: blockbatch.Rest = []
    blockbatch._answer(b, ds, w, items, conn, req, out, rest)
    t.join()
    assert out["/ds/m/a"] == good[0] and type(out["/ds/m/a"]) is bytes
    if cut:
        assert set(out) == {"/ds/m/a"} and rest == ["/ds/m/b", "/ds/m/big", "/ds/m/c"]
        assert "w1" not in b._local.conns  # closed, not reused
    else:
        assert out["/ds/m/c"] == good[2] and set(out) == {"/ds/m/a", "/ds/m/c"}
        assert rest == ["/ds/m/b", "/ds/m/big"]
        assert b._local.conns["w1"] is conn  # the answer taken whole: reused
        assert aio.cache.meta.get(("ds", "m/c"))[0].version == "v1"
    conn.close()
    peer.close()
    b.close()

"""The sync client's blocking GETs to the master (shoal.client.bootstrap), against a
real HTTP server in this process: both answers asked at once come back in order, a
chunked answer is put together, and anything but a plain 200 with JSON (an error
status, https, credentials in the URL, a body cut short) is left to the async client
(NotPlain), as is a master that takes no connection; the next address of a list is
tried when one refuses."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from shoal.client.bootstrap import NotPlain, master_get, parse_ring
from shoal.errors import ProtocolError

RING = {
    "epoch": 3,
    "workers": [{"id": "w1", "host": "127.0.0.1", "port": 7, "uds": "/s", "node": "n"}],
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:
        _Handler.seen.append((self.path, self.headers.get("Authorization")))
        body = json.dumps({"path": self.path}).encode()
        if self.path == "/api/v1/ring":
            body = json.dumps(RING).encode()
        if self.path == "/missing":
            self.send_response(404)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            return
        if self.path == "/short":
            self.send_response(200)
            self.send_header("Content-Length", str(len(body) + 10))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        if self.path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (body[:5], body[5:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def master() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    t.start()
    _Handler.seen = []
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _refusing_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


def test_answers_come_back_in_order_with_the_token(master: str) -> None:
    got = master_get(master, ["/api/v1/ring", "/a/b", "/chunked"], "tok")
    assert got == [RING, {"path": "/a/b"}, {"path": "/chunked"}]
    assert sorted(_Handler.seen) == sorted(
        [("/api/v1/ring", "Bearer tok"), ("/a/b", "Bearer tok"), ("/chunked", "Bearer tok")]
    )
    ring, workers, gen = parse_ring(got[0])
    assert ring.epoch == 3 and workers["w1"].uds == "/s" and gen is None
    assert master_get(master, ["/x"], None) == [{"path": "/x"}]
    assert _Handler.seen[-1] == ("/x", None)


def test_the_next_master_is_tried_when_one_refuses(master: str) -> None:
    dead = f"http://127.0.0.1:{_refusing_port()}"
    assert master_get(f"{dead},{master}", ["/y"], None) == [{"path": "/y"}]
    with pytest.raises(NotPlain):
        master_get(dead, ["/y"], None)


@pytest.mark.parametrize("path", ["/missing", "/short"])
def test_an_error_or_a_cut_answer_is_left_to_the_async_client(master: str, path: str) -> None:
    with pytest.raises(NotPlain):
        master_get(master, [path], None)


@pytest.mark.parametrize("url", ["https://127.0.0.1:1", "http://u:p@127.0.0.1:1"])
def test_tls_or_credentials_are_left_to_the_async_client(url: str) -> None:
    with pytest.raises(NotPlain):
        master_get(url, ["/z"], None)


def test_a_malformed_ring_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        parse_ring({"workers": []})
    with pytest.raises(ProtocolError):
        parse_ring({"epoch": 1, "workers": [{"id": "w"}]})

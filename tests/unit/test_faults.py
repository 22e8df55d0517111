"""The fault proxy and fault wrappers of shoal.testing.faults, against a local HTTP
server (no store needed)."""

from __future__ import annotations

import asyncio
import http.client
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.config import TierSpec
from shoal.errors import RetryableStoreError
from shoal.store.base import PageStore
from shoal.store.disk import DiskTier
from shoal.testing.faults import FaultProxy, FaultyPageStore, FaultyUnderStore, Mode
from shoal.testing.store_conformance import PageStoreConformance, StoreFactory, blob, fkey, put_file
from shoal.ufs.local import LocalStore

BODY = bytes(range(256)) * 400  # 102,400 bytes: several proxy chunks


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as store clients use

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(upstream: str) -> Iterator[FaultProxy]:
    with FaultProxy(upstream) as p:
        yield p


def _get(proxy: FaultProxy, timeout: float = 5.0) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout)
    try:
        conn.request("GET", "/x")
        return conn.getresponse().read()
    finally:
        conn.close()


def test_pass_forwards_bytes_and_counts(proxy: FaultProxy) -> None:
    assert proxy.endpoint.startswith("http://127.0.0.1:")
    for _ in range(3):
        assert _get(proxy) == BODY
    s = proxy.stats()
    assert s["connections"] == 3 and s["bytes_down"] > 3 * len(BODY)


def test_keep_alive_connection_survives_several_requests(proxy: FaultProxy) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
    try:
        for _ in range(4):
            conn.request("GET", "/x")
            assert conn.getresponse().read() == BODY
    finally:
        conn.close()
    assert proxy.stats()["connections"] == 1


def test_latency_delays_each_request(proxy: FaultProxy) -> None:
    proxy.set(Mode.LATENCY, latency=0.2)
    t0 = time.monotonic()
    assert _get(proxy) == BODY
    # one delay on the request and at least one on the response
    assert time.monotonic() - t0 >= 0.4
    proxy.set(Mode.PASS)
    assert _get(proxy) == BODY


def test_blackhole_accepts_and_never_answers(proxy: FaultProxy) -> None:
    proxy.set(Mode.BLACKHOLE)
    with pytest.raises(TimeoutError):
        _get(proxy, timeout=0.5)
    assert proxy.stats()["dropped"] >= 1
    proxy.set(Mode.PASS)
    assert _get(proxy) == BODY


def test_blackhole_stalls_a_live_connection(proxy: FaultProxy) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=0.5)
    try:
        conn.request("GET", "/x")
        assert conn.getresponse().read() == BODY
        proxy.set(Mode.BLACKHOLE)
        conn.request("GET", "/x")
        with pytest.raises(TimeoutError):
            conn.getresponse().read()
    finally:
        conn.close()


def test_reset_refuses_new_and_breaks_live_connections(proxy: FaultProxy) -> None:
    live = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    try:
        live.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while len(got) < len(BODY):
            got += live.recv(1 << 16)
        proxy.set(Mode.RESET)
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            _get(proxy)
        # the live connection was reset too: EOF or a reset, never a hang
        try:
            assert live.recv(1) == b""
        except ConnectionResetError:
            pass
    finally:
        live.close()
    assert proxy.stats()["resets"] >= 2
    proxy.set(Mode.PASS)
    assert _get(proxy) == BODY


@pytest.mark.parametrize("keep", [0, 1000, len(BODY) - 1])
def test_truncate_cuts_the_body_after_n_bytes(proxy: FaultProxy, keep: int) -> None:
    proxy.set(Mode.TRUNCATE, truncate_after=keep)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
    try:
        conn.request("GET", "/x")
        resp = conn.getresponse()
        assert resp.status == 200  # the head came through whole
        with pytest.raises(http.client.IncompleteRead) as exc:
            resp.read()
        assert len(exc.value.partial) == keep
        assert exc.value.partial == BODY[:keep]
    finally:
        conn.close()
    assert proxy.stats()["truncated"] == 1
    proxy.set(Mode.PASS)
    assert _get(proxy) == BODY


def test_body_shorter_than_the_cut_passes_whole(proxy: FaultProxy) -> None:
    proxy.set(Mode.TRUNCATE, truncate_after=len(BODY))
    assert _get(proxy) == BODY
    assert proxy.stats().get("truncated", 0) == 0


def test_bad_arguments_are_refused(upstream: str) -> None:
    with pytest.raises(ValueError):
        FaultProxy("http://127.0.0.1")
    with FaultProxy(upstream) as p:
        with pytest.raises(ValueError):
            p.set(Mode.LATENCY, latency=-1)
        with pytest.raises(ValueError):
            p.set(Mode.TRUNCATE, truncate_after=-1)


# -- wrappers ----------------------------------------------------------------------------


def test_faulty_under_store_fails_the_kth_read(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"0123456789")
    store = FaultyUnderStore(LocalStore(str(tmp_path)), fail_on=(2, 3))

    async def go() -> list[object]:
        out: list[object] = []
        for _ in range(4):
            try:
                out.append(await store.read("a.bin", 2, 5))
            except RetryableStoreError as exc:
                out.append(exc)
        out.append((await store.info("a.bin")).size)  # not a chosen method: never fails
        return out

    got = asyncio.run(go())
    assert got[0] == b"234" and got[3] == b"234" and got[4] == 10
    assert isinstance(got[1], RetryableStoreError) and isinstance(got[2], RetryableStoreError)
    assert store.faults.injected == 2 and store.faults.calls["read"] == 4


def test_faulty_under_store_always_with_a_given_error(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"x")
    store = FaultyUnderStore(
        LocalStore(str(tmp_path)), fail_on=None, error=PermissionError("no"), methods=("info",)
    )
    with pytest.raises(PermissionError):
        asyncio.run(store.info("a.bin"))
    assert store.describe() == LocalStore(str(tmp_path)).describe()


def test_faulty_page_store_fails_the_kth_put(tmp_path: Path) -> None:
    store = FaultyPageStore(DiskTier(TierSpec("ssd", str(tmp_path / "ssd"), 64 << 20)))
    try:
        with pytest.raises(OSError):
            put_file(store, fkey("a"), blob(1, 100))
        assert put_file(store, fkey("a"), blob(1, 100))
        assert store.get(fkey("a").page(0)) == blob(1, 100)
        assert store.faults.injected == 1
    finally:
        store.close()


class TestFaultyPageStoreWithoutFaults(PageStoreConformance):
    """With no fault chosen the wrapper is the store it wraps: the whole conformance
    suite passes through it."""

    @pytest.fixture
    def factory(self, tmp_path: Path) -> StoreFactory:
        def make(capacity: int = 64 << 20, eviction: str = "lru") -> PageStore:
            inner = DiskTier(TierSpec("ssd", str(tmp_path / "ssd"), capacity, eviction=eviction))
            return FaultyPageStore(inner, fail_on=())

        return make

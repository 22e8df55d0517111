"""The worker's plain-HTTP GETs (shoal.ufs.rawget under shoal.ufs.s3get) against a real
TCP server that answers as told: exact bodies over kept connections, and every broken
answer (cut short, stalled, overlong, chunked, a connection closed while idle) either
an error or the right bytes, never wrong ones."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
import pytest_asyncio

from shoal.errors import RetryableStoreError, StaleVersion
from shoal.ufs.classify import silence_of
from shoal.ufs.s3get import FastGet

BLOB = os.urandom(300_000)
TIMEOUTS = (2.0, 2.0)


@dataclass
class Server:
    """Answers ``GET /b/<key>`` with a range of BLOB; ``how`` shapes each answer."""

    how: Callable[[int, bytes, bytes], bytes] | None = None
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    close_after: bool = False
    stall: bool = False
    port: int = 0

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                lines = head.decode().split("\r\n")
                hdr = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
                if "if-match" in hdr and hdr["if-match"] != '"v1"':
                    w.write(b"HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n")
                    await w.drain()
                    continue
                a, _, b = hdr["range"][6:].partition("-")
                lo, hi = int(a), min(int(b) if b else len(BLOB) - 1, len(BLOB) - 1)
                body = BLOB[lo : hi + 1]
                head_out = (
                    f"HTTP/1.1 206 Partial Content\r\nContent-Length: {len(body)}\r\n"
                    f'Content-Range: bytes {lo}-{hi}/{len(BLOB)}\r\nETag: "v1"\r\n\r\n'
                ).encode()
                out = self.how(len(self.requests), head_out, body) if self.how else head_out + body
                if self.stall:
                    w.write(out[: len(out) // 2])
                    await w.drain()
                    await asyncio.sleep(30)
                w.write(out)
                await w.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()


@pytest_asyncio.fixture
async def server() -> AsyncIterator[Server]:
    s = Server()
    srv = await asyncio.start_server(s.handle, "127.0.0.1", 0)
    s.port = srv.sockets[0].getsockname()[1]
    async with srv:
        yield s
        srv.close()


def _fast(s: Server) -> FastGet:
    return FastGet(f"http://127.0.0.1:{s.port}", "b", "us-east-1", None)


async def test_bodies_are_exact_and_one_connection_is_kept(server: Server) -> None:
    fast = _fast(server)
    try:
        for lo, hi in ((0, 99), (5, 5), (1000, 200_000), (0, len(BLOB) - 1), (299_000, None)):
            reply = await fast.get("k", lo, hi, "v1", TIMEOUTS)
            assert reply.status == 206
            assert reply.body == BLOB[lo : (hi if hi is not None else len(BLOB) - 1) + 1]
            assert reply.headers.get("etag") == '"v1"'  # case-insensitive, as before
        assert server.connections == 1
        assert b'If-Match: "v1"' in server.requests[0]
        assert b"Host: 127.0.0.1:" in server.requests[0]
    finally:
        await fast.close()


async def test_a_changed_version_is_stale(server: Server) -> None:
    fast = _fast(server)
    try:
        with pytest.raises(StaleVersion):
            await fast.get("k", 0, 10, "v0", TIMEOUTS)
        assert (await fast.get("k", 0, 10, "v1", TIMEOUTS)).body == BLOB[:11]
        assert server.connections == 1  # a bodiless 412 leaves the connection usable
    finally:
        await fast.close()


async def test_a_connection_closed_while_idle_is_replaced(server: Server) -> None:
    server.close_after = True
    fast = _fast(server)
    try:
        for lo in (0, 10, 20):
            assert (await fast.get("k", lo, lo + 9, None, TIMEOUTS)).body == BLOB[lo : lo + 10]
        assert server.connections == 3
    finally:
        await fast.close()


async def test_a_chunked_answer_is_read_through_aiohttp(server: Server) -> None:
    def chunked(n: int, head: bytes, body: bytes) -> bytes:
        head = head.replace(f"Content-Length: {len(body)}".encode(), b"Transfer-Encoding: chunked")
        return head + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"

    server.how = chunked
    fast = _fast(server)
    try:
        assert (await fast.get("k", 100, 50_099, None, TIMEOUTS)).body == BLOB[100:50_100]
    finally:
        await fast.close()


async def test_a_body_cut_short_is_an_error_never_bytes(server: Server) -> None:
    server.how = lambda n, head, body: head + (body[: len(body) // 2] if n == 1 else body)
    server.close_after = True
    fast = _fast(server)
    try:
        with pytest.raises(RetryableStoreError):
            await fast.get("k", 0, 99_999, None, TIMEOUTS)
        assert (await fast.get("k", 0, 99_999, None, TIMEOUTS)).body == BLOB[:100_000]
    finally:
        await fast.close()


async def test_bytes_past_the_body_never_reach_the_next_answer(server: Server) -> None:
    # the first answer carries garbage after its body: whatever the first GET says, the
    # next one gets its own bytes (the connection that carried garbage is not reused)
    server.how = lambda n, head, body: head + body + (b"HTTP/1.1 200 OK\r\n" if n == 1 else b"")
    fast = _fast(server)
    try:
        try:
            first = (await fast.get("k", 0, 9, None, TIMEOUTS)).body
            assert first == BLOB[:10]
        except RetryableStoreError:
            pass
        await asyncio.sleep(0)  # let the garbage arrive on the idle connection
        for _ in range(3):
            assert (await fast.get("k", 20, 29, None, TIMEOUTS)).body == BLOB[20:30]
    finally:
        await fast.close()


async def test_a_stalled_body_is_a_read_timeout(server: Server) -> None:
    server.stall = True
    fast = _fast(server)
    try:
        with pytest.raises(RetryableStoreError) as e:
            await fast.get("k", 0, 99_999, None, (1.0, 0.3))
        assert silence_of(e.value) == "read"
    finally:
        await fast.close()

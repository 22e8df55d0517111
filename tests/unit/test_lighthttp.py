"""The small HTTP/1.1 client a reader's master GETs go over (shoal.proto.lighthttp),
against a real aiohttp server on a free port (and a raw asyncio server for answers
aiohttp would not send): statuses, bodies by Content-Length, chunked and to the close,
keep-alive reuse, a server that closes a kept connection, TLS with the cluster's CA;
and MasterAPI over it: the same errors as over aiohttp, and no aiohttp import."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from shoal.cli.pki import local_pki
from shoal.client.cache import ClientCache
from shoal.client.control import ControlPlane
from shoal.config import ClientSettings
from shoal.core.tls import TLSRefused, client_context
from shoal.core.types import CachePolicy, Dataset, Mount
from shoal.errors import DatasetNotFound, Unavailable
from shoal.proto import control
from shoal.proto.lighthttp import BadResponse, ConnectError, LightHTTP
from shoal.proto.master_api import MasterAPI

BIG = os.urandom(3 << 20)


class Server:
    """An aiohttp app that records the client port of every request (one port: one
    connection)."""

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.url = ""
        app = web.Application()
        app.router.add_get("/status/{code}", self.status)
        app.router.add_get("/length", self.length)
        app.router.add_get("/chunked", self.chunked)
        app.router.add_get("/close", self.close)
        app.router.add_get("/echo", self.echo)
        app.router.add_get(control.dataset_path("d"), self.dataset)
        app.router.add_get(control.dataset_path("e"), self.dataset_e)
        app.router.add_patch(control.dataset_path("e"), self.patch_e)
        self.methods: list[str] = []
        self.app = app

    def _seen(self, request: web.Request) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.ports.append(peer[1] if peer else -1)

    async def status(self, request: web.Request) -> web.Response:
        self._seen(request)
        return web.Response(status=int(request.match_info["code"]))

    async def length(self, request: web.Request) -> web.Response:
        self._seen(request)
        return web.Response(body=BIG, headers={"X-Shoal-Test": "yes"})

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        self._seen(request)
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(BIG), 1 << 20):
            await resp.write(BIG[i : i + (1 << 20)])
        await resp.write_eof()
        return resp

    async def close(self, request: web.Request) -> web.Response:
        self._seen(request)
        resp = web.Response(body=b"bye")
        resp.force_close()
        return resp

    async def echo(self, request: web.Request) -> web.Response:
        self._seen(request)
        body = {"auth": request.headers.get("Authorization"), "query": dict(request.query)}
        return web.json_response(body)

    async def dataset(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"error": {"code": "no_dataset", "message": "no dataset d"}}, status=404
        )

    async def dataset_e(self, request: web.Request) -> web.Response:
        self.methods.append(f"GET {request.headers.get('User-Agent', '')}")
        return web.json_response(E.to_dict())

    async def patch_e(self, request: web.Request) -> web.Response:
        self.methods.append(f"PATCH {request.headers.get('User-Agent', '')}")
        body = await request.json()
        return web.json_response(
            Dataset(E.name, E.mounts, CachePolicy.from_dict(body["policy"])).to_dict()
        )


E = Dataset("e", (Mount("m", "s3://b/p"),), CachePolicy())


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    s = Server()
    ts = TestServer(s.app, host="127.0.0.1", port=0)
    await ts.start_server()
    s.url = str(ts.make_url("")).rstrip("/")
    yield s
    await ts.close()


@pytest.fixture
async def http() -> AsyncIterator[LightHTTP]:
    h = LightHTTP(total=10)
    yield h
    await h.close()


async def raw_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[object]],
) -> tuple[asyncio.Server, str, list[int]]:
    """A TCP server that lets ``handle`` answer its n-th connection (counted from 0)."""
    conns: list[int] = []

    async def on(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append(len(conns))
        try:
            await handle(r, w, conns[-1])
        finally:
            w.close()

    srv = await asyncio.start_server(on, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    return srv, f"http://127.0.0.1:{port}", conns


async def read_head(r: asyncio.StreamReader) -> bytes:
    return await r.readuntil(b"\r\n\r\n")


async def test_bodies_by_content_length_and_chunked_on_one_kept_connection(
    server: Server, http: LightHTTP
) -> None:
    a = await http.get(server.url + "/length")
    assert a.status == 200 and a.body == BIG
    assert a.headers["x-shoal-test"] == "yes" and a.headers.get("X-SHOAL-TEST") == "yes"
    b = await http.get(server.url + "/chunked")
    assert b.status == 200 and b.body == BIG
    assert "chunked" in b.headers["Transfer-Encoding"].lower()
    for _ in range(3):
        assert (await http.get(server.url + "/length")).body == BIG
    assert len(server.ports) == 5 and len(set(server.ports)) == 1  # one connection


async def test_statuses_come_back_as_they_are_and_keep_the_connection(
    server: Server, http: LightHTTP
) -> None:
    for code in (204, 304, 404, 500, 502, 503):
        r = await http.get(f"{server.url}/status/{code}")
        assert r.status == code and r.body == b""
    assert len(set(server.ports)) == 1


async def test_a_connection_the_server_closes_is_not_kept(server: Server, http: LightHTTP) -> None:
    r = await http.get(server.url + "/close")
    assert r.status == 200 and r.body == b"bye"
    await http.get(server.url + "/status/204")
    assert len(set(server.ports)) == 2


async def test_concurrent_requests_use_their_own_connections(
    server: Server, http: LightHTTP
) -> None:
    got = await asyncio.gather(*(http.get(server.url + "/length") for _ in range(6)))
    assert all(r.body == BIG for r in got)
    await http.get(server.url + "/status/204")  # a kept one again
    assert len(server.ports) == 7 and len(set(server.ports)) <= 6


async def test_headers_and_query_are_sent(server: Server, http: LightHTTP) -> None:
    r = await http.get(
        server.url + "/echo?a=1", {"Authorization": "Bearer t0k"}, params={"b": "x y"}
    )
    assert json.loads(r.body) == {"auth": "Bearer t0k", "query": {"a": "1", "b": "x y"}}
    with pytest.raises(ValueError, match="line break"):
        await http.get(server.url + "/echo", {"X-Evil": "a\r\nHost: other"})


async def test_a_kept_connection_the_server_closed_is_retried_once_on_a_new_one(
    http: LightHTTP,
) -> None:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        await read_head(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()
        if n == 0:
            await read_head(r)  # the next request on the kept connection: no answer

    srv, url, conns = await raw_server(handle)
    async with srv:
        assert (await http.get(url + "/a")).body == b"ok"
        assert (await http.get(url + "/b")).body == b"ok"  # closed unanswered: retried
        assert conns == [0, 1]


async def test_answers_delimited_by_the_close_and_ones_that_stop_short(http: LightHTTP) -> None:
    answers = {
        0: b"HTTP/1.1 502 Bad Gateway\r\n\r\n",  # a proxy's bodyless 502, then the close
        1: b"HTTP/1.0 200 OK\r\n\r\nto the end",
        2: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        3: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
        4: b"SSH-2.0-OpenSSH\r\n",
        5: b"HTTP/1.1 200 OK\r\nContent-Length: 1_0\r\n\r\n0123456789",
        6: b"",
    }

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        await read_head(r)
        w.write(answers[n])
        await w.drain()

    srv, url, _ = await raw_server(handle)
    async with srv:
        r = await http.get(url)
        assert (r.status, r.body) == (502, b"")
        assert (await http.get(url)).body == b"to the end"
        with pytest.raises(BadResponse, match="closed 5 bytes into a body"):
            await http.get(url)
        with pytest.raises(BadResponse, match="closed"):
            await http.get(url)
        with pytest.raises(BadResponse, match=r"not an HTTP/1\.x status line"):
            await http.get(url)
        with pytest.raises(BadResponse, match="malformed Content-Length"):
            await http.get(url)
        with pytest.raises(BadResponse, match="without an answer"):
            await http.get(url)


async def test_refused_and_silent_servers(http: LightHTTP) -> None:
    srv, url, _ = await raw_server(lambda r, w, n: r.read())  # until the client goes
    async with srv:
        with pytest.raises(TimeoutError):
            await http.get(url, total=0.2)
    with pytest.raises(ConnectError, match=r"cannot connect to 127\.0\.0\.1"):
        await http.get(url)  # closed now: refused


async def test_tls_with_the_clusters_ca(tmp_path: Path) -> None:
    pki = local_pki(tmp_path / "pki", "127.0.0.1")
    sctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    sctx.load_cert_chain(pki.cert, pki.key)
    server = Server()
    runner = web.AppRunner(server.app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=sctx).start()
    url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    trusting = LightHTTP(client_context(str(pki.ca)))
    system = LightHTTP()
    try:
        assert (await trusting.get(url + "/length")).body == BIG
        assert (await trusting.get(url + "/chunked")).body == BIG
        assert len(server.ports) == 2 and len(set(server.ports)) == 1  # kept over TLS too
        with pytest.raises(ssl.SSLCertVerificationError):
            await system.get(url + "/length")
        api = MasterAPI(url, _no_session, light=system)
        with pytest.raises(TLSRefused, match="not trusted"):
            await api.health()
    finally:
        await trusting.close()
        await system.close()
        await runner.cleanup()


def _no_session() -> aiohttp.ClientSession:
    raise AssertionError("a GET went over aiohttp")


async def test_master_api_over_it_maps_errors_and_sends_the_token(
    server: Server, http: LightHTTP
) -> None:
    api = MasterAPI(server.url, _no_session, token="s3cret-token", light=http)
    assert (await api.send("GET", "/echo")).json()["auth"] == "Bearer s3cret-token"
    with pytest.raises(DatasetNotFound, match="no dataset d"):
        await api.dataset("d")
    with pytest.raises(Unavailable, match="master answered HTTP 502"):
        await api.send("GET", "/status/502")
    srv, url, _ = await raw_server(lambda r, w, n: asyncio.sleep(0))
    srv.close()
    await srv.wait_closed()
    down = MasterAPI(url.replace("http://", "http://ops:pw@"), _no_session, light=http)
    with pytest.raises(Unavailable, match="unreachable") as info:
        await down.health()
    assert "pw@" not in str(info.value) and "127.0.0.1" in str(info.value)
    # a second address takes the GET the first one refused
    both = MasterAPI(f"{url},{server.url}", _no_session, token="t", light=http)
    assert (await both.send("GET", "/echo")).json()["auth"] == "Bearer t"


async def test_the_control_plane_stands_alone_gets_light_the_rest_over_aiohttp(
    server: Server,
) -> None:
    cp = ControlPlane(ClientSettings(master=server.url), ClientCache())
    try:
        got = await cp.update_dataset("e", {"replicas": "2"})
    finally:
        await cp.close()
    assert got.policy.replicas == 2 and cp.cache.datasets["e"][0] == E
    assert server.methods[0] == "GET " and server.methods[1].startswith("PATCH Python")


async def test_a_reader_process_never_imports_aiohttp(server: Server) -> None:
    code = (
        "import asyncio, sys\n"
        "from shoal.client import Client\n"
        "from shoal.client.control import ControlPlane\n"
        "from shoal.client.cache import ClientCache\n"
        "from shoal.config import ClientSettings\n"
        "cp = ControlPlane(ClientSettings(master=sys.argv[1]), ClientCache())\n"
        "async def main():\n"
        "    a = await cp.api.send('GET', '/length')\n"
        "    await cp.close()\n"
        "    return a.status\n"
        "print(asyncio.run(main()), 'aiohttp' in sys.modules)\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, server.url, stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0 and out.split() == [b"200", b"False"]

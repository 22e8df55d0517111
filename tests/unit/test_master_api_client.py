"""The master API client (shoal.proto.master_api) against a real aiohttp server on a
free port that answers what each test scripts: good answers, the master's error bodies,
and the bodyless errors a proxy in the way sends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import aiohttp
import msgpack
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from shoal.client.cache import ClientCache
from shoal.client.control import ControlPlane
from shoal.config import ClientSettings
from shoal.core.manifest import Entry, Manifest
from shoal.core.types import CachePolicy, Dataset, Mount
from shoal.errors import (
    DatasetExists,
    DatasetNotFound,
    NotFound,
    ProtocolError,
    ShoalError,
    Unavailable,
    UserError,
)
from shoal.proto import control
from shoal.proto.master_api import MasterAPI

RING = {
    "epoch": 4,
    "vnodes": 16,
    "workers": [
        {"id": "w1", "host": "127.0.0.1", "port": 7001, "uds": "/tmp/w1.sock", "node": "n1"},
        {"id": "w2", "host": "127.0.0.1", "port": 7002, "uds": "", "node": "n2"},
    ],
    "datasets_generation": 9,
}


@dataclass
class Seen:
    method: str
    path: str
    raw_path: str
    query: dict[str, str]
    content_type: str
    body: bytes


@dataclass
class FakeMaster:
    """Answers ``(method, path)`` with what ``script`` holds; 404 (bodyless) otherwise."""

    url: str = ""
    script: dict[tuple[str, str], tuple[int, bytes, dict[str, str]]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def answer(
        self,
        method: str,
        path: str,
        status: int = 200,
        body: Any = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        hdrs = dict(headers or {})
        if raw is None:
            raw = json.dumps(body).encode() if body is not None else b""
            if body is not None:
                hdrs.setdefault("Content-Type", "application/json")
        self.script[(method, unquote(path))] = (status, raw, hdrs)

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        # keyed by the decoded path: a client may send ":" as "%3A" or as itself
        path = unquote(request.raw_path.split("?", 1)[0])
        self.seen.append(
            Seen(
                request.method,
                path,
                request.raw_path,
                dict(request.query),
                request.content_type,
                raw,
            )
        )
        status, body, headers = self.script.get((request.method, path), (404, b"", {}))
        return web.Response(status=status, body=body, headers=headers)


def error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


@pytest.fixture
async def fake() -> AsyncIterator[FakeMaster]:
    fm = FakeMaster()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fm.handle)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    fm.url = str(server.make_url("")).rstrip("/")
    yield fm
    await server.close()


@pytest.fixture
async def master(fake: FakeMaster) -> AsyncIterator[MasterAPI]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        yield MasterAPI(fake.url, lambda: http)


async def test_good_answers_on_the_routes_of_proto_control(
    fake: FakeMaster, master: MasterAPI
) -> None:
    ds = {"name": "d", "mounts": [], "policy": {}, "generation": 1}
    fake.answer("GET", control.HEALTH, body={"ok": True, "version": "x"})
    fake.answer("GET", control.DATASETS, body={"datasets": [ds]})
    fake.answer("GET", control.dataset_path("a b"), body=ds)
    fake.answer("GET", control.RING, body=RING)
    fake.answer("POST", control.heartbeat_path("w:1"), body={"epoch": 4, "known": True})
    fake.answer("GET", control.WATCH, body={"datasets_generation": 12})
    fake.answer("POST", control.job_path("j/1", "stop"), body={"id": "j/1", "state": "stopped"})

    assert (await master.health())["ok"] is True
    assert await master.datasets() == [ds]
    assert await master.dataset("a b") == ds
    ring = await master.ring()
    assert control.ring_from_response(ring).members == ("w1", "w2")
    assert control.ring_from_response(ring).epoch == 4
    assert (await master.heartbeat("w:1", {"tiers": []}))["known"] is True
    assert await master.watch(3, 0.5, "me") == 12
    assert (await master.stop_job("j/1"))["state"] == "stopped"

    by_path = {s.path: s for s in fake.seen}
    assert json.loads(by_path["/api/v1/workers/w:1/heartbeat"].body) == {"stats": {"tiers": []}}
    assert by_path[control.WATCH].query == {"since": "3", "timeout": "0.5", "watcher": "me"}
    # names are quoted: a "/" in one does not make another route
    assert by_path["/api/v1/datasets/a b"].raw_path == "/api/v1/datasets/a%20b"
    assert by_path["/api/v1/jobs/j/1/stop"].raw_path == "/api/v1/jobs/j%2F1/stop"


async def test_task_claim_and_a_msgpack_report(fake: FakeMaster, master: MasterAPI) -> None:
    fake.answer("GET", control.claim_path("w1"), body={"task": {"id": 7, "kind": "load"}})
    fake.answer("POST", control.task_path(7), body={"stop": True})
    assert await master.claim("w1", 10, 40) == {"id": 7, "kind": "load"}
    entries = [["m/a", 3, "v1", 1.0, 1, ""]]
    assert (await master.report_task(7, {"final": True, "entries": entries}, packed=True))["stop"]
    claim, report = fake.seen
    assert float(claim.query["wait"]) == 10
    assert report.content_type == control.MSGPACK
    assert msgpack.unpackb(report.body, raw=False) == {"final": True, "entries": entries}

    fake.answer("GET", control.claim_path("w1"), body={"task": None})
    assert await master.claim("w1", 0, 5) is None


async def test_manifest_bytes_and_id_and_none_when_missing(
    fake: FakeMaster, master: MasterAPI
) -> None:
    man = Manifest("d", [Entry("m/a", 3, "v1", 1.0)], 100.0)
    fake.answer(
        "GET",
        control.manifest_path("d"),
        raw=man.to_bytes(),
        # lowercased, as an HTTP/2 proxy passes it on: headers are case-insensitive
        headers={"Content-Type": control.MSGPACK, control.MANIFEST_HEADER.lower(): "m-1"},
    )
    got = await master.manifest("d")
    assert got is not None and got[0] == "m-1" and len(got[1]) == 1
    assert await master.manifest("other") is None  # a bodyless 404: no manifest
    fake.answer("GET", control.manifest_path("gone"), 404, error("no_dataset", "no d"))
    with pytest.raises(DatasetNotFound):
        await master.manifest("gone")


@pytest.mark.parametrize(
    ("status", "body", "cls", "message"),
    [
        (409, error("exists", "dataset d exists"), DatasetExists, "dataset d exists"),
        (404, error("no_dataset", "no dataset d"), DatasetNotFound, "no dataset d"),
        (400, error("invalid", "bad replicas"), UserError, "bad replicas"),
        (503, error("unavailable", "restarting"), Unavailable, "restarting"),
        (500, error("io", control.INTERNAL_ERROR_MESSAGE), ShoalError, "internal error"),
        (418, error("not-a-code", "what"), ShoalError, "what"),
    ],
)
async def test_error_bodies_become_their_class(
    fake: FakeMaster,
    master: MasterAPI,
    status: int,
    body: dict[str, Any],
    cls: type[ShoalError],
    message: str,
) -> None:
    fake.answer("POST", control.DATASETS, status, body)
    with pytest.raises(cls) as info:
        await master.create_dataset({"name": "d", "mounts": []})
    # isinstance: "invalid" may name a subclass of UserError (InvalidArgument)
    assert isinstance(info.value, cls) and message in info.value.message


@pytest.mark.parametrize(
    ("status", "raw", "cls"),
    [
        (502, b"", Unavailable),  # a proxy with the master gone
        (502, b"<html><body>Bad Gateway</body></html>", Unavailable),
        (504, b"upstream timed out", Unavailable),
        (500, b"", Unavailable),
        (404, b"", NotFound),
        (404, b"<html>Not Found</html>", NotFound),
        (400, b"", ProtocolError),
        (401, b'{"message": "no"}', ProtocolError),  # JSON, but not the error shape
    ],
)
async def test_bodyless_errors(
    fake: FakeMaster, master: MasterAPI, status: int, raw: bytes, cls: type[ShoalError]
) -> None:
    fake.answer("GET", control.REPORT, status, raw=raw)
    with pytest.raises(cls) as info:
        await master.report()
    assert type(info.value) is cls


async def test_an_answer_that_is_not_json_or_not_an_object(
    fake: FakeMaster, master: MasterAPI
) -> None:
    fake.answer("GET", control.REPORT, raw=b"<html>hello</html>")
    with pytest.raises(ProtocolError):
        await master.report()
    fake.answer("GET", control.JOBS, body=[1, 2])
    with pytest.raises(ProtocolError):
        await master.jobs()
    fake.answer("GET", control.RING, body={"epoch": 1})
    with pytest.raises(ProtocolError):
        await master.ring()
    fake.answer("GET", control.WATCH, body={"datasets_generation": "x"})
    with pytest.raises(ProtocolError):
        await master.watch(0, 0, "me")


async def test_a_master_that_is_not_there_is_unavailable() -> None:
    app = web.Application()
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    await server.close()  # nothing listens on that port now
    async with aiohttp.ClientSession() as http:
        with pytest.raises(Unavailable, match="unreachable"):
            await MasterAPI(url, lambda: http).datasets()
        # credentials in the URL stay out of the error
        with_user = url.replace("http://", "http://ops:s3cret@")
        with pytest.raises(Unavailable) as info:
            await MasterAPI(with_user, lambda: http).datasets()
        assert "s3cret" not in str(info.value) and "127.0.0.1" in str(info.value)


def test_ring_from_response_refuses_a_malformed_answer() -> None:
    with pytest.raises(ProtocolError):
        control.ring_from_response({"epoch": 1, "workers": [{"host": "h"}]})  # type: ignore[typeddict-item]


# -- the client's control plane on top of it ---------------------------------------------


@pytest.fixture
async def plane(fake: FakeMaster) -> AsyncIterator[ControlPlane]:
    cp = ControlPlane(ClientSettings(master=fake.url), ClientCache())
    yield cp
    await cp.close()


async def test_control_plane_sees_a_bodyless_502_as_unavailable(
    fake: FakeMaster, plane: ControlPlane
) -> None:
    fake.answer("GET", control.REPORT, 502, raw=b"")
    with pytest.raises(Unavailable):
        await plane.report()
    fake.answer("DELETE", control.dataset_path("d"), 404, error("no_dataset", "no dataset d"))
    with pytest.raises(DatasetNotFound):
        await plane.delete_dataset("d")


async def test_control_plane_ring_and_datasets(fake: FakeMaster, plane: ControlPlane) -> None:
    ds = Dataset("d", (Mount("m", "s3://b/p"),), CachePolicy(), generation=2)
    fake.answer("GET", control.RING, body=RING)
    fake.answer("GET", control.DATASETS, body={"datasets": [ds.to_dict()]})
    ring, workers, gen = await plane.fetch_ring()
    assert ring.members == ("w1", "w2") and gen == 9
    assert workers["w1"].uds == "/tmp/w1.sock" and workers["w2"].port == 7002
    assert [d.name for d in await plane.datasets()] == ["d"]
    assert plane.cache.datasets["d"][0].generation == 2


async def test_control_plane_manifest_is_fetched_once_and_kept_while_the_master_is_down(
    fake: FakeMaster, plane: ControlPlane
) -> None:
    import time

    man = Manifest("d", [Entry("m/a", 3, "v1", 1.0)], time.time())
    ds = Dataset("d", (Mount("m", "s3://b/p"),), CachePolicy(), generation=2, manifest="m-1")
    path = control.manifest_path("d")
    fake.answer("GET", path, raw=man.to_bytes(), headers={control.MANIFEST_HEADER: "m-1"})
    got = await plane.manifest(ds)
    assert got is not None and len(got) == 1
    assert await plane.manifest(ds) is got  # the same id: no second fetch
    assert [s.raw_path for s in fake.seen] == [path]

    newer = Dataset("d", ds.mounts, ds.policy, generation=3, manifest="m-2")
    fake.answer("GET", path, 502, raw=b"Bad Gateway")
    assert await plane.manifest(newer) is got  # master unreachable: serve on with it
    fake.answer("GET", path, 404, raw=b"")
    assert await plane.manifest(newer) is None

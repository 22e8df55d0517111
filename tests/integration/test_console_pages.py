"""The console's routes in process (no browser): a real MasterService on a temporary
state directory behind the console's aiohttp routes on 127.0.0.1, port 0.

Pages carry the report's numbers, escape what comes from state, keep a scoped token to
its datasets, send a strict Content-Security-Policy, and refuse bad arguments with the
API's error body."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from shoal.config import MasterSettings
from shoal.master.history import History
from shoal.master.service import MasterService
from shoal.master.state import MasterState
from shoal.master.ui import add_ui_routes
from shoal.master.ui.pages import error_page, jobs_table

pytestmark = pytest.mark.integration


def _mount(tmp: Path, name: str) -> dict[str, Any]:
    d = tmp / name
    d.mkdir()
    return {"name": "m", "uri": f"file://{d}"}


@pytest.fixture
def service(tmp_path: Path) -> MasterService:
    settings = MasterSettings(state_dir=str(tmp_path / "state"), file_roots=(str(tmp_path),))
    svc = MasterService(settings, MasterState(settings.state_dir))
    for name in ("open-data", "secret-data"):
        svc.create_dataset({"name": name, "mounts": [_mount(tmp_path, name)]})
    svc.register(
        {
            "id": "w1",
            "host": "127.0.0.1",
            "port": 1,
            "key": "k" * 32,
            "tiers": [{"name": "mem", "path": "", "capacity": 1000}],
        }
    )
    stats = {
        "tiers": [{"name": "mem", "capacity": 1000, "used": 250, "pages": 3}],
        "datasets": {
            "open-data": {
                "hits": 3,
                "misses": 1,
                "bytes_by_source": {"local": 300, "remote": 0, "ufs": 100},
                "cached_files": 2,
                "cached_bytes": 200,
            }
        },
    }
    svc.heartbeat("w1", {"stats": stats})
    return svc


async def _client(service: MasterService, visible: Any = None) -> TestClient[Any, Any]:
    app = web.Application()
    add_ui_routes(app, service, visible, History(interval=0.05))
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1", port=0))
    await client.start_server()
    return client


@pytest.fixture
async def client(service: MasterService) -> AsyncIterator[TestClient[Any, Any]]:
    c = await _client(service)
    yield c
    await c.close()


def only(*names: str) -> Callable[..., list[Any]]:
    def visible(request: web.Request, items: list[Any], key: Callable[[Any], str]) -> list[Any]:
        return [i for i in items if key(i) in names]

    return visible


def values(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-field="([^"]+)" data-value="([^"]*)"', html))


async def test_pages_carry_the_reports_numbers_and_a_strict_csp(
    client: TestClient[Any, Any], service: MasterService
) -> None:
    report = service.report()
    for path in ("/ui/", "/ui/datasets", "/ui/datasets/open-data", "/ui/jobs", "/ui/workers"):
        r = await client.get(path)
        assert r.status == 200, path
        assert "default-src 'self'" in r.headers["Content-Security-Policy"]
        html = await r.text()
        assert "http://" not in html.replace(str(client.make_url("")), "")  # nothing external
    html = await (await client.get("/ui/")).text()
    v = values(html)
    t = report["totals"]
    assert int(v["totals.cached_bytes"]) == t["cached_bytes"] == 200
    assert int(v["totals.used"]) == t["used"] == 250
    assert float(v["totals.hit_ratio"]) == t["hit_ratio"] == 0.75
    r = await client.get("/ui/api/page/overview")
    body = await r.json()
    assert body["data"]["totals"] == t and "tiles" in body["parts"]
    assert (await client.get("/ui")).url.path == "/ui/"  # redirected


async def test_the_history_route_serves_samples(client: TestClient[Any, Any]) -> None:
    got: dict[str, Any] = {}
    for _ in range(100):  # the sampler runs every 50 ms here
        got = await (await client.get("/ui/api/history?minutes=5")).json()
        if len(got["t"]) >= 2:
            break
        await asyncio.sleep(0.05)
    assert len(got["t"]) >= 2
    assert got["cached_bytes"][-1] == 200 and got["workers_live"][-1] == 1
    assert got["tiers"]["mem"]["used"][-1] == 250
    r = await client.get("/ui/api/history?minutes=nope")
    assert r.status == 400 and (await r.json())["error"]["code"]


async def test_a_scoped_token_sees_only_its_datasets(service: MasterService) -> None:
    c = await _client(service, only("open-data"))
    try:
        html = await (await c.get("/ui/datasets")).text()
        assert "open-data" in html and "secret-data" not in html
        r = await c.get("/ui/datasets/secret-data")
        assert r.status == 403
        r = await c.get("/ui/api/history?dataset=secret-data")
        assert r.status == 403
        r = await c.get("/ui/api/page/dataset?name=secret-data")
        assert r.status == 403
        assert (await c.get("/ui/datasets/open-data")).status == 200
    finally:
        await c.close()


async def test_unknown_names_and_files_are_not_found(client: TestClient[Any, Any]) -> None:
    r = await client.get("/ui/datasets/%3Cb%3E")
    html = await r.text()
    assert r.status == 404 and "no dataset named &#x27;&lt;b&gt;&#x27;" in html, html
    assert (await client.get("/ui/api/page/nope")).status == 404
    assert (await client.get("/ui/static/nope.js")).status == 404
    r = await client.get("/ui/static/console.js")
    assert r.status == 200 and r.content_type == "text/javascript"
    js = await r.text()
    assert "http://" not in js.replace("http://www.w3.org/2000/svg", "")  # no CDN


def test_what_comes_from_state_is_escaped() -> None:
    evil = '<img src=x onerror="alert(1)">'
    job = {
        "id": "j-1",
        "kind": "load",
        "dataset": "d",
        "state": "failed",
        "files_total": 2,
        "files_done": 1,
        "files_skipped": 0,
        "files_failed": 1,
        "files_seen": 2,
        "bytes_total": 10,
        "bytes_done": 5,
        "frac_files": 1.0,
        "frac_bytes": 0.5,
        "bytes_per_s": 1.0,
        "files_per_s": 1.0,
        "eta_s": None,
        "created": 0.0,
        "finished": 2.0,
        "error": evil,
        "failures": [[f"dir/{evil}.bin", evil]],
    }
    html = jobs_table([job])
    assert "<img" not in html and "&lt;img" in html
    assert json.dumps(evil) not in html
    page = error_page("datasets", 404, "no {dataset} " + evil)  # braces: not a format field
    assert "no {dataset} &lt;img" in page and "<img" not in page

"""The master's HTTP API end to end: in-process on port 0, and once as a real process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import shoal
from shoal.config import MasterSettings
from shoal.errors import DatasetExists, DatasetNotFound, UserError
from shoal.master.server import MasterServer, start_master
from shoal.proto import control

pytestmark = pytest.mark.integration

Call = Callable[..., Awaitable[tuple[int, Any]]]

DATASET = {
    "name": "imagenet",
    "mounts": [{"name": "train", "uri": "s3://bucket/train", "options": {"anon": "true"}}],
    "policy": {"replicas": 2},
}


def settings(tmp_path: Path, **kw: Any) -> MasterSettings:
    base: dict[str, Any] = {
        "port": 0,
        "state_dir": str(tmp_path / "state"),
        "heartbeat_interval": 0.1,
        "worker_expiry": 1.0,
    }
    base.update(kw)
    return MasterSettings(**base)


def worker(wid: str, port: int) -> dict[str, Any]:
    return {
        "id": wid,
        "host": "127.0.0.1",
        "port": port,
        "uds": f"/tmp/{wid}.sock",
        "node": "node-1",
        "tiers": [{"name": "ssd", "path": f"/cache/{wid}", "capacity": 1 << 30}],
    }


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[MasterServer]:
    server = await start_master(settings(tmp_path))
    yield server
    await server.stop()


@pytest.fixture
def call(http: aiohttp.ClientSession, master: MasterServer) -> Call:
    async def _call(
        method: str, path: str, body: Any = None, raw: bytes | None = None
    ) -> tuple[int, Any]:
        kw: dict[str, Any] = {"data": raw} if raw is not None else {"json": body}
        async with http.request(method, master.url + path, **kw) as r:
            if r.content_type == "application/json":
                return r.status, await r.json()
            return r.status, await r.text()

    return _call


async def test_health_and_dataset_crud(call: Call, master: MasterServer) -> None:
    assert master.url.startswith("http://127.0.0.1:") and master.port > 0
    health = {"ok": True, "version": shoal.__version__, "auth": False}
    assert await call("GET", control.HEALTH) == (200, health)

    status, body = await call("POST", control.DATASETS, DATASET)
    assert status == 201
    assert body["name"] == "imagenet" and body["generation"] == 1
    assert body["policy"]["replicas"] == 2 and body["mounts"][0]["options"] == {"anon": "true"}

    status, body = await call("POST", control.DATASETS, DATASET)
    assert status == 409 and body["error"]["code"] == "exists"
    with pytest.raises(DatasetExists):
        control.raise_for_error(status, body)

    status, body = await call("GET", control.dataset_path("imagenet"))
    assert status == 200 and body["name"] == "imagenet"
    status, body = await call("GET", control.DATASETS)
    assert status == 200 and [d["name"] for d in body["datasets"]] == ["imagenet"]

    path = control.dataset_path("imagenet")
    status, body = await call("PATCH", path, {"policy": {"pin": True, "page_size": "4MiB"}})
    assert status == 200 and body["generation"] == 2
    assert body["policy"]["pin"] is True and body["policy"]["replicas"] == 2
    assert body["policy"]["page_size"] == 4 << 20

    for bad in ({"policy": {"replicas": 0}}, {"policy": {"nope": 1}}, {"pin": True}, [1]):
        status, body = await call("PATCH", path, bad)
        assert status == 400 and body["error"]["code"] == "invalid", bad
    status, body = await call("PATCH", control.dataset_path("missing"), {"policy": {}})
    assert status == 404 and body["error"]["code"] == "no_dataset"

    status, body = await call("POST", control.DATASETS, raw=b"{not json")
    assert status == 400 and "malformed JSON" in body["error"]["message"]
    assert "\n" not in body["error"]["message"]
    bad_mount = {
        **DATASET,
        "name": "x",
        "mounts": [{"name": "m", "uri": "s3://b", "options": {"secret": "s"}}],
    }
    status, body = await call("POST", control.DATASETS, bad_mount)
    assert status == 400
    with pytest.raises(UserError):
        control.raise_for_error(status, body)

    status, body = await call("GET", "/api/v1/nope")
    assert status == 404 and "error" in body
    status, body = await call("PUT", control.DATASETS, {})
    assert status == 405 and body["error"]["code"] == "invalid"

    assert await call("DELETE", path) == (200, {"deleted": "imagenet"})
    status, body = await call("DELETE", path)
    assert status == 404
    with pytest.raises(DatasetNotFound):
        control.raise_for_error(status, body)
    status, body = await call("GET", path)
    assert status == 404


async def test_workers_ring_and_expiry(call: Call) -> None:
    epochs = []
    for i, wid in enumerate(["w1", "w2", "w3"]):
        status, body = await call("POST", control.WORKER_REGISTER, worker(wid, 7000 + i))
        assert status == 200 and body["heartbeat_interval"] == 0.1
        assert body["datasets_generation"] == 0
        epochs.append(body["epoch"])
    assert epochs == [1, 2, 3]

    status, ring = await call("GET", control.RING)
    assert status == 200 and ring["epoch"] == 3 and ring["vnodes"] == 128
    assert ring["workers"][0] == {
        "id": "w1",
        "host": "127.0.0.1",
        "port": 7000,
        "uds": "/tmp/w1.sock",
        "node": "node-1",
        "tls": False,  # it did not register TLS: clients reach it in plain TCP
    }
    assert control.ring_from_response(ring).members == ("w1", "w2", "w3")

    # same registration again: no ring change
    status, body = await call("POST", control.WORKER_REGISTER, worker("w1", 7000))
    assert body["epoch"] == 3
    status, body = await call("POST", control.WORKER_REGISTER, {"id": "w9", "host": "h"})
    assert status == 400

    status, body = await call("POST", control.heartbeat_path("ghost"), {"stats": {}})
    assert status == 200 and body == {"epoch": 3, "datasets_generation": 0, "known": False}

    # w1 and w2 keep beating, w3 goes silent past the 1 s expiry
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for wid in ("w1", "w2"):
            status, body = await call("POST", control.heartbeat_path(wid), {"stats": {}})
            assert status == 200 and body["known"] is True
        status, ring = await call("GET", control.RING)
        if len(ring["workers"]) == 2:
            break
        await asyncio.sleep(0.1)
    assert [w["id"] for w in ring["workers"]] == ["w1", "w2"] and ring["epoch"] == 4

    status, report = await call("GET", control.REPORT)
    states = {w["id"]: w["state"] for w in report["workers"]}
    assert states == {"w1": "live", "w2": "live", "w3": "expired"}

    status, body = await call("POST", control.heartbeat_path("w3"), None)
    assert body["known"] is False
    status, body = await call("POST", control.WORKER_REGISTER, worker("w3", 7002))
    assert body["epoch"] == 5


def ds_stats(
    files: int, nbytes: int, hits: int, misses: int, local: int, ufs: int
) -> dict[str, Any]:
    return {
        "cached_files": files,
        "cached_bytes": nbytes,
        "hits": hits,
        "misses": misses,
        "bytes_by_source": {"local": local, "remote": 0, "ufs": ufs},
    }


async def test_report_and_metrics(call: Call) -> None:
    await call("POST", control.DATASETS, DATASET)
    for i, wid in enumerate(["w1", "w2"]):
        await call("POST", control.WORKER_REGISTER, worker(wid, 7000 + i))
    stats1 = {
        "tiers": [{"name": "ssd", "path": "/c", "capacity": 1000, "used": 400, "pages": 4}],
        "datasets": {"imagenet": ds_stats(10, 400, 30, 10, 300, 100)},
        "corrupt_pages": 2,
    }
    stats2 = {"datasets": {"imagenet": ds_stats(5, 100, 10, 0, 100, 0)}}  # no tiers yet
    for wid, st in (("w1", stats1), ("w2", stats2)):
        status, body = await call("POST", control.heartbeat_path(wid), {"stats": st})
        assert status == 200 and body["known"] is True and body["datasets_generation"] == 1

    status, report = await call("GET", control.REPORT)
    assert status == 200
    [ds] = report["datasets"]
    assert ds["name"] == "imagenet" and (ds["cached_files"], ds["cached_bytes"]) == (15, 500)
    assert (ds["hits"], ds["misses"]) == (40, 10) and ds["hit_ratio"] == pytest.approx(0.8)
    assert ds["bytes_by_source"] == {"local": 400, "remote": 0, "ufs": 100}
    w = {x["id"]: x for x in report["workers"]}
    assert w["w1"]["used"] == 400 and w["w1"]["tiers"][0]["pages"] == 4
    assert w["w2"]["capacity"] == 1 << 30 and w["w2"]["state"] == "live"
    assert 0 <= w["w1"]["last_heartbeat_age_s"] < 5
    t = report["totals"]
    assert t["workers_live"] == 2 and t["corrupt_pages"] == 2 and t["cached_bytes"] == 500

    status, text = await call("GET", control.METRICS)
    assert status == 200
    for name in [
        'shoal_master_workers{state="live"} 2.0',
        "shoal_master_datasets 1.0",
        "shoal_ring_epoch 2.0",
        'shoal_cached_bytes{dataset="imagenet"} 500.0',
        'shoal_cached_files{dataset="imagenet"} 15.0',
        'shoal_cache_hits_total{dataset="imagenet"} 40.0',
        'shoal_cache_misses_total{dataset="imagenet"} 10.0',
        'shoal_read_bytes_total{dataset="imagenet",source="ufs"} 100.0',
    ]:
        assert name in text


async def test_restart_keeps_datasets_workers_and_epoch(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    s = settings(tmp_path, worker_expiry=30.0)
    first = await start_master(s)
    try:
        async with http.post(first.url + control.DATASETS, json=DATASET) as r:
            assert r.status == 201
        for i, wid in enumerate(["w1", "w2"]):
            async with http.post(first.url + control.WORKER_REGISTER, json=worker(wid, i + 1)) as r:
                before = (await r.json())["epoch"]
    finally:
        await first.stop()

    second = await start_master(s)
    try:
        assert second.port != 0
        async with http.get(second.url + control.dataset_path("imagenet")) as r:
            assert r.status == 200 and (await r.json())["policy"]["replicas"] == 2
        async with http.get(second.url + control.RING) as r:
            ring = await r.json()
        # reloaded workers count as live, at an epoch that never went backwards
        assert before == 2 and ring["epoch"] >= before
        assert [w["id"] for w in ring["workers"]] == ["w1", "w2"]
        async with http.post(second.url + control.heartbeat_path("w1"), json={}) as r:
            body = await r.json()
        assert body == {"epoch": ring["epoch"], "datasets_generation": 1, "known": True}
        async with http.post(second.url + control.WORKER_REGISTER, json=worker("w3", 9)) as r:
            assert (await r.json())["epoch"] == ring["epoch"] + 1
    finally:
        await second.stop()


def test_run_master_subprocess_sigterm(tmp_path: Path) -> None:
    url_file = tmp_path / "run" / "master.url"
    code = (
        "from shoal.config import MasterSettings\n"
        "from shoal.master.server import run_master\n"
        f"run_master(MasterSettings(port=0, state_dir={str(tmp_path / 'state')!r}, "
        f"url_file={str(url_file)!r}))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15
        while not url_file.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "master did not publish its URL"
            time.sleep(0.05)
        url = url_file.read_text().strip()
        assert url.startswith("http://127.0.0.1:")

        async def health() -> Any:
            async with aiohttp.ClientSession() as s, s.get(url + control.HEALTH) as r:
                return await r.json()

        assert asyncio.run(health())["ok"] is True
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err.decode()
        assert not url_file.exists()
        assert os.path.exists(tmp_path / "state" / "master.db")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_worker_id_is_bound_to_the_key_it_registered_with(
    call: Call, master: MasterServer
) -> None:
    """Issue 10 item 13: nobody can re-register a live worker's id at another address."""
    real = {**worker("w-bound", 7001), "key": "k" * 32}
    status, _ = await call("POST", control.WORKER_REGISTER, real)
    assert status == 200
    for impostor in (
        {**worker("w-bound", 6666), "key": "x" * 32},  # another key
        {**worker("w-bound", 6666)},  # no key
    ):
        status, body = await call("POST", control.WORKER_REGISTER, impostor)
        assert status == 403, body
        assert "another key" in body["error"]["message"] and "x" * 32 not in str(body)
    status, ring = await call("GET", control.RING)
    assert [w["port"] for w in ring["workers"] if w["id"] == "w-bound"] == [7001]
    # the real worker restarting (same key, new port) is welcome
    status, _ = await call("POST", control.WORKER_REGISTER, {**real, "port": 7002})
    assert status == 200
    status, ring = await call("GET", control.RING)
    assert [w["port"] for w in ring["workers"] if w["id"] == "w-bound"] == [7002]
    assert master.service.refused_registrations == 2
    status, body = await call("POST", control.WORKER_REGISTER, {**real, "key": "short"})
    assert status == 400, body

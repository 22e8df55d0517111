"""GET /api/v1/watch against a real master: answers as soon as the datasets generation
passes ``since``; a job that produced a generation is done only once recent watchers
have polled again with it (their acknowledgement), and a watcher that went away holds
it up for no more than 5 s."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from shoal.client.aio import AsyncClient
from shoal.config import ClientSettings
from shoal.proto.control import WATCH
from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wcluster(
    tmp_path_factory: pytest.TempPathFactory, s3_credentials: None, moto: MotoServer
) -> Iterator[TestCluster]:
    c = start_cluster(tmp_path_factory.mktemp("watch"), workers=2)
    try:
        make_bucket(moto.endpoint, "watch-bucket", sample_files(20, 10, 1000, seed=51))
        c.s3_dataset("watch-bucket", moto.endpoint, name="w")
        yield c
    finally:
        c.stop()


async def poll(
    http: aiohttp.ClientSession, master: str, since: int, timeout: float, watcher: str
) -> int:
    params = {"since": str(since), "timeout": str(timeout), "watcher": watcher}
    async with http.get(master + WATCH, params=params) as r:
        assert r.status == 200, await r.text()
        return int((await r.json())["datasets_generation"])


async def submit_sync(http: aiohttp.ClientSession, master: str) -> str:
    spec = {"kind": "sync", "dataset": "w", "paths": [""]}
    async with http.post(master + "/api/v1/jobs", json={"spec": spec}) as r:
        assert r.status == 201, await r.text()
        return str((await r.json())["id"])


async def job(http: aiohttp.ClientSession, master: str, jid: str) -> dict[str, Any]:
    async with http.get(f"{master}/api/v1/jobs/{jid}") as r:
        out: dict[str, Any] = await r.json()
        return out


async def until_done(http: aiohttp.ClientSession, master: str, jid: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        v = await job(http, master, jid)
        if v["state"] in ("done", "failed") or time.monotonic() > deadline:
            return v
        await asyncio.sleep(0.05)


def test_a_sync_is_done_only_after_a_slow_watcher_acknowledged_it(
    wcluster: TestCluster,
) -> None:
    master = wcluster.master_url

    async def go() -> str:
        async with aiohttp.ClientSession() as http:
            gen = await poll(http, master, -1, 0, "slow-mount")
            waiting = asyncio.ensure_future(poll(http, master, gen, 50, "slow-mount"))
            jid = await submit_sync(http, master)
            new = await asyncio.wait_for(waiting, 30)  # the sync's new manifest
            assert new > gen
            # the watcher takes its time to apply the change; meanwhile the job's tasks
            # finish, but the job waits for the watcher
            deadline = time.monotonic() + 30
            while True:
                v = await job(http, master, jid)
                settled = v["tasks"] and set(v["tasks"]) <= {"done"}
                if settled or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            v = await job(http, master, jid)
            assert v["state"] == "running" and set(v["tasks"]) <= {"done"}, v
            acked = time.time()
            # the re-poll with the new generation is the acknowledgement
            repoll = asyncio.ensure_future(poll(http, master, new, 5, "slow-mount"))
            v = await until_done(http, master, jid)
            assert v["state"] == "done" and v["finished"] >= acked, v
            await repoll
            return jid

    # first in this module: no other watcher is recent enough to hold the job up
    jid = asyncio.run(go())
    log = (wcluster.dir / "master.log").read_text()
    assert f"job {jid}: watchers" not in log  # released by the acknowledgement, not 5 s


def test_watch_answers_when_the_generation_moves_and_refuses_bad_input(
    wcluster: TestCluster,
) -> None:
    master = wcluster.master_url

    async def go() -> None:
        async with aiohttp.ClientSession() as http:
            now = await poll(http, master, -1, 0, "t1")
            assert await poll(http, master, now, 0.1, "t1") == now  # the timeout, unchanged
            waiting = asyncio.ensure_future(poll(http, master, now, 50, "t1"))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            async with http.patch(
                f"{master}/api/v1/datasets/w", json={"policy": {"readahead": 3}}
            ) as r:
                assert r.status == 200
            assert await asyncio.wait_for(waiting, 10) > now  # at once, not at the timeout
            for q, word in (
                ({"since": "x", "watcher": "a"}, "since"),
                ({"since": "1", "timeout": "-1", "watcher": "a"}, "timeout"),
                ({"since": "1", "timeout": "nan", "watcher": "a"}, "timeout"),
                ({"since": "1"}, "watcher"),
                ({"since": "1", "watcher": "a\nb"}, "watcher"),
            ):
                async with http.get(master + WATCH, params=q) as r:
                    body = await r.json()
                    assert r.status == 400 and word in body["error"]["message"], body
        cp = AsyncClient(ClientSettings(master=master))
        try:
            gen = await cp.watch(-1, 0, "t1")
            assert gen >= now + 1
            assert await cp.watch(gen, 0.1, "t1") == gen
        finally:
            await cp.close()

    asyncio.run(go())


def test_a_watcher_that_went_away_holds_a_sync_up_for_5s_at_most(
    wcluster: TestCluster,
) -> None:
    master = wcluster.master_url

    async def go() -> dict[str, Any]:
        async with aiohttp.ClientSession() as http:
            gen = await poll(http, master, -1, 0, "ghost-mount")
            await poll(http, master, gen, 0, "ghost-mount")  # and then never again
            jid = await submit_sync(http, master)
            return await until_done(http, master, jid)

    v = asyncio.run(go())
    assert v["state"] == "done", v
    log = (wcluster.dir / "master.log").read_text()
    lagging = [ln for ln in log.splitlines() if "WARNING" in ln and "ghost-mount" in ln]
    assert lagging and "did not acknowledge" in lagging[-1], log[-2000:]

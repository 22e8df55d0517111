"""GET /api/v1/jobs/{id}?wait=S against a real master: held while the job runs and
answered as soon as it ends (the gateway's writes wait so for their sync job instead
of polling), with the job's view at the time limit otherwise; bad input refused."""

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


@pytest.fixture
def jcluster(tmp_path: Any, s3_credentials: None, moto: MotoServer) -> Iterator[TestCluster]:
    c = start_cluster(tmp_path / "c", workers=1)
    try:
        make_bucket(moto.endpoint, "wait-bucket", sample_files(10, 10, 1000, seed=52))
        c.s3_dataset("wait-bucket", moto.endpoint, name="w")
        yield c
    finally:
        c.stop()


async def _poll(http: aiohttp.ClientSession, master: str, since: int, timeout: float) -> int:
    params = {"since": str(since), "timeout": str(timeout), "watcher": "holder"}
    async with http.get(master + WATCH, params=params) as r:
        assert r.status == 200, await r.text()
        return int((await r.json())["datasets_generation"])


async def _job(
    http: aiohttp.ClientSession, master: str, jid: str, wait: str | None = None
) -> tuple[int, dict[str, Any]]:
    params = {} if wait is None else {"wait": wait}
    async with http.get(f"{master}/api/v1/jobs/{jid}", params=params) as r:
        return r.status, await r.json()


def test_a_job_waited_for_is_answered_when_it_ends(jcluster: TestCluster) -> None:
    master = jcluster.master_url

    async def go() -> None:
        async with aiohttp.ClientSession() as http:
            # a watcher that has not applied the sync's generation holds the job
            # "running" after its tasks are done, until it polls again
            gen = await _poll(http, master, -1, 0)
            watching = asyncio.ensure_future(_poll(http, master, gen, 50))
            spec = {"kind": "sync", "dataset": "w", "paths": [""]}
            async with http.post(f"{master}/api/v1/jobs", json={"spec": spec}) as r:
                assert r.status == 201, await r.text()
                jid = str((await r.json())["id"])
            new = await asyncio.wait_for(watching, 30)
            deadline = time.monotonic() + 30
            while True:
                _, v = await _job(http, master, jid)
                if (v["tasks"] and set(v["tasks"]) <= {"done"}) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            waiter = asyncio.ensure_future(_job(http, master, jid, "30"))
            await asyncio.sleep(0.5)
            assert not waiter.done()  # held while the job runs
            status, v = await _job(http, master, jid, "0.2")  # the time limit: as it is
            assert status == 200 and v["state"] == "running", v
            acked = asyncio.ensure_future(_poll(http, master, new, 5))
            status, v = await asyncio.wait_for(waiter, 10)  # at its end, not at 30 s
            assert status == 200 and v["state"] == "done", v
            await acked
            for bad in ("x", "nan", "inf"):
                status, body = await _job(http, master, jid, bad)
                assert status == 400 and "wait" in body["error"]["message"], body
        client = AsyncClient(ClientSettings(master=master))
        try:
            assert (await client.job(jid, wait=5))["state"] == "done"
        finally:
            await client.close()

    asyncio.run(go())

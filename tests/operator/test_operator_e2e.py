"""The operator end to end: kopf in this process against kmock (an in-process
Kubernetes API), a real shoal master and two real workers (node identities ``node-a``
and ``node-b``) over moto's S3.

What this shows: a Dataset resource becomes a dataset in the master with its policy,
a policy change is applied live, a DataLoad loads the files for real (the Dataset's
cached % reaches 100), a Cron DataLoad is a master schedule that runs on while the
operator is down, Nodes carry the dataset label exactly while their worker holds
cache, the scheduling webhook of the running operator knows the Dataset, and deleting
the Dataset frees the cache and deletes it in the master.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import aiohttp
import kopf
import pytest
import pytest_asyncio

from shoal.errors import DatasetNotFound
from shoal.operator import crds, webhook
from shoal.operator.app import run
from shoal.operator.context import OperatorSettings
from shoal.testing.cluster import S3_ENV, TestCluster, sample_files
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration
NODES = ("node-a", "node-b")
T = TypeVar("T")
API = f"/apis/{crds.API_VERSION}/namespaces/team"


class NodeCluster(TestCluster):
    """Workers that say they run on Kubernetes nodes node-a, node-b (``--node``)."""

    __test__ = False

    def command(self, name: str, args: list[str]) -> list[str]:
        cmd = super().command(name, args)
        if name.startswith("worker-"):
            cmd += ["--node", NODES[int(name.split("-")[1])]]
        return cmd


@pytest.fixture(scope="module")
def shoal_cluster(
    tmp_path_factory: pytest.TempPathFactory, s3_credentials: None
) -> Iterator[NodeCluster]:
    c = NodeCluster(tmp_path_factory.mktemp("opcluster"), workers=2, env=dict(S3_ENV))
    c.start()
    try:
        yield c
    finally:
        c.stop()


async def until(what: str, probe: Callable[[], Awaitable[T | None]], timeout: float = 30) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Harness:
    """The kmock API, an operator running against it, and shortcuts to both."""

    def __init__(self, kube: Any, cluster: NodeCluster, tls: tuple[str, str]) -> None:
        self.kube = kube
        self.cluster = cluster
        self.tls = tls
        self.task: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self) -> None:
        settings = OperatorSettings(
            master=self.cluster.master_url,
            interval=0.5,
            free_timeout=30,
            connection=kopf.ConnectionInfo(server=str(self.kube.url).rstrip("/"), insecure=True),
            webhook_port=0,
            webhook_host="127.0.0.1",
            tls_cert=self.tls[0],
            tls_key=self.tls[1],
        )
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(run(settings, ready))
        self.port = await asyncio.wait_for(ready, 20)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
            self.task = None

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                method, str(self.kube.url).rstrip("/") + path, json=body, headers=headers
            ) as r,
        ):
            return await r.json() if r.status < 400 else None

    async def get(self, path: str) -> dict[str, Any] | None:
        got = await self.call("GET", path)
        return got if isinstance(got, dict) else None

    async def status(self, kind: str, name: str) -> dict[str, Any]:
        obj = await self.get(f"{API}/{kind}/{name}")
        return dict((obj or {}).get("status") or {})

    async def node_labels(self) -> dict[str, dict[str, str]]:
        got = await self.get("/api/v1/nodes") or {}
        return {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in got["items"]}

    def _dataset(self, name: str) -> Any:
        with self.cluster.client() as c:
            try:
                return c.dataset(name)
            except DatasetNotFound:
                return None

    def _jobs(self) -> dict[str, Any]:
        with self.cluster.client() as c:
            return c.jobs()

    async def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        def go() -> dict[str, Any]:
            with self.cluster.client() as c:
                return c.submit_job(spec)

        return await asyncio.to_thread(go)

    async def master_dataset(self, name: str) -> Any:
        return await asyncio.to_thread(self._dataset, name)

    async def master_jobs(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._jobs)


@pytest_asyncio.fixture
async def h(
    kube: Any, shoal_cluster: NodeCluster, tls_pair: tuple[str, str]
) -> AsyncIterator[Harness]:
    harness = Harness(kube, shoal_cluster, tls_pair)
    for node in (*NODES, "node-c"):  # node-c runs no worker
        await harness.call(
            "POST", "/api/v1/nodes", {"metadata": {"name": node, "labels": {"zone": "z1"}}}
        )
    await harness.call("POST", "/api/v1/namespaces", {"metadata": {"name": "team"}})
    try:
        yield harness
    finally:
        await harness.stop()


def dataset_cr(name: str, bucket: str, endpoint: str, **policy: Any) -> dict[str, Any]:
    return {
        "apiVersion": crds.API_VERSION,
        "kind": "Dataset",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {
            "mounts": [
                {"name": "data", "uri": f"s3://{bucket}", "options": {"endpoint_url": endpoint}}
            ],
            "policy": policy,
        },
    }


def dataload_cr(name: str, dataset: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": crds.API_VERSION,
        "kind": "DataLoad",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"dataset": dataset, **spec},
    }


async def test_dataset_load_labels_webhook_and_finalizer(
    h: Harness, moto: MotoServer, bucket: str, client_tls: ssl.SSLContext
) -> None:
    files = sample_files(60, 1000, 30_000, seed=7)
    make_bucket(moto.endpoint, bucket, files)
    await h.start()
    await h.call(
        "POST",
        f"{API}/runtimes",
        {"metadata": {"name": "shoal", "namespace": "team"}, "spec": {"worker": {"replicas": 2}}},
    )
    await h.call(
        "POST",
        f"{API}/datasets",
        dataset_cr("imgs", bucket, moto.endpoint, replicas=1, readahead=8),
    )

    # the dataset exists in the real master, with the CR's policy
    ds = await until("the dataset in the master", lambda: h.master_dataset("team.imgs"))
    assert ds.policy.readahead == 8 and ds.mounts[0].uri == f"s3://{bucket}"
    st = await until("Dataset Ready", lambda: _phase(h, "datasets", "imgs", "Ready"))
    assert st["masterName"] == "team.imgs" and st["volume"] == "imgs"
    rt = await until("Runtime Ready", lambda: _phase(h, "runtimes", "shoal", "Ready"))
    assert rt["readyWorkers"] == 2 and rt["capacityBytes"] > 0

    # its PV (CSI, volumeAttributes.dataset) and PVC
    pv = await h.get("/api/v1/persistentvolumes/shoal-team-imgs")
    assert pv is not None and pv["spec"]["csi"]["driver"] == "csi.shoal.io"
    assert pv["spec"]["csi"]["volumeAttributes"] == {"dataset": "team.imgs"}
    pvc = await h.get("/api/v1/namespaces/team/persistentvolumeclaims/imgs")
    assert pvc is not None and pvc["spec"]["volumeName"] == "shoal-team-imgs"

    # a policy change is applied live (same dataset, new generation)
    gen = ds.generation
    await h.call(
        "PATCH", f"{API}/datasets/imgs", {"spec": {"policy": {"readahead": 4, "pin": True}}}
    )
    ds2 = await until(
        "the policy update",
        lambda: _when(h.master_dataset("team.imgs"), lambda d: d.policy.pin),
    )
    assert ds2.policy.readahead == 4 and ds2.generation > gen

    # a DataLoad loads every file; the Dataset's status shows 100% cached
    await h.call("POST", f"{API}/dataloads", dataload_cr("warm", "imgs"))
    dl = await until("DataLoad Complete", lambda: _phase(h, "dataloads", "warm", "Complete"), 60)
    assert dl["filesDone"] == len(files) and dl["filesFailed"] == 0
    assert dl["bytesDone"] == sum(map(len, files.values())) and dl["jobId"].startswith("j-")
    st = await until(
        "100% cached",
        lambda: _when(h.status("datasets", "imgs"), lambda s: s.get("cachedPercent") == 100.0),
    )
    assert st["totalFiles"] == len(files) and st["cached"] == "100.0%"

    # both worker nodes hold cache: labelled; node-c is not
    key = "shoal.io/s-team-imgs"
    labels = await until(
        "node labels",
        lambda: _when(h.node_labels(), lambda n: all(n[x].get(key) == "true" for x in NODES)),
    )
    assert key not in labels["node-c"] and labels["node-a"]["zone"] == "z1"

    # the running operator's webhook knows the Dataset's PVC
    pod = {
        "metadata": {"namespace": "team"},
        "spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "imgs"}}]},
    }
    ops = await _review(h.port, client_tls, pod)
    assert (
        ops[0]["value"]["nodeAffinity"][webhook.PREFERRED][0]["preference"]["matchExpressions"][0][
            "key"
        ]
        == key
    )

    # freeing the cache (a Free DataLoad) takes the labels away
    await h.call("POST", f"{API}/dataloads", dataload_cr("drop", "imgs", operation="Free"))
    await until("Free Complete", lambda: _phase(h, "dataloads", "drop", "Complete"), 60)
    await until(
        "labels removed",
        lambda: _when(h.node_labels(), lambda n: all(key not in n[x] for x in NODES)),
    )

    # load again, then delete the Dataset: the finalizer frees and deletes it in the master
    await h.call("POST", f"{API}/dataloads", dataload_cr("warm2", "imgs"))
    await until("reload", lambda: _phase(h, "dataloads", "warm2", "Complete"), 60)
    await until(
        "labels back", lambda: _when(h.node_labels(), lambda n: n["node-a"].get(key) == "true")
    )
    await h.call("DELETE", f"{API}/datasets/imgs")
    await until("the Dataset gone", lambda: _absent(h, f"{API}/datasets/imgs"), 60)
    assert await h.master_dataset("team.imgs") is None
    free_jobs = [
        j
        for j in (await h.master_jobs())["jobs"]
        if j["kind"] == "free" and j["dataset"] == "team.imgs"
    ]
    # the Free DataLoad's and the finalizer's (a finalizer run again frees again)
    assert len(free_jobs) >= 2 and all(j["state"] == "done" for j in free_jobs)
    assert await h.get("/api/v1/persistentvolumes/shoal-team-imgs") is None
    assert await h.get("/api/v1/namespaces/team/persistentvolumeclaims/imgs") is None
    labels = await h.node_labels()
    assert all(key not in labels[n] for n in labels)


async def test_cron_dataload_and_operator_restart(
    h: Harness, moto: MotoServer, bucket: str
) -> None:
    files = sample_files(20, 100, 2000, seed=8)
    make_bucket(moto.endpoint, bucket, files)
    # created while no operator runs: the first operator converges it
    await h.call("POST", f"{API}/datasets", dataset_cr("nightly", bucket, moto.endpoint))
    every_2s = "* * * * * */2"
    await h.call(
        "POST",
        f"{API}/dataloads",
        dataload_cr("refresh", "nightly", policy="Cron", schedule=every_2s),
    )
    await h.start()
    st = await until(
        "Scheduled with a run",
        lambda: _when(
            h.status("dataloads", "refresh"),
            lambda s: s.get("runs", 0) >= 1 and s.get("lastRunPhase") == "Complete",
        ),
        60,
    )
    sid = st["scheduleId"]
    assert sid.startswith("s-") and st["phase"] == "Scheduled" and st["nextRun"]

    # the schedule is the master's: it runs on while the operator is down
    await h.stop()
    runs_then = await _runs(h, sid)
    await until("a run without the operator", lambda: _more_runs(h, sid, runs_then), 30)

    # a restarted operator adopts it (no second schedule) and catches up
    await h.start()
    st = await until(
        "status catches up",
        lambda: _when(h.status("dataloads", "refresh"), lambda s: s.get("runs", 0) > runs_then),
        30,
    )
    assert st["scheduleId"] == sid
    mine = [s for s in (await h.master_jobs())["schedules"] if s["dataset"] == "team.nightly"]
    assert [s["id"] for s in mine] == [sid]
    ds = await until("Dataset Ready", lambda: _phase(h, "datasets", "nightly", "Ready"))
    assert ds["cachedPercent"] == 100.0

    # an operator killed after submitting a job but before recording it: the job the
    # master holds for this DataLoad's spec is adopted, not submitted a second time
    await h.stop()
    spec = crds.dataload_plan({"dataset": "nightly", "paths": ["data/000"]}, "team").job
    submitted = await h.submit(spec)
    part = dataload_cr("part", "nightly", paths=["data/000"])
    part["status"] = {"phase": "Submitting"}  # as the killed operator left it
    await h.call("POST", f"{API}/dataloads", part)
    after = dataload_cr("after", "nightly", operation="Sync", policy="RunAfter")
    after["spec"]["runAfter"] = {"name": "part"}
    await h.call("POST", f"{API}/dataloads", after)
    await h.start()
    st = await until("adopted job Complete", lambda: _phase(h, "dataloads", "part", "Complete"))
    assert st["jobId"] == submitted["id"]
    # the RunAfter one starts only once "part" is Complete
    st2 = await until("RunAfter Complete", lambda: _phase(h, "dataloads", "after", "Complete"))
    sync = next(j for j in (await h.master_jobs())["jobs"] if j["id"] == st2["jobId"])
    assert sync["kind"] == "sync" and sync["created"] >= submitted["created"]
    part_job = next(j for j in (await h.master_jobs())["jobs"] if j["id"] == submitted["id"])
    assert sync["created"] >= part_job["finished"]
    same = [j for j in (await h.master_jobs())["jobs"] if j["spec"] == spec]
    assert len(same) == 1

    # deleting the DataLoad disables the schedule; deleting the Dataset removes it
    await h.call("DELETE", f"{API}/dataloads/refresh")
    await until("DataLoad gone", lambda: _absent(h, f"{API}/dataloads/refresh"))
    sched = next(s for s in (await h.master_jobs())["schedules"] if s["id"] == sid)
    assert sched["enabled"] is False
    await h.call("DELETE", f"{API}/datasets/nightly")
    await until("Dataset gone", lambda: _absent(h, f"{API}/datasets/nightly"), 60)
    assert await h.master_dataset("team.nightly") is None


async def _runs(h: Harness, sid: str) -> int:
    return sum(1 for j in (await h.master_jobs())["jobs"] if j.get("schedule") == sid)


async def _more_runs(h: Harness, sid: str, than: int) -> bool:
    return await _runs(h, sid) > than


async def _when(aw: Awaitable[T], ok: Callable[[T], Any]) -> T | None:
    v = await aw
    return v if v is not None and ok(v) else None


async def _phase(h: Harness, kind: str, name: str, phase: str) -> dict[str, Any] | None:
    st = await h.status(kind, name)
    return st if st.get("phase") == phase else None


async def _absent(h: Harness, path: str) -> bool:
    return await h.get(path) is None


async def _review(port: int, tls: ssl.SSLContext, pod: dict[str, Any]) -> list[dict[str, Any]]:
    req = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "e2e",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "team",
            "object": pod,
            "oldObject": None,
            "userInfo": {"username": "u"},
        },
    }
    url = f"https://127.0.0.1:{port}{webhook.PATH}"
    async with aiohttp.ClientSession() as http, http.post(url, json=req, ssl=tls) as r:
        body = await r.json()
    return json.loads(base64.b64decode(body["response"]["patch"]))  # type: ignore[no-any-return]

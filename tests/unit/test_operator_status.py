"""Status computed from the master's report and job views, node label plans, and the
adoption of a job a killed operator submitted."""

from __future__ import annotations

from typing import Any

from shoal.operator import crds, labels, status
from shoal.operator.dataloads import adopt

GiB = 1 << 30


def report(workers: list[dict[str, Any]], datasets: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "datasets": datasets,
        "workers": workers,
        "totals": {"capacity": 4 * GiB, "used": GiB, "datasets": len(datasets)},
    }


def worker(wid: str, node: str, state: str = "live", **per: int) -> dict[str, Any]:
    w: dict[str, Any] = {
        "id": wid,
        "node": node,
        "state": state,
        "capacity": 2 * GiB,
        "used": GiB // 2,
    }
    if per:
        w["datasets"] = {name: {"cached_bytes": n} for name, n in per.items()}
    return w


def ds(name: str, cached: int, total: int | None, hit: float = 0.0) -> dict[str, Any]:
    return {
        "name": name,
        "cached_files": 3,
        "cached_bytes": cached,
        "store_files": None if total is None else 10,
        "store_bytes": total,
        "cached_pct": None if total is None else min(100.0, 100.0 * cached / total),
        "hit_ratio": hit,
    }


def test_dataset_status_from_the_report() -> None:
    r = report([worker("w0", "n0")], [ds("team.a", 512 << 20, GiB, hit=0.925)])
    st = status.dataset_status(r, "team.a", {"n0"})
    assert st["totalFiles"] == 10 and st["totalBytes"] == GiB and st["size"] == "1.0GiB"
    assert (
        st["cachedBytes"] == 512 << 20 and st["cachedPercent"] == 50.0 and st["cached"] == "50.0%"
    )
    assert st["hitRatio"] == 0.925 and st["hitRatioText"] == "92.5%" and st["nodes"] == ["n0"]
    cached = next(c for c in st["conditions"] if c["type"] == "Cached")
    assert cached["status"] == "False" and cached["reason"] == "Partial"
    full = status.dataset_status(report([], [ds("team.a", GiB, GiB)]), "team.a", [])
    assert full["cachedPercent"] == 100.0
    assert next(c for c in full["conditions"] if c["type"] == "Cached")["status"] == "True"


def test_dataset_status_without_a_manifest() -> None:
    st = status.dataset_status(report([], [ds("team.a", 100, None)]), "team.a", [])
    assert st["totalBytes"] is None and st["cachedPercent"] is None and st["cached"] == ""
    assert next(c for c in st["conditions"] if c["type"] == "Cached")["reason"] == "NoManifest"
    # a dataset the report does not know yet: zeros, not an error
    st = status.dataset_status(report([], []), "team.b", [])
    assert st["cachedBytes"] == 0 and st["hitRatio"] == 0.0


def test_cache_nodes_per_worker_when_reported() -> None:
    r = report(
        [
            worker("w0", "n0", **{"team.a": 10, "team.b": 0}),
            worker("w1", "n1", **{"team.b": 5}),
            worker("w2", "n2", state="expired", **{"team.a": 99}),
        ],
        [ds("team.a", 10, 100), ds("team.b", 5, 100)],
    )
    assert status.cache_nodes(r, "team.a") == {"n0"}  # n2's worker expired
    assert status.cache_nodes(r, "team.b") == {"n1"}
    assert status.cache_nodes(r, "team.c") == set()


def test_cache_nodes_without_per_worker_figures() -> None:
    r = report(
        [worker("w0", "n0"), worker("w1", "n1"), worker("w2", "n2", state="expired")],
        [ds("team.a", 10, 100), ds("team.b", 0, 100)],
    )
    assert status.cache_nodes(r, "team.a") == {"n0", "n1"}
    assert status.cache_nodes(r, "team.b") == set()


def test_label_changes_and_plan() -> None:
    key = crds.node_label("team", "a")
    nodes = {"n0": {key: "true"}, "n1": {}, "n2": {key: "true", "zone": "z"}, "n3": {}}
    assert status.label_changes(nodes, key, {"n0", "n1", "gone"}) == {"n1": "true", "n2": None}
    r = report([worker("w0", "n0"), worker("w1", "n1")], [ds("team.a", 1, 10)])
    nodes["n3"] = {"shoal.io/s-old-deleted": "true", "shoal.io/other": "x"}
    plan = labels.plan(nodes, {("team", "a")}, r)
    assert plan == [
        ("n1", key, "true"),
        ("n2", key, None),
        ("n3", "shoal.io/s-old-deleted", None),  # a deleted Dataset's leftover
    ]
    applied = {n: dict(ls) for n, ls in nodes.items()}
    for node, k, v in plan:
        if v is None:
            applied[node].pop(k)
        else:
            applied[node][k] = v
    assert labels.plan(applied, {("team", "a")}, r) == []  # converged: nothing more to do


def test_runtime_status() -> None:
    r = report([worker("w0", "n0"), worker("w1", "n1", state="expired")], [])
    st = status.runtime_status(r, desired=2)
    assert (st["phase"], st["readyWorkers"], st["desiredWorkers"], st["expiredWorkers"]) == (
        "Degraded",
        1,
        2,
        1,
    )
    assert st["capacity"] == "4.0GiB" and st["usedBytes"] == GiB
    assert [w["node"] for w in st["workers"]] == ["n0", "n1"]
    assert status.runtime_status(r, desired=None)["phase"] == "Ready"
    assert status.runtime_status(report([], []), desired=1)["phase"] == "Pending"


def test_dataload_status_from_a_job_view() -> None:
    view = {
        "id": "j-1",
        "state": "done",
        "created": 1000.0,
        "finished": 1012.5,
        "files_total": 5,
        "files_done": 3,
        "files_skipped": 1,
        "files_failed": 1,
        "bytes_done": 300,
        "failures": [["data/x", "not found"]],
        "error": None,
    }
    st = status.dataload_status(view, now=2000.0)
    assert st["phase"] == "Failed"  # done, but a file failed
    assert (st["filesDone"], st["filesSkipped"], st["filesFailed"], st["bytesDone"]) == (
        3,
        1,
        1,
        300,
    )
    assert st["failures"] == [{"path": "data/x", "error": "not found"}]
    assert st["duration"] == "12.5s" and st["startTime"] == "1970-01-01T00:16:40Z"
    assert status.job_phase({**view, "files_failed": 0}) == "Complete"
    assert status.job_phase({"state": "running"}) == "Running"
    running = status.dataload_status({**view, "state": "running", "finished": None}, now=1030.0)
    assert running["duration"] == "30.0s" and running["completionTime"] is None


def test_adopt_finds_the_job_a_killed_operator_submitted() -> None:
    plan = crds.dataload_plan({"dataset": "a"}, "team")
    other = {**plan.job, "paths": ["x"]}
    listing = {
        "jobs": [
            {"id": "j-old", "spec": plan.job, "created": 900.0},  # before the DataLoad existed
            {"id": "j-sched", "spec": plan.job, "created": 1100.0, "schedule": "s-1"},
            {"id": "j-other", "spec": other, "created": 1100.0},
            {"id": "j-mine", "spec": plan.job, "created": 1001.0},
            {"id": "j-later", "spec": plan.job, "created": 1200.0},
        ],
        "schedules": [],
    }
    found = adopt(listing, plan, since=1000.0)
    assert found is not None and found["id"] == "j-mine"
    assert adopt({"jobs": [], "schedules": []}, plan, since=1000.0) is None
    # a job another DataLoad recorded as its own is never taken
    found = adopt(listing, plan, since=1000.0, claimed={"j-mine"})
    assert found is not None and found["id"] == "j-later"
    cron = crds.dataload_plan({"dataset": "a", "policy": "Cron", "schedule": "0 3 * * *"}, "team")
    listing["schedules"] = [
        {"id": "s-other", "cron": "0 4 * * *", "spec": cron.job},
        {"id": "s-mine", "cron": "0 3 * * *", "spec": cron.job},
    ]
    found = adopt(listing, cron, since=1000.0)
    assert found is not None and found["id"] == "s-mine"

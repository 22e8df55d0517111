"""Report aggregation, /metrics exposition and the control-protocol error helpers."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.core.membership import EXPIRED, LIVE, TierDecl, WorkerInfo, WorkerRecord
from shoal.errors import (
    DatasetExists,
    DatasetNotFound,
    InvalidArgument,
    ProtocolError,
    ShoalError,
    Unavailable,
)
from shoal.master.metrics import Snapshot, make_registry, render
from shoal.master.report import build_report
from shoal.proto import control


def rec(wid: str, stats: dict[str, Any], state: str = LIVE, hb: float = 0.0) -> WorkerRecord:
    i = WorkerInfo(wid, "h", 1, "", "n", (TierDecl("ssd", "/c", 1000),))
    return WorkerRecord(i, LIVE if state == LIVE else EXPIRED, hb, stats)


def ds_stats(
    files: int, nbytes: int, hits: int, misses: int, src: tuple[int, int, int]
) -> dict[str, Any]:
    return {
        "cached_files": files,
        "cached_bytes": nbytes,
        "hits": hits,
        "misses": misses,
        "bytes_by_source": dict(zip(("local", "remote", "ufs"), src, strict=True)),
    }


RECORDS = [
    rec(
        "a",
        {
            "tiers": [{"name": "ssd", "path": "/c", "capacity": 1000, "used": 300, "pages": 3}],
            "datasets": {"d1": ds_stats(2, 200, 5, 1, (100, 50, 50))},
            "corrupt_pages": 1,
        },
    ),
    rec(
        "b",
        {
            "datasets": {
                "d1": ds_stats(1, 100, 1, 1, (0, 0, 0)),
                "gone": ds_stats(1, 5, 0, 0, (0, 0, 0)),
            }
        },
    ),
    rec("c", {"datasets": {"d1": ds_stats(9, 900, 2, 0, (0, 100, 0))}}, state=EXPIRED),
    rec("d", {"datasets": "garbage", "tiers": ["x"], "corrupt_pages": "many"}),
]


def test_report_sums_and_ratios() -> None:
    r = build_report(RECORDS, ["d1", "d2"], now=2.5, epoch=4)
    by = {d["name"]: d for d in r["datasets"]}
    assert set(by) == {"d1", "d2", "gone"}
    d1 = by["d1"]
    # cached: live workers only (a + b); traffic: every worker (a + b + c)
    assert (d1["cached_files"], d1["cached_bytes"]) == (3, 300)
    assert (d1["hits"], d1["misses"]) == (8, 2)
    assert d1["bytes_by_source"] == {"local": 100, "remote": 150, "ufs": 50}
    assert d1["hit_ratio"] == pytest.approx(250 / 300)
    assert by["d2"]["hit_ratio"] == 0 and by["d2"]["cached_bytes"] == 0

    workers = {w["id"]: w for w in r["workers"]}
    assert workers["a"]["used"] == 300 and workers["a"]["tiers"][0]["pages"] == 3
    # no tier stats yet: registered tiers, nothing used
    assert workers["b"]["capacity"] == 1000 and workers["b"]["used"] == 0
    assert workers["c"]["state"] == "expired" and workers["a"]["last_heartbeat_age_s"] == 2.5
    t = r["totals"]
    assert t["epoch"] == 4 and t["datasets"] == 2
    assert (t["workers_live"], t["workers_expired"]) == (3, 1)
    assert t["corrupt_pages"] == 1 and t["cached_bytes"] == 305 and t["hits"] == 8


def test_hit_ratio_by_count_without_bytes() -> None:
    r = build_report([rec("a", {"datasets": {"d": {"hits": 3, "misses": 1}}})], ["d"], 0, 1)
    assert r["datasets"][0]["hit_ratio"] == 0.75


def test_metrics_exposition() -> None:
    registry = make_registry(lambda: Snapshot(RECORDS, ["d1"], 7))
    text = render(registry).decode()
    for line in [
        'shoal_master_workers{state="live"} 3.0',
        'shoal_master_workers{state="expired"} 1.0',
        "shoal_master_datasets 1.0",
        "shoal_ring_epoch 7.0",
        'shoal_cached_bytes{dataset="d1"} 300.0',
        'shoal_cached_files{dataset="d1"} 3.0',
        'shoal_cache_hits_total{dataset="d1"} 8.0',
        'shoal_cache_misses_total{dataset="d1"} 2.0',
        'shoal_read_bytes_total{dataset="d1",source="remote"} 150.0',
    ]:
        assert line in text
    # a second registry in the same process does not collide
    make_registry(lambda: Snapshot([], [], 0))


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (InvalidArgument("x"), 400),
        (DatasetNotFound("x"), 404),
        (DatasetExists("x"), 409),
        (ShoalError("x"), 500),
        (RuntimeError("secret detail"), 500),
    ],
)
def test_error_body_round_trip(exc: BaseException, status: int) -> None:
    assert control.http_status(exc) == status
    body = control.error_body(exc)
    with pytest.raises(ShoalError) as info:
        control.raise_for_error(status, body)
    if status < 500:
        # InvalidArgument shares UserError's code, so it comes back as UserError
        assert isinstance(exc, type(info.value)) and info.value.code == exc.code
        assert info.value.message == "x"
    else:
        assert "secret detail" not in info.value.message


def test_raise_for_error_other_shapes() -> None:
    control.raise_for_error(200, {"ok": True})
    with pytest.raises(Unavailable):
        control.raise_for_error(503, "<html>")
    with pytest.raises(ProtocolError):
        control.raise_for_error(400, None)


def test_paths_are_quoted() -> None:
    assert control.dataset_path("a.b") == "/api/v1/datasets/a.b"
    assert control.heartbeat_path("w:1") == "/api/v1/workers/w%3A1/heartbeat"


def test_ring_from_response() -> None:
    ring = control.ring_from_response(
        {
            "epoch": 3,
            "vnodes": 16,
            "workers": [{"id": "a", "host": "h", "port": 1, "uds": "", "node": "n"}],
        }
    )
    assert ring.epoch == 3 and ring.members == ("a",) and ring.vnodes == 16

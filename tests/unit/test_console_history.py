"""The console's history: a bounded ring, reset-safe counters, rates and hit ratios
over a window, tier use and workers up/down -- plain calls with made-up records."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from shoal.core.membership import EXPIRED, LIVE, TierDecl, WorkerInfo, WorkerRecord
from shoal.master.history import History
from shoal.master.ui.data import safe_uri
from shoal.master.ui.fmt import esc, val


def rec(wid: str, *, live: bool = True, **datasets: dict[str, Any]) -> WorkerRecord:
    stats: dict[str, Any] = {
        "tiers": [{"name": "mem", "capacity": 100, "used": 10, "pages": 1, "evicted_bytes": 0}],
        "datasets": datasets,
    }
    info = WorkerInfo(wid, "127.0.0.1", 1, tiers=(TierDecl("mem", "", 100),))
    return WorkerRecord(info, LIVE if live else EXPIRED, 0.0, stats)


def ds(local: int = 0, remote: int = 0, ufs: int = 0, cached: int = 0, **kw: int) -> dict[str, Any]:
    return {
        "hits": kw.get("hits", 0),
        "misses": kw.get("misses", 0),
        "bytes_by_source": {"local": local, "remote": remote, "ufs": ufs},
        "cached_bytes": cached,
        "cached_files": 1 if cached else 0,
    }


def test_the_ring_keeps_only_its_capacity() -> None:
    h = History(interval=5, capacity=3)
    for i in range(5):
        h.sample([rec("w1")], [], float(i))
    assert [p.t for p in h.points] == [2.0, 3.0, 4.0]


def test_rates_by_source_and_a_restarted_worker_never_goes_backwards() -> None:
    h = History(interval=5)
    h.sample([rec("w1", a=ds(local=0, ufs=0))], ["a"], 0.0)
    h.sample([rec("w1", a=ds(local=500, ufs=1000))], ["a"], 5.0)
    # w1 restarted: its counters start again from zero and then count 50 more bytes
    h.sample([rec("w1", a=ds(local=50, ufs=0))], ["a"], 10.0)
    s = h.series()
    assert s["t"] == [0.0, 5.0, 10.0]
    assert s["read_bytes_per_s"]["local"] == [None, 100.0, 10.0]
    assert s["read_bytes_per_s"]["ufs"] == [None, 200.0, 0.0]
    assert s["hit_ratio"][1] == pytest.approx(500 / 1500)
    assert s["hit_ratio"][2] == 1.0
    assert h.rates() == {"local": 10.0, "remote": 0.0, "ufs": 0.0}
    # the cumulative sums only grow
    counters = [p.counters for p in h.points]
    assert all(b >= a for x, y in itertools.pairwise(counters) for a, b in zip(x, y, strict=True))


def test_hit_ratio_over_a_window_ignores_older_traffic() -> None:
    h = History(interval=5)
    h.sample([rec("w1", a=ds())], ["a"], 0.0)
    h.sample([rec("w1", a=ds(ufs=1000))], ["a"], 100.0)  # all misses, long ago
    h.sample([rec("w1", a=ds(ufs=1000, remote=300))], ["a"], 500.0)
    h.sample([rec("w1", a=ds(ufs=1000, remote=600))], ["a"], 505.0)
    assert h.hit_ratio(10) == 1.0  # only the last two points are in the window
    assert h.hit_ratio(1000) == pytest.approx(600 / 1600)
    assert h.hit_ratio(1000, "a") == pytest.approx(600 / 1600)
    assert h.hit_ratio(1000, "other") is None  # nothing read
    # no bytes reported at all: hits over reads
    g = History()
    g.sample([rec("w1", a=ds())], ["a"], 0.0)
    g.sample([rec("w1", a=ds(hits=3, misses=1))], ["a"], 5.0)
    assert g.hit_ratio(60) == 0.75


def test_datasets_tiers_and_workers_up_and_down() -> None:
    h = History()
    w1 = rec("w1", a=ds(cached=40, remote=10), b=ds(cached=5))
    w2 = rec("w2", live=False, a=ds(cached=99, remote=7))  # expired: traffic counts, cache not
    h.sample([w1, w2], ["a", "b", "c"], 0.0)
    p = h.points[-1]
    assert (p.workers_live, p.workers_down) == (1, 1)
    assert p.tiers == {"mem": (10, 100)}
    assert p.cached_bytes == 45
    assert p.datasets["a"].cached_bytes == 40 and p.datasets["a"].counters[1] == 17
    assert p.datasets["c"].cached_bytes == 0  # defined, never reported
    s = h.series()
    assert s["workers_live"] == [1] and s["workers_down"] == [1]
    assert s["tiers"] == {"mem": {"used": [10], "capacity": [100]}}
    assert h.series("a")["cached_bytes"] == [40]
    assert "tiers" not in h.series("a")


def test_a_worker_that_stops_reporting_keeps_its_share() -> None:
    h = History()
    h.sample([rec("w1", a=ds(ufs=100)), rec("w2", a=ds(ufs=50))], ["a"], 0.0)
    h.sample([rec("w1", a=ds(ufs=100))], ["a"], 5.0)  # w2 is gone from the records
    assert h.points[-1].counters[2] == 150
    assert h.rates()["ufs"] == 0.0


def test_evictions_per_second_when_workers_report_them() -> None:
    h = History()
    a = rec("w1")
    b = rec("w1")
    b.stats["tiers"][0]["evicted_bytes"] = 5000
    h.sample([a], [], 0.0)
    assert h.evictions_per_s("w1") is None
    h.sample([b], [], 5.0)
    assert h.evictions_per_s("w1") == 1000.0
    assert h.evictions_per_s("nobody") is None


def test_window_of_series_and_bad_arguments() -> None:
    h = History()
    for i in range(10):
        h.sample([rec("w1")], [], i * 5.0)
    assert len(h.series(seconds=20)["t"]) == 5
    with pytest.raises(ValueError):
        History(interval=0)


def test_values_are_escaped_and_passwords_hidden() -> None:
    html = val("<script>x</script>", "text", "f")
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert esc('"') == "&quot;"
    assert safe_uri("s3://bucket/p") == "s3://bucket/p"
    assert "hunter2" not in safe_uri("http://user:hunter2@host:9000/x")

"""The gateway workload's pure parts: how many objects a pass reads, the shapes of
16 requests in flight, and the targets it is judged by."""

from __future__ import annotations

from shoal.bench.gateway import INFLIGHT, SMALL_MAX, SMALL_MAX_QUICK, plan
from shoal.bench.gatewayrun import gateway_targets
from shoal.bench.stats import Result, Sample
from shoal.bench.suite import targets


def test_plan_caps_the_objects_and_keeps_16_in_flight() -> None:
    n, shapes = plan(20_000, 4, quick=False)
    assert n == SMALL_MAX
    assert shapes == [(1, INFLIGHT), (4, INFLIGHT // 4)]
    assert all(p * t == INFLIGHT for p, t in shapes)
    assert plan(2_000, 2, quick=True) == (SMALL_MAX_QUICK, [(1, 16), (2, 8)])
    assert plan(300, 2, quick=True)[0] == 300  # fewer files than the cap: all of them


def test_plan_with_one_process_has_one_shape() -> None:
    assert plan(100, 1, quick=False) == (100, [(1, INFLIGHT)])


def test_gateway_targets_are_in_the_suites_targets() -> None:
    labels = [t.label for t in targets(4)]
    for t in gateway_targets(4):
        assert t.label in labels
    # one process and four: warm and cold each, plus the large object's two
    assert len(gateway_targets(4)) == 6
    assert len(gateway_targets(1)) == 4


def test_gateway_targets_evaluate_same_run_ratios() -> None:
    def res(wl: str, c: str, secs: float, files: int = 100, nbytes: int = 10_000_000) -> Result:
        return Result(wl, c, [Sample(secs, files, nbytes)])

    results = {
        (r.workload, r.contender): r
        for r in (
            res("gateway 100KB warm p1", "shoal-s3-gateway", 1.0),
            res("gateway 100KB warm p1", "boto3", 4.0),  # 4x slower: target met
            res("gateway 100KB cold p1", "shoal-s3-gateway", 2.0),
            res("gateway 100KB cold p1", "boto3", 1.0),  # 0.5x: missed
            res("large gateway warm", "shoal-s3-gateway", 2.0, 1, 1 << 30),
            res("large gateway warm", "shoal-client", 1.0, 1, 1 << 30),  # 0.5x: missed
        )
    }
    got = {t.label: t.evaluate(results) for t in gateway_targets(1)}
    warm = got["S3 gateway warm 100 KB GETs >= 3x direct (boto3 p1, 16 in flight)"]
    cold = got["S3 gateway cold 100 KB GETs >= 0.9x direct (boto3 p1, 16 in flight)"]
    large = got["S3 gateway warm large GET >= 0.7x the Python client"]
    assert warm == (4.0, True)
    assert cold == (0.5, False)
    assert large == (0.5, False)
    assert got["S3 gateway cold large GET >= 0.9x direct"] == (None, None)  # not measured

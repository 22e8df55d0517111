"""The benchmark report's arithmetic: medians of per-run rates, CPU per GB, ratios."""

from __future__ import annotations

import pytest

from shoal.bench.stats import (
    Result,
    Sample,
    Target,
    cpu_per_gb,
    median,
    median_rate,
    ratio,
    ratio_table,
)


def test_median_odd_and_even() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_median_rate_is_the_median_of_per_run_rates() -> None:
    runs = [Sample(1.0, 100, 1000), Sample(10.0, 100, 1000), Sample(2.0, 100, 1000)]
    # per-run rates 100, 10, 50 files/s: the median is 50, not total/total (300/13)
    assert median_rate(runs, "files") == 50.0
    assert median_rate(runs, "bytes") == 500.0
    assert median_rate([], "files") == 0.0


def test_cpu_per_gb() -> None:
    runs = [Sample(1.0, 1, 2_000_000_000, cpu_s=4.0), Sample(1.0, 1, 1_000_000_000, cpu_s=3.0)]
    assert cpu_per_gb(runs) == pytest.approx(2.5)  # median of 2.0 and 3.0
    assert cpu_per_gb([Sample(1.0, 0, 0, 1.0)]) == 0.0


def test_ratio_and_table() -> None:
    assert ratio(50.0, 100.0) == 0.5
    assert ratio(1.0, 0.0) is None
    table = ratio_table({"a": 10.0, "b": 20.0}, reference="b")
    assert table == {"a": {"b": 0.5}, "b": {"b": 1.0}}
    assert ratio_table({"a": 10.0, "b": 20.0})["b"]["a"] == 2.0


def test_target_met_missed_and_unmeasured() -> None:
    def res(wl: str, c: str, files: int) -> Result:
        return Result(wl, c, [Sample(1.0, files, files * 100)])

    results = {("w", "shoal"): res("w", "shoal", 90), ("w", "local"): res("w", "local", 100)}
    t = Target("t", ("w", "shoal"), ("w", "local"), 0.8)
    r, met = t.evaluate(results)
    assert r == pytest.approx(0.9)
    assert met is True
    assert Target("t", ("w", "shoal"), ("w", "local"), 0.95).evaluate(results)[1] is False
    assert Target("t", ("w", "fuse"), ("w", "local"), 0.9).evaluate(results) == (None, None)
    mb = Target("t", ("w", "shoal"), ("w", "local"), 0.8, metric="mb_per_s").evaluate(results)
    assert mb[0] == pytest.approx(0.9)

"""The latency workload's arithmetic and report (the timed reads themselves run in
``shoal bench``; a performance number is never asserted in a test)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from shoal.bench.contender import Contender
from shoal.bench.latency import Latencies, markdown, measure


def test_quantiles_are_nearest_rank() -> None:
    lat = Latencies("c", "warm", tuple(i / 1000 for i in range(1, 1001)))  # 1..1000 ms
    assert lat.quantile(0.5) == pytest.approx(0.500)
    assert lat.quantile(0.99) == pytest.approx(0.990)
    assert lat.quantile(0.999) == pytest.approx(0.999)
    assert lat.quantile(1.0) == pytest.approx(1.0)
    d = lat.to_dict()
    assert (d["reads"], d["p50"], d["p99.9"], d["max"]) == (1000, 500.0, 999.0, 1000.0)
    one = Latencies("c", "cold", (0.004,))
    assert one.quantile(0.5) == one.quantile(0.999) == 0.004
    assert math.isnan(Latencies("c", "cold", ()).quantile(0.5))


def test_markdown_has_a_row_per_contender_and_pass() -> None:
    rows = [Latencies("shoal-client", p, (0.001, 0.002)) for p in ("cold", "warm")]
    rows.append(Latencies("boto3", "cold", (0.01,)))
    text = "\n".join(markdown(rows))
    assert "| shoal-client | warm | 2 | 1.000 |" in text
    assert "| boto3 | cold | 1 | 10.000 |" in text
    assert markdown([]) == []


class _Files(Contender):
    name = "files"

    def reader(self):  # type: ignore[no-untyped-def]
        root = self.env.local_root
        return lambda key: len((root / key).read_bytes())


def test_measure_times_every_read_in_a_new_process(tmp_path: Path) -> None:
    from shoal.bench.contender import BenchEnv

    for i in range(5):
        (tmp_path / f"f{i}").write_bytes(b"x" * 100)
    env = BenchEnv(tmp_path, "", "", tmp_path)
    times = measure(_Files(env), [f"f{i}" for i in range(5)])
    assert len(times) == 5 and all(t > 0 for t in times)
    with pytest.raises(RuntimeError, match="FileNotFoundError"):
        measure(_Files(env), ["missing"])

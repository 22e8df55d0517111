"""The bench's pass planning: caps keep slow peers inside the budget, warm = cached."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.bench import runner
from shoal.bench.contenders import BenchEnv, Contender
from shoal.bench.stats import Sample
from shoal.bench.suite import Config
from shoal.bench.workloads import Passes


class _Peer(Contender):
    name = "peer"
    kind = "cache"


def _run_small(cfg: Config, keys: list[str]) -> list[str]:
    """Run the small-file passes of one peer; the workloads measured, in order."""
    calls: list[str] = []

    def measure(wl: str, c: Contender, fn: Callable[[], Sample], cold: bool) -> Sample | None:
        calls.append(wl)
        return fn()

    Passes(cfg, measure, lambda w: w == "small").run(_Peer(BenchEnv.__new__(BenchEnv)), keys, [], 0)
    return calls


def test_a_capped_cold_pass_limits_warm_passes_to_what_it_cached(monkeypatch: Any) -> None:
    keys = [f"d/{i:03d}" for i in range(100)]
    seen: list[tuple[str, list[str], float | None]] = []

    def fake_epoch(c: Any, ks: list[str], procs: int, threads: int, seed: int,
                   batch: int = 64, cap_s: float | None = None) -> Sample:  # fmt: skip
        seen.append((f"p{procs}", list(ks), cap_s))
        slow = cap_s is not None and len(ks) == 100  # the cold pass gets through 30 files
        return Sample(1.0, 30 if slow else len(ks), 0, 0.0, ks[:30] if slow else None)

    monkeypatch.setattr(runner, "epoch", fake_epoch)
    cfg = Config(quick=False, procs=4, warm_reps=3, cold_reps=2, cap_s=5.0, cold_cap_s=9.0)
    calls = _run_small(cfg, keys)
    # one capped cold pass (no second rep), warm passes over exactly the 30 cached files,
    # repeated while they finish under their cap, then the cold p1 pass
    assert calls[0] == "small-100KB cold p4"
    assert calls.count("small-100KB cold p4") == 1
    warm = seen[1:-1]
    assert warm and all(ks == keys[:30] for _, ks, _ in warm)
    assert all(cap == 5.0 for _, _, cap in warm)
    assert calls.count("small-100KB warm p1") == 3 and calls.count("small-100KB warm p4") == 3
    assert calls[-1] == "small-100KB cold p1" and seen[-1][2] == 9.0


def test_a_second_cold_pass_that_is_capped_limits_warm_passes_to_what_it_cached(
    monkeypatch: Any,
) -> None:
    # the full run of 2026-12-07: the first cold pass read every file, the second (which
    # started from an empty cache again) was capped, and the warm passes then read files
    # that were not cached as if they were
    keys = [f"d/{i:03d}" for i in range(100)]
    cold_passes: list[int] = []
    seen: list[list[str]] = []

    def fake_epoch(c: Any, ks: list[str], procs: int, threads: int, seed: int,
                   batch: int = 64, cap_s: float | None = None) -> Sample:  # fmt: skip
        if cap_s == 9.0 and procs == 4:
            cold_passes.append(1)
            if len(cold_passes) == 2:
                return Sample(1.0, 30, 0, 0.0, ks[:30])
            return Sample(1.0, len(ks), 0, 0.0, None)
        seen.append(list(ks))
        return Sample(1.0, len(ks), 0, 0.0, None)

    monkeypatch.setattr(runner, "epoch", fake_epoch)
    cfg = Config(quick=False, procs=4, warm_reps=2, cold_reps=2, cap_s=5.0, cold_cap_s=9.0)
    calls = _run_small(cfg, keys)
    assert calls.count("small-100KB cold p4") == 2
    warm = seen[:-1]  # the last is the cold p1 pass, over every file
    assert len(warm) == 4 and all(ks == keys[:30] for ks in warm)


def test_a_capped_warm_pass_is_not_repeated(monkeypatch: Any) -> None:
    keys = [f"d/{i:03d}" for i in range(10)]

    def fake_epoch(c: Any, ks: list[str], procs: int, threads: int, seed: int,
                   batch: int = 64, cap_s: float | None = None) -> Sample:  # fmt: skip
        warm_p1 = cap_s == 5.0 and procs == 1
        return Sample(1.0, len(ks), 0, 0.0, ks[:2] if warm_p1 else None)

    monkeypatch.setattr(runner, "epoch", fake_epoch)
    cfg = Config(quick=True, procs=2, warm_reps=3, cold_reps=1, cap_s=5.0, cold_cap_s=9.0)
    calls = _run_small(cfg, keys)
    assert calls.count("small-100KB warm p1") == 1  # capped: once
    assert calls.count("small-100KB warm p2") == 3  # finished: every rep
    assert "small-100KB cold p1" not in calls  # quick


def test_local_data_follows_the_spec_last_written(tmp_path: Any) -> None:
    """Quick and full runs share the data folder: switching back rewrites what changed."""
    from shoal.bench.stores import DataSpec, write_local

    full = DataSpec(3, small_size=1000, large_size=64 << 10).layout()
    quick = DataSpec(3, small_size=1000, large_size=16 << 10).layout()
    big = tmp_path / "large/blob.bin"
    write_local(full, tmp_path)
    assert big.stat().st_size == 64 << 10
    write_local(quick, tmp_path)
    assert big.stat().st_size == 16 << 10
    write_local(full, tmp_path)  # its earlier "complete" marker must not hide the change
    assert big.stat().st_size == 64 << 10


def test_a_cap_must_be_positive(capsys: Any) -> None:
    import os

    import pytest

    from shoal.bench.cli import main

    if os.geteuid() != 0:
        pytest.skip("shoal bench refuses to run without root before it reads caps")
    assert main(["--quick", "--cold-cap-s", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["shoal bench: --cold-cap-s must be a positive number of seconds, got 0.0"]


def test_preload_imports_what_it_can_and_skips_what_is_missing() -> None:
    import sys

    secs = runner.preload(("json", "shoal_bench_no_such_module"))
    assert secs >= 0 and "json" in sys.modules and "shoal_bench_no_such_module" not in sys.modules
    assert "s3fs" in runner.READER_MODULES and "pandas" in runner.READER_MODULES

"""The scale workload's pure parts (bench/scale.py) and the report's new columns and
charts (bench/report.py): CPU per GB on every row with bytes, one chart per workload."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import Any

import pytest

from shoal.bench import report, scale
from shoal.bench.contender import BenchEnv, Contender
from shoal.bench.latency import Latencies, timed
from shoal.bench.stats import Sample
from shoal.bench.suite import Config, Report, Suite, targets


def test_tree_sizes_are_log_uniform_and_the_tree_is_reused(tmp_path: Path) -> None:
    spec = scale.TreeSpec(2500, lo=4096, hi=16384)
    sizes = spec.sizes()
    assert min(sizes) >= 4096 and max(sizes) <= 16384
    mid = math.exp((math.log(4096) + math.log(16384)) / 2)
    assert statistics.median(sizes) == pytest.approx(mid, rel=0.08)
    root = tmp_path / "tree"
    total = scale.make_tree(root, spec)
    assert total == sum(sizes)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    assert len(files) == 2500 and len({p.parent for p in files}) == 3  # 1000 per folder
    assert (root / spec.key(7)).stat().st_size == sizes[7]
    assert (root / spec.key(1)).read_bytes() != (root / spec.key(2)).read_bytes()[: sizes[1]]
    (root / spec.key(0)).unlink()
    assert scale.make_tree(root, spec) == total  # the marker: not rebuilt
    assert not (root / spec.key(0)).exists()
    other = scale.TreeSpec(10, lo=4096, hi=16384)
    scale.make_tree(root, other)  # another size: rebuilt, the old marker dropped
    assert sum(1 for p in root.rglob("*") if p.is_file()) == 10
    assert len(list(tmp_path.glob(".tree-made-*"))) == 1


def test_rss_growth_and_verdict() -> None:
    assert scale.rss(os.getpid()) > 1 << 20
    assert scale.rss(2**22 + 12345) == 0  # no such process
    assert scale.growth(2.0, 1.0) == 0.5
    assert scale.growth(0.0, 1.0) is None
    assert scale.verdict(1.1) == "linear or better"
    assert scale.verdict(0.5) == "linear or better"
    assert scale.verdict(1.6).startswith("worse than linear (1.60x")
    assert scale.verdict(None) == "-"


def _row(n: int, build: float, rss: int) -> dict[str, float]:
    return {"files": n, "bytes": n * 8000, "lo": 4096, "hi": 16384, "build_s": build,
            "build_cpu_s": build / 2, "load_files_per_s": 9000.0, "load_cpu_s": n / 10_000,
            "epoch_shoal-client": 20_000.0, "epoch_local-dir": 25_000.0,
            "worker_rss_load": rss, "worker_rss_epoch": rss, "master_rss_epoch": 1e8,
            "index_bytes_per_file": 120.0, "manifest_bytes_per_file": 40.0}  # fmt: skip


def test_scale_markdown_has_a_column_per_n_and_the_growth() -> None:
    text = "\n".join(
        scale.markdown([_row(100_000, 1.5, 200_000_000), _row(1_000_000, 30.0, 1_100_000_000)])
    )
    assert "| measure | 100,000 files | 1,000,000 files | growth |" in text
    # 15 s per 1M files at 100k, 30 s at 1M: twice the per-file cost
    assert "| manifest build, s per 1M files | 15.0 | 30.0 | 2.00 |" in text
    assert "1,000 B per extra file" in text  # (1.1 GB - 0.2 GB) / 900k files
    assert "Manifest build: worse than linear (2.00x per file)" in text
    assert "load CPU per file: linear or better" in text
    assert scale.markdown([]) == []


def _report(tmp_path: Path) -> Report:
    # quick data, the full run's worker counts (quick's one count has no w4 row)
    cfg = Config.make(True, workdir=tmp_path, train_workers=(2, 4, 8), train_images=200)
    rep = Report(cfg, {"date": "d", "cores": 2, "cpu": "c", "memory_gib": 1, "kernel": "k",
                       "python": "3"})  # fmt: skip
    rep.add("train warm w4", "local-dir", Sample(2.0, 1000, 100_000_000, cpu_s=3.0))
    rep.add("train warm w4", "shoal-torch", Sample(2.0, 990, 99_000_000, cpu_s=4.0))
    rep.add("train warm w4", "shoal-fuse", Sample(2.0, 1010, 101_000_000, cpu_s=5.0))
    rep.add("scale 10k manifest build", "shoal-load", Sample(1.0, 10_000, 0, cpu_s=1.0))
    rep.extra["latency"] = [Latencies("shoal-client", "warm", (0.001, 0.002), 0.5, 200_000)]
    return rep


def test_report_rows_carry_cpu_per_gb_and_targets_cover_the_training_loop(tmp_path: Path) -> None:
    rep = _report(tmp_path)
    text = report.markdown(rep, [])
    assert "| shoal-torch | 495 | 50 | 40.40 | 0.99 | 1 |  |" in text  # 4 s / 0.099 GB
    assert "| shoal-load | 10,000 | - | - | - | 1 |  |" in text  # no bytes: no CPU per GB
    assert "Training loop (`train ...`): 200 JPEGs" in text
    assert "| shoal-client | warm | 2 | 1.000 | 2.000 | 2.000 | 2.000 | 2.000 | 2,500.00 |" in text
    got = {t["target"]: t for t in report.ratios(rep)["targets"]}
    t = got["training loop warm, 4 workers: ShoalMapDataset >= 0.98x local files"]
    assert t["ratio"] == 0.99 and t["met"] is True
    assert got["training loop warm, 4 workers: FUSE >= 0.98x local files"]["ratio"] == 1.01
    labels = [t.label for t in targets(4, (2, 8))]
    assert "training loop warm, 8 workers: FUSE >= 0.98x local files" in labels
    assert not any("4 workers" in x for x in labels)


def test_one_chart_per_workload_with_every_contender(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rep = _report(tmp_path)
    assert [c for c, _, _ in report.bars(rep, "train warm w4")] == [
        "shoal-torch",
        "local-dir",
        "shoal-fuse",
    ]
    assert [k for _, _, k in report.bars(rep, "train warm w4")] == ["#d62728", "#7f7f7f", "#d62728"]
    made = report.charts(rep, tmp_path / "charts", tmp_path)
    assert sorted(made) == sorted(["charts/train-warm-w4.png", "charts/scale-10k-manifest-build.png",
                                   "charts/latency-cdf.png"])  # fmt: skip
    for m in made:
        assert (tmp_path / m).read_bytes()[:4] == b"\x89PNG"
    assert report.slug("small-100KB warm p1") == "small-100kb-warm-p1"


def test_quick_is_a_smoke_check_and_leaves_the_full_run_alone(tmp_path: Path) -> None:
    full, quick = Config.make(False, workdir=tmp_path), Config.make(True, workdir=tmp_path)
    assert full == Config(workdir=tmp_path)  # no default of the full run moves
    assert (full.warm_reps, full.train_workers, full.every_link_path) == (3, (2, 4, 8), True)
    assert (full.meta_dirs, full.manifest_files) == (None, 1_000_000)
    # quick: one warm pass per kind, one worker count, one link path, short caps
    assert (quick.warm_reps, quick.cold_reps, quick.train_workers) == (1, 1, (2,))
    assert not quick.every_link_path and quick.cold_cap_s < full.cold_cap_s
    assert quick.gateway_keys is not None and quick.gateway_keys <= quick.small_files
    assert Config.make(True, warm_reps=3).warm_reps == 3  # an explicit flag still wins
    labels = [t.label for t in targets(quick.procs, quick.train_workers)]
    assert sum("training loop" in x for x in labels) == 2  # one count: torch and FUSE


def test_scale_runs_in_quick_only_when_named(tmp_path: Path) -> None:
    quick = Suite(Config.make(True, workdir=tmp_path), say=lambda s: None)
    assert not quick._want("scale") and quick._needs_store()
    named = Suite(Config.make(True, workdir=tmp_path, workloads=["scale"]), say=lambda s: None)
    assert named._want("scale") and not named._needs_store()
    assert Suite(Config.make(False, workdir=tmp_path), say=lambda s: None)._want("scale")


class _Slow(Contender):
    """Each read takes 50 ms (a slow peer)."""

    name = "slow"

    def reader(self):  # type: ignore[no-untyped-def]
        import time

        def read(key: str) -> int:
            time.sleep(0.05)
            return 100

        return read


def test_a_latency_pass_stops_at_its_cap_and_counts_cpu_and_bytes(tmp_path: Path) -> None:
    env = BenchEnv(tmp_path, "", "", tmp_path)
    times, cpu, nbytes = timed(_Slow(env), [f"k{i}" for i in range(40)], cap_s=0.2)
    assert 2 <= len(times) <= 6 and nbytes == 100 * len(times) and cpu >= 0
    assert len(timed(_Slow(env), ["a", "b", "c"])[0]) == 3  # no cap: every read


def test_quick_resets_a_contender_once_for_its_cold_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.bench import runner
    from shoal.bench.workloads import Passes

    monkeypatch.setattr(runner, "epoch", lambda *a, **k: Sample(1.0, 1, 1))
    monkeypatch.setattr(runner, "ranges", lambda *a, **k: Sample(1.0, 1, 1))
    monkeypatch.setattr(runner, "drop_caches", lambda: True)

    def colds(quick: bool) -> list[tuple[str, bool]]:
        got: list[tuple[str, bool]] = []

        def measure(wl: str, c: Contender, fn: Any, cold: bool) -> Sample | None:
            if "cold" in wl:
                got.append((wl, cold))
            return fn()

        cfg = Config(quick=quick, procs=2, warm_reps=1, cold_reps=1)
        Passes(cfg, measure, lambda w: True).run(
            _Slow(BenchEnv.__new__(BenchEnv)), ["s"], ["m"], 10
        )
        return got

    # small, mix and large read different files: one reset before the first is enough
    assert colds(True) == [("small-100KB cold p2", True), ("mix-10KB-5MB cold p2", False),
                           ("large seq cold", False)]  # fmt: skip
    assert all(cold for _, cold in colds(False))


class _Cache(Contender):
    """A first read takes 50 ms and leaves a marker; a read of a marked key is fast."""

    name = "cache"

    def reader(self):  # type: ignore[no-untyped-def]
        import time

        root = self.env.local_root

        def read(key: str) -> int:
            if not (root / key).exists():
                time.sleep(0.05)
                (root / key).touch()
            return 100

        return read


def test_after_a_capped_cold_latency_pass_warm_reads_only_what_it_cached(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from shoal.bench import latency

    suite = SimpleNamespace(cfg=Config(latency_reads=40, latency_cap_s=0.2),
                            report=SimpleNamespace(extra={}), say=lambda s: None)  # fmt: skip
    latency.run(suite, _Cache(BenchEnv(tmp_path, "", "", tmp_path)), [f"k{i}" for i in range(40)])  # type: ignore[arg-type]
    cold, warm = suite.report.extra["latency"]
    assert 1 <= len(cold.seconds) < 40
    assert len(warm.seconds) == len(cold.seconds) and sum(warm.seconds) < sum(cold.seconds)

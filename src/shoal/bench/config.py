"""What one ``shoal bench`` run measures: data sizes, repetitions, caps, worker counts.

The full run's settings are the defaults; ``--quick`` (:meth:`Config.make`) is a smoke
check, sized to finish in about 5 minutes on a loaded 2-core machine while still
running every workload against every contender at least once: small data, one warm
pass per kind (its ratios are smoke checks, not medians), short caps, one DataLoader
worker count, one link measurement (:attr:`Config.every_link_path`), the readers'
libraries imported once in the harness (``runner.preload``). Nothing but
``quick`` changes what the full run does."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["QUICK", "Config"]


@dataclass
class Config:
    quick: bool = False
    store: str = "rgw"  # "rgw" | "moto"
    workdir: Path = Path("/var/tmp/shoal-bench")
    small_files: int = 20_000
    mix_files: int = 1_000
    large_size: int = 1 << 30
    procs: int = 4  # N reader processes
    cold_threads: int = 16  # in-flight requests per reader process on cold epochs
    warm_threads: int = 1  # warm reads are CPU-bound: threads would only add GIL traffic
    warm_reps: int = 3
    cold_reps: int = 2
    rate_mbit: float = 2400.0  # ~300 MB/s, the field's per-stream object-store figure
    delay_ms: float = 2.0  # per direction: +4 ms per request round trip
    #: the link check: every path (bare veth, proxy, tbf, tbf + proxy), or only the one
    #: the benchmark reads through (tbf + proxy), and seconds of bulk transfer on each
    every_link_path: bool = True
    link_seconds: float = 3.0
    #: the training loop's JPEGs (10-500 KB, bench/images.py), DataLoader worker counts,
    #: warm epochs per count
    train_images: int = 2_000
    train_workers: tuple[int, ...] = (2, 4, 8)
    train_epochs: int = 2
    train_batch: int = 32
    train_step_ms: float = 10.0
    #: the metadata workload: files stat-ed, and directories of the small set listed
    #: (None: every one)
    meta_stats: int = 2_000
    meta_dirs: int | None = None
    #: single 100 KB reads timed one by one per contender and pass (bench/latency.py)
    latency_reads: int = 2_000
    #: seconds after which a latency pass stops (None: all its reads)
    latency_cap_s: float | None = None
    #: the parquet workload's file (bytes; its row groups: see bench/parquet.py)
    parquet_size: int = 160_000_000
    #: the 100 KB objects the gateway workload reads (None: as many as it takes)
    gateway_keys: int | None = None
    #: the manifest workload's dataset (empty files; the goal is stated for 1M)
    manifest_files: int = 1_000_000
    #: seconds after which a warm pass stops and is rated on what it read (the slowest
    #: peers would otherwise need hours), and the same for a cold pass; a peer whose cold
    #: pass was stopped reads only what it cached in its warm passes (see workloads.py)
    cap_s: float = 20.0
    cold_cap_s: float = 45.0
    #: the scale workload (bench/scale.py): file counts, file sizes (bytes, log-uniform),
    #: reader processes, and the cap on each warm epoch (seconds)
    scale_files: tuple[int, ...] = (100_000, 1_000_000)
    scale_lo: int = 4_096
    scale_hi: int = 16_384
    scale_readers: int = 4
    scale_cap_s: float = 60.0
    contenders: list[str] = field(default_factory=list)  # empty: all available
    workloads: list[str] = field(default_factory=list)  # empty: all

    @classmethod
    def make(cls, quick: bool, **kw: Any) -> Config:
        """The full run's settings, or --quick's (:data:`QUICK`); ``kw`` (the command
        line's explicit flags) overrides either."""
        return cls(**{**QUICK, **kw}) if quick else cls(**kw)


#: --quick. Every pass that a cap stops costs its cap, and on a loaded machine most
#: remote passes are stopped, so the caps set the run's length: a cold pass reads for
#: 2 s, a warm or latency pass for 1 s (a slow peer still reads dozens of files).
#: The data is small enough to upload in seconds, and a warm pass of a cached peer
#: reads all of it. The readers' libraries are imported once before the first pass
#: (runner.preload), not in each reader process.
QUICK: dict[str, Any] = dict(
    quick=True, store="moto", small_files=500, mix_files=40, large_size=16 << 20, procs=2,
    warm_reps=1, cold_reps=1, every_link_path=False, link_seconds=1.0,
    train_images=64, train_workers=(2,), train_batch=16, train_epochs=1,
    meta_stats=10, meta_dirs=1, latency_reads=100, latency_cap_s=1.0, gateway_keys=100,
    manifest_files=10_000, parquet_size=8_000_000, cap_s=1.0, cold_cap_s=2.0,
    scale_files=(10_000, 100_000), scale_cap_s=10.0,
)  # fmt: skip

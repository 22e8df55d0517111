"""The targets the report checks: each a ratio of two rows of the same run, with its
goal (shoal against a peer or the physical limit)."""

from __future__ import annotations

from shoal.bench.gatewayrun import gateway_targets
from shoal.bench.stats import Target


def targets(procs: int, train_workers: tuple[int, ...] = (2, 4, 8)) -> list[Target]:
    cold = f"small-100KB cold p{procs}"
    return [
        Target("warm 100 KB, client >= 0.8x local page cache",
               ("small-100KB warm p1", "shoal-client"), ("small-100KB warm p1", "local-dir"), 0.8),
        Target("warm 100 KB, client >= 1.5x fsspec filecache",
               ("small-100KB warm p1", "shoal-client"), ("small-100KB warm p1", "fsspec-filecache"), 1.5),
        Target("warm 100 KB, FUSE >= 10x rclone VFS",
               ("small-100KB warm p1", "shoal-fuse"), ("small-100KB warm p1", "rclone-vfs"), 10.0),
        Target("cached large file via FUSE >= 0.9x local file",
               ("large seq warm", "shoal-fuse"), ("large seq warm", "local-dir"), 0.9, "mb_per_s"),
        Target("cold small-file epoch >= 0.9x raw parallel GETs (same shaper)",
               (cold, "shoal-client"), (cold, "boto3"), 0.9),
        Target("cold small-file epoch, cat_many >= 0.9x raw parallel GETs",
               (cold, "shoal-cat_many"), (cold, "boto3"), 0.9),
        Target("large warm sequential, client >= 0.5x local page cache",
               ("large seq warm", "shoal-client"), ("large seq warm", "local-dir"), 0.5, "mb_per_s"),
        Target("shoal load of the small files >= 0.9x raw parallel GETs (same shaper)",
               ("small-100KB load", "shoal-load"), (cold, "boto3"), 0.9),
        Target("listing a 1M-file dataset from its manifest in under 5 s",
               ("manifest list-all", "shoal-client"), ("manifest list-all", "goal"), 1.0),
    ] + [
        Target(f"training loop warm, {w} workers: {label} >= 0.98x local files",
               (f"train warm w{w}", c), (f"train warm w{w}", "local-dir"), 0.98)
        for c, label in (("shoal-torch", "ShoalMapDataset"), ("shoal-fuse", "FUSE"))
        for w in train_workers
    ] + gateway_targets(procs)  # fmt: skip

"""Benchmarks of data operations (issue: datasets and data operations):

- ``load``: ``shoal load`` of the small-file set from the shaped store into an empty
  cluster, against raw parallel GETs (boto3 thread pool) at the same concurrency
  through the same shaper, in the same run;
- ``manifest``: a metadata load of a dataset of N files (1M in the full suite) from a
  local directory, then listing every directory and stat-ing files from the manifest
  in a new client (no store and no worker round trips)."""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

from shoal.bench.stats import Sample


def load_job(
    master: str, dataset: str, path: str = "", timeout: float = 3600
) -> tuple[Sample, dict[str, Any]]:
    """Run a load job of a path of the dataset ("" = all of it) and time it to its end."""
    from shoal.client import Client

    with Client(master) as c:
        t0 = time.perf_counter()
        cpu0 = os.times()
        job = c.submit_job({"kind": "load", "dataset": dataset, "paths": [path]})
        deadline = time.monotonic() + timeout
        while True:
            v = c.job(job["id"])
            if v["state"] in ("done", "failed", "stopped") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        secs = time.perf_counter() - t0
        cpu1 = os.times()
    cpu = (cpu1.children_user + cpu1.children_system) - (cpu0.children_user + cpu0.children_system)
    return Sample(secs, v["files_done"] + v["files_skipped"], v["bytes_done"], cpu), v


def make_tree(root: Path, files: int, per_dir: int = 1000) -> None:
    """``files`` empty files in directories of ``per_dir`` (reused across runs)."""
    marker = root.parent / f".{root.name}-made-{files}"  # outside: not a dataset file
    if marker.exists():
        return
    for old in root.parent.glob(f".{root.name}-made-*"):  # the tree is rebuilt: none holds
        old.unlink()
    shutil.rmtree(root, ignore_errors=True)
    for i in range(0, files, per_dir):
        d = root / f"d{i // per_dir:05d}"
        d.mkdir(parents=True)
        for j in range(i, min(files, i + per_dir)):
            os.close(os.open(d / f"f{j:07d}.jpg", os.O_CREAT | os.O_WRONLY, 0o644))
    marker.touch()


def manifest(master: str, root: Path, files: int) -> dict[str, float]:
    """Seconds to build the manifest of ``files`` files and to list it all from a new
    client; stats per second from the manifest."""
    from shoal.client import Client
    from shoal.core.types import Mount

    make_tree(root, files)
    name = f"meta{files}"
    with Client(master) as c:
        if name not in {d.name for d in c.datasets()}:
            c.create_dataset(name, [Mount("data", root.as_uri())])
        t0 = time.perf_counter()
        job = c.submit_job({"kind": "load", "dataset": name, "paths": [""], "metadata_only": True})
        while c.job(job["id"])["state"] not in ("done", "failed", "stopped"):
            time.sleep(0.1)
        build = time.perf_counter() - t0
    dirs = sorted(p.name for p in root.iterdir() if p.is_dir())
    with Client(master) as c:  # a new client: nothing cached
        t0 = time.perf_counter()
        n = 0
        for d in dirs:
            n += len(c.ls(f"/{name}/data/{d}"))
        listing = time.perf_counter() - t0
        sample = random.Random(1).sample(range(files), min(files, 2000))
        t0 = time.perf_counter()
        for j in sample:
            c.stat(f"/{name}/data/d{j // 1000:05d}/f{j:07d}.jpg")
        stat_rate = len(sample) / (time.perf_counter() - t0)
    if n != files:
        raise RuntimeError(f"listed {n} entries, expected {files}")
    return {"files": files, "build_s": build, "list_all_s": listing, "stats_per_s": stat_rate}

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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.bench.runner import proc_cpu
from shoal.bench.stats import Sample

if TYPE_CHECKING:
    from shoal.bench.suite import Suite


def load_job(
    master: str, dataset: str, path: str = "", timeout: float = 3600, pids: Sequence[int] = ()
) -> tuple[Sample, dict[str, Any]]:
    """Run a load job of a path of the dataset ("" = all of it) and time it to its end;
    its CPU is that of ``pids`` (the cluster's master and workers)."""
    from shoal.client import Client

    with Client(master) as c:
        t0 = time.perf_counter()
        cpu0 = proc_cpu(list(pids))
        job = c.submit_job({"kind": "load", "dataset": dataset, "paths": [path]})
        deadline = time.monotonic() + timeout
        while True:
            v = c.job(job["id"])
            if v["state"] in ("done", "failed", "stopped") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        secs = time.perf_counter() - t0
        cpu = proc_cpu(list(pids)) - cpu0
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


def run_suite(suite: Suite) -> None:
    """Data operations: a load job against raw GETs, and listing from a manifest."""
    env, report, say = suite.env, suite.report, suite.say
    assert env is not None
    if suite._want("load"):
        suite.shoal_cold()
        try:
            # the same files the raw-GET reference reads: the 100 KB set only
            pids = list(suite.cluster.pids.values()) if suite.cluster is not None else []
            s, view = load_job(env.master, env.dataset, "data/small", pids=pids)
            report.add("small-100KB load", "shoal-load", s,
                       f"{view['files_done']} loaded, {view['files_failed']} failed")  # fmt: skip
            say(f"  load {'':19} shoal-load {s.files / s.seconds:14,.0f} files/s "
                f"{s.nbytes / s.seconds / 1e6:8,.0f} MB/s {s.seconds:7.2f}s")  # fmt: skip
        except Exception as exc:
            report.add("small-100KB load", "shoal-load", None, f"failed: {exc}"[:200])
    if suite._want("manifest"):
        files = suite.cfg.manifest_files
        try:
            m = manifest(env.master, suite.cfg.workdir / "meta-tree", files)
        except Exception as exc:
            report.add("manifest list-all", "shoal-client", None, f"failed: {exc}"[:200])
            return
        scale = 1_000_000 / files  # the goal is stated for 1M files
        report.add("manifest list-all", "shoal-client", Sample(m["list_all_s"], files, 0),
                   f"{files:,} files: manifest built in {m['build_s']:.1f}s, listed in "
                   f"{m['list_all_s']:.2f}s; {m['stats_per_s']:,.0f} stat/s")  # fmt: skip
        report.add("manifest list-all", "goal", Sample(5.0 / scale, files, 0), "1M files in 5 s")
        say(f"  manifest {files:,} files: built {m['build_s']:.1f}s, all listed "
            f"{m['list_all_s']:.2f}s, {m['stats_per_s']:,.0f} stat/s")  # fmt: skip

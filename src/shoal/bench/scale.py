"""Workload ``scale``: what the number of files costs. For each N (100k and 1M by
default), a dataset of N files of 4-16 KB (log-uniform) in a local directory behind a
``file://`` mount, one fresh one-worker cluster, and:

- the metadata load (the manifest build), files/s;
- a ``shoal load`` of every file, files/s and MB/s, CPU of the master and worker;
- a warm epoch of 4 reader processes through the Python client, against the same
  epoch over the local files (same run: the ratio is the row's meaning);
- the worker's and the master's RSS after the load and after the epoch, the index's
  bytes per cached file (SQLite, read after the cluster stopped and checkpointed), the
  manifest's bytes per file;
- the growth from the smallest N to the largest: each per-file cost at the large N
  over the same at the small one (1.0: linear; below: better than linear).

Files are 4-16 KB, not up to 100 KB: 1M x 50 KB would need 50 GB, twice (the tree and
the cache). The tree is kept across runs (a marker names its N and sizes); the cluster
and its cache are removed after each N, so the disk holds the trees plus one cache."""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.bench import runner
from shoal.bench.contender import BenchEnv
from shoal.bench.jobs import load_job
from shoal.bench.stats import Sample

if TYPE_CHECKING:
    from shoal.bench.suite import Suite

PER_DIR = 1000


@dataclass(frozen=True)
class TreeSpec:
    files: int
    lo: int = 4_096
    hi: int = 16_384
    seed: int = 0

    def sizes(self) -> list[int]:
        """Each file's size, log-uniform in [lo, hi]."""
        rng = random.Random(self.seed)
        ratio = self.hi / self.lo
        return [int(self.lo * ratio ** rng.random()) for _ in range(self.files)]

    def key(self, i: int) -> str:
        return f"d{i // PER_DIR:05d}/f{i:07d}.bin"

    def keys(self) -> list[str]:
        return [self.key(i) for i in range(self.files)]

    @property
    def tag(self) -> str:
        return f"{self.files}-{self.lo}-{self.hi}-{self.seed}"


def make_tree(root: Path, spec: TreeSpec) -> int:
    """Write the files (kept across runs: a marker beside the tree); their bytes."""
    sizes = spec.sizes()
    marker = root.parent / f".{root.name}-made-{spec.tag}"
    if marker.exists():
        return sum(sizes)
    for old in root.parent.glob(f".{root.name}-made-*"):
        old.unlink()
    shutil.rmtree(root, ignore_errors=True)
    blob = random.Random(99).randbytes(1 << 20)
    flags = os.O_CREAT | os.O_WRONLY | os.O_TRUNC
    for i, size in enumerate(sizes):
        if i % PER_DIR == 0:
            (root / f"d{i // PER_DIR:05d}").mkdir(parents=True, exist_ok=True)
        off = (i * 7919) % (len(blob) - size)  # distinct bytes per file, no randomness to pay
        fd = os.open(root / spec.key(i), flags, 0o644)
        try:
            os.write(fd, blob[off : off + size])
        finally:
            os.close(fd)
    marker.touch()
    return sum(sizes)


def rss(pid: int) -> int:
    """Resident bytes of a process (0 once it is gone)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def growth(small: float, large: float) -> float | None:
    """large / small for a per-file cost: 1.0 linear, < 1 better, > 1 worse."""
    return None if small <= 0 else large / small


def verdict(g: float | None, slack: float = 0.15) -> str:
    if g is None:
        return "-"
    return "linear or better" if g <= 1 + slack else f"worse than linear ({g:.2f}x per file)"


def _bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.exists())


def one(suite: Suite, n: int) -> dict[str, Any]:
    """Every measurement at one N; the rows go into the report as it goes."""
    from shoal.bench.contenders import REGISTRY
    from shoal.cli.local import LocalCluster
    from shoal.client import Client
    from shoal.core.types import Mount

    cfg, say = suite.cfg, suite.say
    spec = TreeSpec(n, cfg.scale_lo, cfg.scale_hi)
    root = cfg.workdir / f"scale-tree-{n}"
    t0 = time.perf_counter()
    total = make_tree(root, spec)
    say(f"  scale {n:,}: tree of {total / 1e9:.2f} GB ready in {time.perf_counter() - t0:.0f}s")
    d = cfg.workdir / "scale-cluster"
    shutil.rmtree(d, ignore_errors=True)
    disk = f"{math.ceil(total * 1.5 / 2**30) + 2}GiB"
    c = LocalCluster(d, workers=1, disk=disk, file_roots=(str(cfg.workdir),))
    c.start()
    out: dict[str, Any] = {"files": n, "bytes": total, "lo": spec.lo, "hi": spec.hi}
    name = f"scale{n}"
    wl = f"scale {n // 1000:,}k"
    pids = list(c.pids.values())
    worker = next(p for k, p in c.pids.items() if k.startswith("worker"))
    try:
        with Client(c.master_url) as cl:
            cl.create_dataset(name, [Mount("data", root.as_uri())])
            t1, cpu0 = time.perf_counter(), runner.proc_cpu(pids)
            job = cl.submit_job(
                {"kind": "load", "dataset": name, "paths": [""], "metadata_only": True}
            )
            while cl.job(job["id"])["state"] not in ("done", "failed", "stopped"):
                time.sleep(0.1)
            out["build_s"] = time.perf_counter() - t1
            out["build_cpu_s"] = runner.proc_cpu(pids) - cpu0
        suite.report.add(f"{wl} manifest build", "shoal-load",
                         Sample(out["build_s"], n, 0, out["build_cpu_s"]))  # fmt: skip
        mf = list((d / "master").rglob(f"{name}*.msgpack"))
        out["manifest_bytes"] = _bytes(mf)
        s, view = load_job(c.master_url, name, "data", pids=pids)
        suite.report.add(f"{wl} load", "shoal-load", s,
                         f"{view['files_done']:,} loaded, {view['files_failed']} failed")  # fmt: skip
        out.update(load_files_per_s=s.files / s.seconds, load_mb_per_s=s.nbytes / s.seconds / 1e6,
                   load_cpu_s=s.cpu_s, cached_files=int(view["files_done"]),
                   worker_rss_load=rss(worker), master_rss_load=rss(c.pids["master"]))  # fmt: skip
        say(f"  {wl} load: {s.files / s.seconds:,.0f} files/s, build {out['build_s']:.1f}s")
        env = BenchEnv(cfg.workdir, "", "", root, c.master_url, name)
        env.extra["cluster"] = c
        keys = spec.keys()
        for cname in ("local-dir", "shoal-client"):
            contender = REGISTRY[cname](env)
            s = runner.epoch(contender, keys, cfg.scale_readers, 1, 5, cap_s=cfg.scale_cap_s)
            suite.report.add(f"{wl} warm p{cfg.scale_readers}", cname, s,
                             "capped" if s.read is not None else "")  # fmt: skip
            out[f"epoch_{cname}"] = s.files / s.seconds
            say(f"  {wl} warm p{cfg.scale_readers} {cname:14} {s.files / s.seconds:,.0f} files/s")
        out["epoch_ratio"] = out["epoch_shoal-client"] / out["epoch_local-dir"]
        out.update(worker_rss_epoch=rss(worker), master_rss_epoch=rss(c.pids["master"]))
    finally:
        with contextlib.suppress(Exception):
            c.stop()  # the worker closes its index: the WAL checkpointed into the file
        idx = list(d.rglob("index.sqlite*"))
        out["index_bytes"] = _bytes(idx)
        shutil.rmtree(d, ignore_errors=True)
    cached = max(1, out.get("cached_files", 0))
    out["index_bytes_per_file"] = out["index_bytes"] / cached
    out["manifest_bytes_per_file"] = out.get("manifest_bytes", 0) / n
    return out


def run(suite: Suite) -> None:
    results: list[dict[str, Any]] = []
    suite.report.extra["scale"] = results
    for n in suite.cfg.scale_files:
        try:
            results.append(one(suite, n))
        except Exception as exc:
            msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            suite.report.add(f"scale {n // 1000:,}k load", "shoal-load", None, f"failed: {msg}")
            suite.say(f"  scale {n:,}: FAILED: {msg}")


#: (label, key, per file?, unit scale, digits): the rows of the report's scale table
ROWS = (
    ("manifest build, s per 1M files", "build_s", True, 1e6, 1),
    ("manifest build, CPU s per 1M files (master + worker)", "build_cpu_s", True, 1e6, 1),
    ("load, files/s", "load_files_per_s", False, 1, 0),
    ("load, CPU s per 1M files (master + worker)", "load_cpu_s", True, 1e6, 1),
    ("warm epoch p4, shoal files/s", "epoch_shoal-client", False, 1, 0),
    ("warm epoch p4, local files/s", "epoch_local-dir", False, 1, 0),
    ("warm epoch p4, shoal / local files (same run)", "epoch_ratio", False, 1, 2),
    ("worker RSS after the load, MB", "worker_rss_load", False, 1e-6, 0),
    ("worker RSS after the epoch, MB", "worker_rss_epoch", False, 1e-6, 0),
    ("master RSS after the epoch, MB", "master_rss_epoch", False, 1e-6, 0),
    ("index bytes per cached file", "index_bytes_per_file", False, 1, 0),
    ("manifest bytes per file", "manifest_bytes_per_file", False, 1, 0),
)


def _per_file(r: dict[str, Any], key: str, per_file: bool) -> float:
    v = float(r.get(key, 0.0))
    return v / r["files"] if per_file else v


def markdown(results: list[dict[str, Any]]) -> list[str]:
    """The report's scale section: one column per N, then the growth per file."""
    if not results:
        return []
    first, last = results[0], results[-1]
    r0 = first
    lines = [
        "## Scale: what the number of files costs", "",
        f"Files of {r0['lo'] / 1024:g}-{r0['hi'] / 1024:g} KB (log-uniform) in a local "
        "directory behind a file:// mount, one fresh one-worker cluster per N. Growth: the "
        "per-file cost (time, CPU, bytes) at the largest N over the same at the smallest "
        "(1.0 = linear, < 1 better); for rates, the rate at the largest N over the smallest "
        "(>= 1: no slower per file). Worker RSS growth: the extra RSS per extra file.", "",
        "| measure | " + " | ".join(f"{r['files']:,} files" for r in results) + " | growth |",
        "|---|" + "---:|" * (len(results) + 1),
    ]  # fmt: skip
    for label, key, per_file, unit, nd in ROWS:
        cells = [f"{_per_file(r, key, per_file) * unit:,.{nd}f}" for r in results]
        a, b = _per_file(first, key, per_file), _per_file(last, key, per_file)
        g = growth(a, b) if len(results) > 1 else None
        note = "-" if g is None else f"{g:.2f}"
        if key.startswith("worker_rss") and len(results) > 1 and last["files"] > first["files"]:
            extra = (last.get(key, 0) - first.get(key, 0)) / (last["files"] - first["files"])
            note = f"{extra:,.0f} B per extra file"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {note} |")
    if len(results) > 1:
        g = growth(_per_file(first, "build_s", True), _per_file(last, "build_s", True))
        lines += ["", f"Manifest build: {verdict(g)}; load CPU per file: "
                  f"{verdict(growth(_per_file(first, 'load_cpu_s', True), _per_file(last, 'load_cpu_s', True)))}."]  # fmt: skip
    return [*lines, ""]

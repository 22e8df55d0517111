"""Helpers of the standing reliability suite (issue 10): figures each probe records,
reader processes that check every byte, seeding, polling, process probes.

Each probe records what it tried (``figures.record(...)``). With
``SHOAL_RELIABILITY_OUT=DIR`` in the environment the figures are written as one JSON
file per test under DIR; ``python tests/reliability/report.py DIR`` turns them into the
table of RELIABILITY.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from shoal.testing.cluster import TestCluster
from shoal.testing.s3 import MotoServer, make_bucket

ENV_OUT = "SHOAL_RELIABILITY_OUT"
READER = Path(__file__).with_name("_reader.py")


def digest(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


@dataclass
class Figures:
    """What one test tried: rows of (probe, count, what must hold, failures)."""

    test: str
    module: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def record(self, probe: str, count: int, holds: str, failed: int, **extra: Any) -> None:
        self.rows.append(
            {"probe": probe, "count": count, "holds": holds, "failed": failed, **extra}
        )

    def write(self, outcome: str, reason: str = "") -> None:
        out = os.environ.get(ENV_OUT)
        if not out:
            return
        Path(out).mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.test)
        body = {
            "test": self.test,
            "module": self.module,
            "outcome": outcome,
            "reason": reason,
            "seconds": round(time.monotonic() - self.started, 1),
            "rows": self.rows,
        }
        (Path(out) / f"{name}.json").write_text(json.dumps(body, indent=1))


@dataclass
class Dataset:
    """A seeded bucket and its dataset: ``want`` maps client path -> digest."""

    name: str
    bucket: str
    files: dict[str, bytes]

    @property
    def want(self) -> dict[str, str]:
        return {self.path(k): digest(v) for k, v in self.files.items()}

    def path(self, key: str) -> str:
        return f"/{self.name}/data/{key}"


def seed(
    moto: MotoServer,
    cluster: TestCluster,
    bucket: str,
    files: dict[str, bytes],
    *,
    endpoint: str | None = None,
    name: str = "ds",
    options: dict[str, str] | None = None,
) -> Dataset:
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, endpoint or moto.endpoint, options, name)
    return Dataset(name, bucket, files)


def wait_for(ok: Callable[[], bool], timeout: float, what: str, every: float = 0.05) -> None:
    """Poll ``ok`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


class Readers:
    """Reader processes (tests/reliability/_reader.py) that read a path list over and
    over, checking each read's digest, until ``stop()``; each reports its counts."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.stop_file = tmp / "readers.stop"

    def start(
        self,
        master: str,
        want: dict[str, str] | dict[str, list[str]],
        n: int,
        *,
        settings: dict[str, Any] | None = None,
        rounds: int = 0,
        log_errors: bool = False,
    ) -> None:
        spec = self.tmp / f"readers-{len(self.procs)}.json"
        spec.write_text(
            json.dumps(
                {
                    "master": master,
                    "want": want,
                    "settings": settings or {},
                    "stop": str(self.stop_file),
                    "rounds": rounds,
                    "log_errors": log_errors,
                }
            )
        )
        for _ in range(n):
            out = self.tmp / f"reader-{len(self.procs)}.out.json"
            proc = subprocess.Popen(
                [sys.executable, str(READER), str(spec), str(out), str(len(self.procs))],
                stdin=subprocess.DEVNULL,
            )
            self.procs.append((proc, out))

    def wait_reads(self, n: int, timeout: float) -> None:
        """Until every reader has done at least ``n`` reads (their progress files)."""

        def done() -> bool:
            for proc, out in self.procs:
                p = out.with_suffix(".progress")
                if proc.poll() is not None:
                    continue
                try:
                    if int(p.read_text() or 0) < n:
                        return False
                except (FileNotFoundError, ValueError):
                    return False
            return True

        wait_for(done, timeout, f"{n} reads by each reader")

    def stop(self, timeout: float = 60.0) -> dict[str, Any]:
        """Stop every reader and sum their counts."""
        self.stop_file.write_text("stop")
        total: dict[str, Any] = {"reads": 0, "wrong": 0, "failed": 0, "errors": []}
        deadline = time.monotonic() + timeout
        for proc, out in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                total["errors"].append(f"reader {proc.pid} did not stop within {timeout}s")
                total["failed"] += 1
                continue
            if not out.exists():
                total["errors"].append(f"reader {proc.pid} exited {proc.returncode}, no counts")
                total["failed"] += 1
                continue
            r = json.loads(out.read_text())
            for k in ("reads", "wrong", "failed"):
                total[k] += r[k]
            total["errors"] += r["errors"][:5]
            for k, v in r.items():
                if k.startswith("max_"):
                    total[k] = max(total.get(k, 0.0), v)
        self.procs.clear()
        self.stop_file.unlink(missing_ok=True)
        return total

    def progress(self) -> int:
        """Reads done so far by every running reader together."""
        n = 0
        for _, out in self.procs:
            try:
                n += int(out.with_suffix(".progress").read_text() or 0)
            except (FileNotFoundError, ValueError):
                pass
        return n

    def wait_more(self, n: int, timeout: float) -> None:
        """Until the readers together did ``n`` more reads than now."""
        target = self.progress() + n
        wait_for(lambda: self.progress() >= target, timeout, f"{n} more reads")

    def _each(self) -> list[int]:
        out = []
        for _, o in self.procs:
            try:
                out.append(int(o.with_suffix(".progress").read_text() or 0))
            except (FileNotFoundError, ValueError):
                out.append(0)
        return out

    def wait_each_more(self, n: int, timeout: float) -> None:
        """Until every running reader did ``n`` more reads than now."""
        start = self._each()

        def done() -> bool:
            now = self._each()
            return all(
                b - a >= n or proc.poll() is not None
                for a, b, (proc, _) in zip(start, now, self.procs, strict=True)
            )

        wait_for(done, timeout, f"{n} more reads by each reader")

    def kill(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.procs.clear()


def load(cluster: TestCluster, dataset: str = "ds", timeout: float = 120.0) -> dict[str, Any]:
    """Run a load job of the whole dataset and wait until it is done."""
    with cluster.client() as c:
        job = c.submit_job({"kind": "load", "dataset": dataset, "paths": [""]})
        state: dict[str, Any] = {}

        def finished() -> bool:
            state.update(c.job(job["id"]))
            return state["state"] not in ("pending", "listing", "running")

        wait_for(finished, timeout, f"load job {job['id']}", every=0.1)
    return state


def worker_info(cluster: TestCluster, i: int) -> dict[str, Any]:
    """The worker's own address file: id, host, port, uds, metrics_port."""
    info: dict[str, Any] = json.loads((cluster.worker_dir(i) / "worker.json").read_text())
    return info


def worker_pid(cluster: TestCluster, i: int) -> int:
    return cluster.pids[f"worker-{i}"]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def ring_size(cluster: TestCluster) -> int:
    """Workers in the master's ring now (-1 if the master does not answer)."""
    import urllib.request

    try:
        with urllib.request.urlopen(cluster.master_url + "/api/v1/ring", timeout=2) as r:
            return len(json.loads(r.read())["workers"])
    except OSError:
        return -1


def integration_module(name: str) -> Any:
    """A module of tests/integration (its helpers and tables, reused here rather than
    copied): the directory is appended to sys.path, so a module pytest already imported
    under that name (rootdir-relative basename, no __init__.py) is the same object."""
    import importlib

    where = str(Path(__file__).resolve().parents[1] / "integration")
    if where not in sys.path:
        sys.path.append(where)
    return importlib.import_module(name)

"""Profile shoal's warm read path with py-spy: where does a warm Client.read spend time?

    .venv/bin/python bench/profile_warm.py [--files 2000] [--size 100000] [--large-mib 0]
        [--seconds 15] [--out /tmp/shoal-prof]

Starts moto on 127.0.0.1 and a one-worker cluster, reads every file once (cold), then
records the warm loop (shuffled Client.read of whole files, or 1 MiB sequential reads
of one large file with --large-mib) under ``py-spy record --format raw``, and prints the
functions with the most samples on top of the stack (self) and anywhere in it (total).
Writes <out>/warm.collapsed (flame-graph input) and <out>/warm.svg.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shoal.cli.local import LocalCluster
from shoal.client import Client
from shoal.core.types import Mount
from shoal.testing.cluster import S3_ENV
from shoal.testing.s3 import MotoServer, make_bucket


def summarize(collapsed: Path, top: int = 25) -> str:
    self_c: collections.Counter[str] = collections.Counter()
    total_c: collections.Counter[str] = collections.Counter()
    n = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        n += k
        frames = stack.split(";")
        self_c[frames[-1]] += k
        for f in set(frames):
            total_c[f] += k
    out = [f"{n} samples", "", "self%  function (file:line)"]
    out += [f"{100 * c / n:5.1f}  {f}" for f, c in self_c.most_common(top)]
    out += ["", "total% function (file:line)"]
    out += [f"{100 * c / n:5.1f}  {f}" for f, c in total_c.most_common(top)]
    return "\n".join(out)


def warm_loop(master: str, paths: list[str], seconds: float, chunk: int, size: int) -> None:
    c = Client(master)
    end = time.monotonic() + seconds
    n = 0
    t0 = time.perf_counter()
    while time.monotonic() < end:
        if chunk:
            for off in range(0, size, chunk):
                n += len(c.read(paths[0], off, chunk))
        else:
            random.shuffle(paths)
            for p in paths:
                n += len(c.read(p))
    secs = time.perf_counter() - t0
    print(f"warm: {n / secs / 1e6:,.0f} MB/s over {secs:.1f}s", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--large-mib", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--out", type=Path, default=Path("/tmp/shoal-prof"))
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        master, listfile, chunk, size = a.child
        paths = Path(listfile).read_text().split()
        warm_loop(master, paths, a.seconds, int(chunk), int(size))
        return
    os.environ.update(S3_ENV)
    a.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="shoal-prof-"))
    rng = random.Random(0)
    if a.large_mib:
        files = {"large/blob.bin": rng.randbytes(a.large_mib << 20)}
    else:
        files = {f"{i // 100:03d}/f{i:06d}.bin": rng.randbytes(a.size) for i in range(a.files)}
    with MotoServer() as moto:
        make_bucket(moto.endpoint, "prof", files)
        cluster = LocalCluster(tmp / "c", workers=1, mem="1GiB", disk="8GiB", env=dict(S3_ENV))
        try:
            cluster.start()
            with Client(cluster.master_url) as c:
                c.create_dataset("p", [Mount("data", "s3://prof", {"endpoint_url": moto.endpoint})])
                paths = [f"/p/data/{k}" for k in files]
                for p in paths:  # cold: fill the cache
                    c.read(p)
            listfile = tmp / "paths.txt"
            listfile.write_text("\n".join(paths))
            chunk = (1 << 20) if a.large_mib else 0
            size = a.large_mib << 20
            raw = a.out / "warm.collapsed"
            cmd = [
                shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy"),
                "record", "--format", "raw", "-o", str(raw), "--rate", "250", "--",
                sys.executable, __file__, "--seconds", str(a.seconds),
                "--child", cluster.master_url, str(listfile), str(chunk), str(size),
            ]  # fmt: skip
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            svg = [cmd[0], "record", "-o", str(a.out / "warm.svg"), "--rate", "250", "--"]
            subprocess.run(
                svg + cmd[cmd.index("--") + 1 :], check=False, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            report = summarize(raw)
            (a.out / "warm.top.txt").write_text(report)
            print(report)
        finally:
            cluster.stop()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

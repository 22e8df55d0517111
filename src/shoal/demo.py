"""``make demo``: the main job on an embedded default.

Generates an image-like dataset (20,000 files of 10-200 KB by default), serves it
from a local S3 endpoint (moto's server) that it starts itself, runs ``shoal up``,
creates the dataset, reads it twice as training epochs would (shuffled, several
processes), prints files/s and MB/s for the cold and the warm epoch and the hit ratio,
and stops everything it started.

Knobs (environment): SHOAL_DEMO_FILES, SHOAL_DEMO_PROCS, SHOAL_DEMO_WORKERS.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shoal.testing.cluster import S3_ENV
from shoal.testing.s3 import MotoServer, make_bucket, s3_client

BUCKET = "demo-images"


def _sizes(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    # log-uniform 10-200 KB: many small thumbnails, some large frames
    return [int(10_000 * (20 ** rng.random())) for _ in range(n)]


def _upload(endpoint: str, n: int) -> int:
    make_bucket(endpoint, BUCKET)
    s3 = s3_client(endpoint)
    sizes = _sizes(n)
    rng = random.Random(1)
    blob = rng.randbytes(max(sizes) + 4096)

    def put(i: int) -> int:
        off = (i * 4099) % 4096
        body = blob[off : off + sizes[i]]
        s3.put_object(Bucket=BUCKET, Key=f"train/{i // 1000:03d}/img{i:06d}.jpg", Body=body)
        return len(body)

    with ThreadPoolExecutor(16) as pool:
        return sum(pool.map(put, range(n)))


def _shoal(*args: str, env: dict[str, str]) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "shoal", *args], env=env, capture_output=True, text=True
    )
    if r.returncode != 0:
        raise SystemExit(f"shoal {' '.join(args[:2])} failed: {r.stderr.strip()}")
    return r.stdout


def _reader(master: str, paths: list[str], out: mp.Queue) -> None:
    from shoal.client import Client

    n = 0
    with Client(master) as c:
        for p in paths:
            n += len(c.read(p))
        c.flush()
    out.put(n)


def _epoch(master: str, paths: list[str], procs: int, seed: int) -> tuple[float, int]:
    order = paths[:]
    random.Random(seed).shuffle(order)
    shards = [order[i::procs] for i in range(procs)]
    ctx = mp.get_context("fork")
    q: mp.Queue = ctx.Queue()
    t0 = time.perf_counter()
    ps = [ctx.Process(target=_reader, args=(master, s, q)) for s in shards]
    for p in ps:
        p.start()
    total = sum(q.get() for _ in ps)
    for p in ps:
        p.join()
    return time.perf_counter() - t0, total


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    n = int(os.environ.get("SHOAL_DEMO_FILES", "20000"))
    procs = int(os.environ.get("SHOAL_DEMO_PROCS", "4"))
    workers = os.environ.get("SHOAL_DEMO_WORKERS", "2")
    console = Console()
    env = dict(os.environ)
    env.update(S3_ENV)
    os.environ.update(S3_ENV)
    with tempfile.TemporaryDirectory(prefix="shoal-demo-") as tmp, MotoServer() as moto:
        console.print(f"[bold]shoal demo[/]: S3 endpoint (moto) at {moto.endpoint}")
        t0 = time.perf_counter()
        total = _upload(moto.endpoint, n)
        console.print(
            f"uploaded {n} files, {total / 1e6:.0f} MB in {time.perf_counter() - t0:.1f}s"
        )
        cdir = Path(tmp) / "cluster"
        up = json.loads(_shoal("up", "--workers", workers, "--dir", str(cdir), "--json", env=env))
        master = up["master"]
        env["SHOAL_MASTER"] = master
        console.print(f"cluster up: master {master}, {workers} workers")
        try:
            _shoal(
                "dataset",
                "create",
                "demo",
                "--mount",
                f"train=s3://{BUCKET}/train",
                "--mount-option",
                f"endpoint_url={moto.endpoint}",
                env=env,
            )
            paths = [f"/demo/train/{i // 1000:03d}/img{i:06d}.jpg" for i in range(n)]
            rows = []
            for name, seed in (("cold", 1), ("warm", 2)):
                secs, nbytes = _epoch(master, paths, procs, seed)
                rows.append((name, secs, nbytes))
                console.print(
                    f"epoch {name}: {n / secs:,.0f} files/s, {nbytes / secs / 1e6:,.0f} MB/s"
                )
            time.sleep(2.5)  # one heartbeat, so the report has the epoch's counters
            report = json.loads(_shoal("report", "--json", env=env))
            ds = next(d for d in report["datasets"] if d["name"] == "demo")
            t = Table(title=f"{n} files, {total / 1e6:.0f} MB, {procs} reader processes")
            for col in ("epoch", "seconds", "files/s", "MB/s"):
                t.add_column(col, justify="right")
            for name, secs, nbytes in rows:
                t.add_row(name, f"{secs:.2f}", f"{n / secs:,.0f}", f"{nbytes / secs / 1e6:,.0f}")
            console.print(t)
            console.print(
                f"cached {ds['cached_files']} files, {ds['cached_bytes'] / 1e6:.0f} MB; "
                f"hits {ds['hits']}, misses {ds['misses']}, hit ratio {ds['hit_ratio']:.1%}"
            )
        finally:
            _shoal("down", "--dir", str(cdir), env=env)
            console.print("cluster down; S3 endpoint stopped")


if __name__ == "__main__":
    main()

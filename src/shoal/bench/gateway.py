"""The ``gateway`` workload: S3 GETs through shoal's S3 gateway against the same
client reading the store directly, and against the Python client.

- small: 100 KB objects with boto3 at 16 requests in flight, through the gateway
  (cold: the first pass, then warm) and straight to the store (every pass cold);
- large: one large object, a boto3 GET through the gateway (warm) against
  ``Client.read`` of the same file in the Python client (warm).

Targets (issue 15): warm small >= 3x direct; warm large >= 0.7x the Python client;
cold small >= 0.9x direct.

The functions take endpoints and keys, so the suite can run them against its shaped
store. ``python -m shoal.bench.gateway`` runs them on its own: moto, a local cluster
and a gateway on this machine with no shaper (the store is then local too, which
flatters "direct").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shoal.bench.stats import Sample

INFLIGHT = 16
KEY_ID, SECRET = "AKIDBENCH", "bench-secret-0123456789abcdef"


def s3(endpoint: str, key: str, secret: str, inflight: int = INFLIGHT) -> Any:
    import boto3
    from botocore.config import Config

    cfg = Config(
        s3={"addressing_style": "path"},
        max_pool_connections=inflight,
        retries={"max_attempts": 2},
    )
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=cfg,
    )


def get_many(client: Any, bucket: str, keys: list[str], inflight: int = INFLIGHT) -> Sample:
    """Every key once with ``inflight`` GETs at a time (one shared boto3 client)."""

    def one(key: str) -> int:
        return len(client.get_object(Bucket=bucket, Key=key)["Body"].read())

    t0, cpu0 = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(inflight) as pool:
        nbytes = sum(pool.map(one, keys))
    return Sample(time.perf_counter() - t0, len(keys), nbytes, time.process_time() - cpu0)


def get_large(client: Any, bucket: str, key: str) -> Sample:
    t0, cpu0 = time.perf_counter(), time.process_time()
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    n = 0
    while chunk := body.read(8 << 20):
        n += len(chunk)
    return Sample(time.perf_counter() - t0, 1, n, time.process_time() - cpu0)


def client_large(master: str, path: str) -> Sample:
    from shoal.client import Client

    with Client(master) as c:
        size = c.stat(path).size
        c.read(path, 0, 1)  # the dataset and ring, not the bytes
        t0, cpu0 = time.perf_counter(), time.process_time()
        n, off = 0, 0
        while off < size:
            n += len(c.read(path, off, min(64 << 20, size - off)))
            off += 64 << 20
        return Sample(time.perf_counter() - t0, 1, n, time.process_time() - cpu0)


def credentials_file(path: Path, datasets: str = "*") -> Path:
    path.write_text(
        f'[users.bench]\nrole = "write"\ndatasets = "{datasets}"\n'
        f'keys = [{{ access_key = "{KEY_ID}", secret = "{SECRET}" }}]\n'
    )
    path.chmod(0o600)
    return path


def start_gateway(
    master: str, creds: Path, log: Path, writable: tuple[str, ...] = ()
) -> tuple[str, subprocess.Popen[str]]:
    cmd = [sys.executable, "-m", "shoal", "gateway", "s3", "--master", master, "--port", "0"]
    cmd += ["--credentials", str(creds)]
    for ds in writable:
        cmd += ["--writable", ds]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)  # noqa: SIM115
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the gateway did not start: {log.read_text()[-1000:]}")
    return line.split()[-1], proc


def put_many(client: Any, bucket: str, prefix: str, n: int, size: int) -> Sample:
    """``n`` PUTs of ``size`` bytes one after another: the latency of a write."""
    body = os.urandom(size)
    t0, cpu0 = time.perf_counter(), time.process_time()
    for i in range(n):
        client.put_object(Bucket=bucket, Key=f"{prefix}{i:04d}.bin", Body=body)
    return Sample(time.perf_counter() - t0, n, n * size, time.process_time() - cpu0)


def proc_cpu(pid: int) -> float:
    """CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rates(s: Sample) -> dict[str, float]:
    return {
        "seconds": round(s.seconds, 3),
        "files_per_s": round(s.files / s.seconds, 1),
        "MB_per_s": round(s.nbytes / s.seconds / 1e6, 1),
        "cpu_s": round(s.cpu_s, 2),
    }


def run(
    master: str,
    gateway: str,
    store: str,
    store_key: tuple[str, str],
    bucket: str,
    small: list[str],
    large: str,
    gateway_pid: int | None = None,
) -> dict[str, Any]:
    """Every measurement of the workload; keys are bucket keys of the dataset named
    ``bucket`` (mount ``data``), the same objects in the store's bucket."""
    gw = s3(gateway, KEY_ID, SECRET)
    direct = s3(store, *store_key)
    out: dict[str, Any] = {}
    store_keys = [k.partition("/")[2] for k in small]
    out["small direct"] = rates(get_many(direct, bucket, store_keys))
    out["small gateway cold"] = rates(get_many(gw, bucket, small))
    get_many(gw, bucket, small)
    cpu0 = proc_cpu(gateway_pid) if gateway_pid else 0.0
    out["small gateway warm"] = rates(get_many(gw, bucket, small))
    if gateway_pid:
        per = (proc_cpu(gateway_pid) - cpu0) / len(small)
        out["small gateway warm"]["gateway_cpu_ms_per_get"] = round(per * 1000, 3)
    out["small direct again"] = rates(get_many(direct, bucket, store_keys))
    out["large direct"] = rates(get_large(direct, bucket, large.partition("/")[2]))
    out["large gateway cold"] = rates(get_large(gw, bucket, large))
    out["large gateway warm"] = rates(get_large(gw, bucket, large))
    out["large python client warm"] = rates(client_large(master, f"/{bucket}/{large}"))
    out["large gateway warm again"] = rates(get_large(gw, bucket, large))
    out["put 1MiB direct"] = rates(put_many(direct, bucket, "puts/direct-", 10, 1 << 20))
    out["put 1MiB gateway"] = rates(put_many(gw, bucket, "data/puts/gw-", 10, 1 << 20))
    for k in ("put 1MiB direct", "put 1MiB gateway"):
        out[k]["ms_per_put"] = round(out[k]["seconds"] / 10 * 1000, 1)
    d = min(out["small direct"]["files_per_s"], out["small direct again"]["files_per_s"])
    out["ratios"] = {
        "small warm / direct (>= 3)": round(out["small gateway warm"]["files_per_s"] / d, 2),
        "small cold / direct (>= 0.9)": round(out["small gateway cold"]["files_per_s"] / d, 2),
        "large warm / python client (>= 0.7)": round(
            out["large gateway warm again"]["MB_per_s"]
            / out["large python client warm"]["MB_per_s"],
            2,
        ),
    }
    return out


def main(argv: list[str] | None = None) -> None:
    from shoal.core.types import Mount
    from shoal.testing.cluster import S3_ENV, start_cluster
    from shoal.testing.s3 import CREDENTIALS, MotoServer, make_bucket, s3_client

    ap = argparse.ArgumentParser(prog="python -m shoal.bench.gateway")
    ap.add_argument("--small", type=int, default=500, help="100 KB objects (500)")
    ap.add_argument("--large-mib", type=int, default=128, help="size of the large object (128)")
    ap.add_argument(
        "--no-manifest", dest="manifest", action="store_false",
        help="skip the metadata load (cold reads then stat each file at a worker)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    os.environ.update(S3_ENV)
    work = Path(tempfile.mkdtemp(prefix="shoal-bench-gw-"))
    bucket = "gwbench"
    with MotoServer() as moto:
        make_bucket(moto.endpoint, bucket)
        put = s3_client(moto.endpoint)
        small = [f"small/{i // 100:03d}/f{i:06d}.bin" for i in range(args.small)]
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda k: put.put_object(Bucket=bucket, Key=k, Body=os.urandom(100_000)), small
                )
            )
        put.put_object(Bucket=bucket, Key="large.bin", Body=os.urandom(args.large_mib << 20))
        cluster = start_cluster(work / "cluster", workers=2)
        proc = None
        try:
            with cluster.client() as c:
                # moto answers a large object's ranges slowly: give it time
                opts = {"endpoint_url": moto.endpoint, "read_timeout": "60", "deadline": "300"}
                c.create_dataset(bucket, [Mount("data", f"s3://{bucket}", opts)])
                if args.manifest:
                    view = c.submit_job({"kind": "load", "dataset": bucket, "metadata_only": True})
                    while view["state"] not in ("done", "failed", "stopped"):
                        time.sleep(0.1)  # the master has no event for one job
                        view = c.job(view["id"])
            creds = credentials_file(work / "c.toml")
            url, proc = start_gateway(cluster.master_url, creds, work / "gw.log", (bucket,))
            key = (CREDENTIALS["aws_access_key_id"], CREDENTIALS["aws_secret_access_key"])
            res = run(cluster.master_url, url, moto.endpoint, key, bucket,
                      [f"data/{k}" for k in small], "data/large.bin", proc.pid)  # fmt: skip
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(10)
            cluster.stop()
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()

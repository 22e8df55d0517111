"""The ``gateway`` workload's targets, and the workload run on its own
(``python -m shoal.bench.gatewayrun``): moto, a local cluster and a gateway on this
machine with no shaper (the store is then local too, which flatters "direct")."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shoal.bench.gateway import (
    KEY_ID,
    SECRET,
    client_large,
    credentials_file,
    get_large,
    get_many,
    proc_cpu,
    put_many,
    rates,
    s3,
    start_gateway,
)
from shoal.bench.stats import Target


def gateway_targets(procs: int) -> list[Target]:
    """Issue 15's: boto3 at 16 requests in flight through the S3 gateway against the
    same boto3 reading the store (same shaper), in one process and in ``procs``."""
    gw, out = "shoal-s3-gateway", []
    for p in sorted({1, procs}):
        warm, cold = f"gateway 100KB warm p{p}", f"gateway 100KB cold p{p}"
        out += [
            Target(f"S3 gateway warm 100 KB GETs >= 3x direct (boto3 p{p}, 16 in flight)",
                   (warm, gw), (warm, "boto3"), 3.0),
            Target(f"S3 gateway cold 100 KB GETs >= 0.9x direct (boto3 p{p}, 16 in flight)",
                   (cold, gw), (cold, "boto3"), 0.9),
        ]  # fmt: skip
    return [
        *out,
        Target("S3 gateway warm large GET >= 0.7x the Python client",
               ("large gateway warm", gw), ("large gateway warm", "shoal-client"), 0.7, "mb_per_s"),
        Target("S3 gateway cold large GET >= 0.9x direct",
               ("large gateway cold", gw), ("large gateway cold", "boto3"), 0.9, "mb_per_s"),
    ]  # fmt: skip


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

    ap = argparse.ArgumentParser(prog="python -m shoal.bench.gatewayrun")
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

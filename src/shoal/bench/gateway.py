"""The ``gateway`` workload: S3 GETs through shoal's S3 gateway against the same
client reading the store directly, and against the Python client.

- small: 100 KB objects with boto3 at 16 requests in flight, through the gateway
  (cold: the first pass, then warm) and straight to the store (every pass cold);
- large: one large object, a boto3 GET through the gateway (warm) against
  ``Client.read`` of the same file in the Python client (warm).

Targets (issue 15): warm small >= 3x direct; warm large >= 0.7x the Python client;
cold small >= 0.9x direct.

``shoal bench --workload gateway`` runs :class:`Passes` against the suite's store (RGW,
moto with --quick) through its shaper: boto3 at 16 in flight in one process and in
``procs`` processes, the large object with boto3's transfer manager, and the CPU of every
process per GET (readers, gateway, workers, master, store) to say what limits a rate.
``python -m shoal.bench.gatewayrun`` runs the workload on its own: moto, a local
cluster and a gateway on this machine with no shaper (the store is then local too,
which flatters "direct").
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.bench import runner
from shoal.bench.contender import KEY as STORE_KEY
from shoal.bench.contender import SECRET as STORE_SECRET
from shoal.bench.contender import BenchEnv, Contender, ReadFn
from shoal.bench.stats import Sample

if TYPE_CHECKING:
    from shoal.bench.workloads import Measure

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


# -- the suite's workload (``shoal bench --workload gateway``) ----------------------

#: 100 KB objects per pass (the suite's first ones): enough for a rate, not a long run
SMALL_MAX, SMALL_MAX_QUICK = 5_000, 1_000
#: boto3's transfer manager on the large object: part size (16 parts in flight)
PART = 8 << 20


def plan(
    nkeys: int, procs: int, quick: bool, inflight: int = INFLIGHT
) -> tuple[int, list[tuple[int, int]]]:
    """How many 100 KB objects a pass reads, and the (processes, threads each) shapes
    the small GETs run in: one boto3 process with every request in flight, and
    ``procs`` processes sharing them (one boto3 process can be the bottleneck)."""
    n = min(nkeys, SMALL_MAX_QUICK if quick else SMALL_MAX)
    shapes = [(1, inflight)]
    if procs > 1:
        shapes.append((procs, max(1, inflight // procs)))
    return n, shapes


def s3_reader(client: Any, bucket: str, prefix: str) -> Callable[[str], int]:
    """Whole-object GETs of ``prefix + key``, the body read in 1 MiB pieces."""

    def read(key: str) -> int:
        body = client.get_object(Bucket=bucket, Key=prefix + key)["Body"]
        n = 0
        while chunk := body.read(1 << 20):
            n += len(chunk)
        return n

    return read


def s3_downloader(
    client: Any, bucket: str, prefix: str, inflight: int = INFLIGHT
) -> Callable[[str], int]:
    """boto3's transfer manager (what ``download_file`` does): ranged GETs of
    :data:`PART` bytes, ``inflight`` at a time, written to /dev/null."""
    import threading

    from boto3.s3.transfer import TransferConfig

    cfg = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART,
                         max_concurrency=inflight, use_threads=True)  # fmt: skip

    def read(key: str) -> int:
        got = [0]
        lock = threading.Lock()

        def count(n: int) -> None:
            with lock:
                got[0] += n

        with open(os.devnull, "wb") as sink:
            client.download_fileobj(bucket, prefix + key, sink, Config=cfg, Callback=count)
        return got[0]

    return read


class _S3(Contender):
    """boto3 against one S3 endpoint; ``large``: the transfer manager, else one GET per
    object. The reader is made in the reader process (after fork)."""

    large = False
    bucket_prefix = ""

    def _endpoint(self) -> tuple[str, str, str, str]:  # url, key, secret, bucket
        raise NotImplementedError

    def reader(self) -> ReadFn:
        url, key, secret, bucket = self._endpoint()
        client = s3(url, key, secret)
        if self.large:
            return s3_downloader(client, bucket, self.bucket_prefix)
        return s3_reader(client, bucket, self.bucket_prefix)


class Direct(_S3):
    """boto3 straight to the store, through the suite's shaper (no cache)."""

    name = "boto3"
    kind = "remote"

    def _endpoint(self) -> tuple[str, str, str, str]:
        return self.env.endpoint, STORE_KEY, STORE_SECRET, self.env.bucket


class Gateway(_S3):
    """boto3 through ``shoal gateway s3`` over the suite's cluster: bucket = dataset,
    key = ``data/<key>``. Cold = a fresh cluster (the suite's) and a new gateway."""

    name = "shoal-s3-gateway"
    bucket_prefix = "data/"

    def __init__(self, env: BenchEnv, workdir: Path) -> None:
        super().__init__(env)
        self.workdir = workdir
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self.started: dict[str, float] = {}

    def _endpoint(self) -> tuple[str, str, str, str]:
        return self.url, KEY_ID, SECRET, self.env.dataset

    def cold(self) -> None:
        self.teardown()
        self.env.extra["shoal_cold"]()
        self.workdir.mkdir(parents=True, exist_ok=True)
        creds = credentials_file(self.workdir / "credentials.toml")
        self.url, self.proc = start_gateway(self.env.master, creds, self.workdir / "gateway.log")
        self.started = self.cpu_split()

    def cpu_split(self) -> dict[str, float]:
        """CPU seconds so far of the gateway, the workers and the master."""
        cluster = self.env.extra.get("cluster")
        pids = dict(cluster.pids) if cluster is not None else {}
        out = {"gateway": proc_cpu(self.proc.pid) if self.proc is not None else 0.0}
        out["workers"] = sum(proc_cpu(p) for n, p in pids.items() if n.startswith("worker"))
        out["master"] = sum(proc_cpu(p) for n, p in pids.items() if n == "master")
        return out

    def teardown(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def gateway_pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None else []

    def daemon_pids(self) -> list[int]:
        cluster = self.env.extra.get("cluster")
        pids = list(cluster.pids.values()) if cluster is not None else []
        return self.gateway_pids() + pids


class PythonClient(Contender):
    """The same large file with ``Client.read`` in 64 MiB pieces, one after another."""

    name = "shoal-client"

    def reader(self) -> ReadFn:
        from shoal.client import Client

        c = self._c = Client(self.env.master)

        def read(key: str) -> int:
            path = f"/{self.env.dataset}/data/{key}"
            size, n = c.stat(path).size, 0
            while n < size:
                n += len(c.read(path, n, min(64 << 20, size - n)))
            return n

        return read

    def close_reader(self) -> None:
        c = getattr(self, "_c", None)
        if c is not None:
            c.close()

    def daemon_pids(self) -> list[int]:
        cluster = self.env.extra.get("cluster")
        return [p for n, p in cluster.pids.items() if n.startswith("worker")] if cluster else []


ABOUT = {
    "shoal-s3-gateway": "boto3 through `shoal gateway s3` over the cluster (gateway workload: "
    "100 KB GetObject at 16 in flight; the large object with boto3's transfer manager, "
    "8 MiB parts, 16 in flight)",
}


class Passes:
    """The gateway workload's passes, in one order so that every ratio compares
    measurements taken minutes apart: per shape (processes x threads = 16 in flight)
    a direct pass, then the gateway's cold pass on a fresh cluster, its warm passes and
    a direct pass again; then the large object the same way, with the Python client."""

    def __init__(
        self, cfg: Any, env: BenchEnv, measure: Measure, small: list[str], large: str | None,
        say: Callable[[str], None] = print, store_pids: tuple[int, ...] = (),
    ) -> None:  # fmt: skip
        self.cfg, self.env, self.measure, self.say = cfg, env, measure, say
        self.small, self.large = small, large
        #: the store's processes (RGW's daemons), for its CPU per GET
        self.store_pids = list(store_pids)
        #: CPU per GET (ms) of readers, gateway, workers, master: the bottleneck evidence
        self.cpu: dict[str, dict[str, list[float]]] = {}

    def _store_cpu(self) -> float:
        return sum(proc_cpu(p) for p in self.store_pids) if self.store_pids else 0.0

    def _timed(self, wl: str, c: Contender, fn: Callable[[], Sample], cold: bool) -> None:
        st0 = self._store_cpu()
        if not isinstance(c, Gateway):
            s = self.measure(wl, c, fn, cold)
            return self._cpu(wl, c, s, {}, self._store_cpu() - st0)
        # cold: measure starts a fresh cluster and gateway (c.cold()), which note their
        # CPU once up; warm: the CPU before the pass
        before = None if cold else c.cpu_split()
        s = self.measure(wl, c, fn, cold)
        store = self._store_cpu() - st0
        before = c.started if before is None else before
        after = c.cpu_split()
        self._cpu(wl, c, s, {k: after[k] - before.get(k, 0.0) for k in after}, store)

    def _cpu(
        self, wl: str, c: Contender, s: Sample | None, split: dict[str, float], store: float
    ) -> None:
        """CPU per GET of the whole pass (readers and daemons), of each daemon, and of
        the store (not in the pass's own CPU: the report's rates leave it out)."""
        if s is None or not s.files:
            return
        row = self.cpu.setdefault(f"{wl} | {c.name}", {})
        row.setdefault("all_ms_per_get", []).append(round(s.cpu_s / s.files * 1e3, 3))
        if self.store_pids:
            row.setdefault("store_ms_per_get", []).append(round(store / s.files * 1e3, 3))
        daemons = sum(split.values())
        row.setdefault("readers_ms_per_get", []).append(
            round((s.cpu_s - daemons) / s.files * 1e3, 3)
        )
        for name, cpu in split.items():
            row.setdefault(f"{name}_ms_per_get", []).append(round(cpu / s.files * 1e3, 3))

    def run(self) -> None:
        cfg = self.cfg
        gw = Gateway(self.env, cfg.workdir / "gateway")
        direct = Direct(self.env)
        try:
            n, shapes = plan(len(self.small), cfg.procs, cfg.quick)
            keys = self.small[:n]
            for procs, threads in shapes:

                def ep(
                    c: Contender, seed: int, p: int = procs, t: int = threads
                ) -> Callable[[], Sample]:
                    return partial(runner.epoch, c, keys, p, t, seed)

                cold, warm = f"gateway 100KB cold p{procs}", f"gateway 100KB warm p{procs}"
                self._timed(cold, direct, ep(direct, 1), False)
                self._timed(cold, gw, ep(gw, 2), True)
                for r in range(cfg.warm_reps):
                    self._timed(warm, gw, ep(gw, 10 + r), False)
                self._timed(warm, direct, ep(direct, 20), False)
            if self.large:
                self.run_large(gw, direct, self.large)
        finally:
            gw.teardown()

    def run_large(self, gw: Gateway, direct: Direct, key: str) -> None:
        gw.large = direct.large = True
        client = PythonClient(self.env)

        def one(c: Contender) -> Callable[[], Sample]:
            return partial(runner.epoch, c, [key], 1, 1, 0)

        self._timed("large gateway cold", direct, one(direct), False)
        self._timed("large gateway cold", gw, one(gw), True)
        for _ in range(self.cfg.warm_reps):
            self._timed("large gateway warm", gw, one(gw), False)
            self._timed("large gateway warm", client, one(client), False)
        self._timed("large gateway warm", direct, one(direct), False)

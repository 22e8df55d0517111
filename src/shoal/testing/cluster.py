"""A real cluster for tests: master and worker processes on free ports over a real S3
endpoint (moto's server), with helpers to seed data and to kill or restart processes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shoal.cli.local import LocalCluster
from shoal.client import Client
from shoal.config import ClientSettings
from shoal.core.types import Mount
from shoal.errors import Unavailable
from shoal.proto.control import RING
from shoal.testing.s3 import CREDENTIALS, free_port

#: environment that lets shoal's processes talk to moto with its dummy credentials
S3_ENV = {
    "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
    "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
    "AWS_DEFAULT_REGION": CREDENTIALS["region_name"],
}


def sample_files(
    n: int, min_size: int, max_size: int, seed: int = 0, prefix: str = ""
) -> dict[str, bytes]:
    """Deterministic random files (incompressible bytes) keyed by relative path."""
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        size = rng.randint(min_size, max_size)
        out[f"{prefix}{i // 100:03d}/f{i:06d}.bin"] = rng.randbytes(size)
    return out


@contextmanager
def s3_env() -> Iterator[None]:
    """Dummy credentials in this process's environment (the client's fallback reads them)."""
    old = {k: os.environ.get(k) for k in S3_ENV}
    os.environ.update(S3_ENV)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class TestCluster(LocalCluster):
    """LocalCluster with test conveniences."""

    __test__ = False  # not a pytest class

    def client(self, **overrides: object) -> Client:
        """A client of this cluster (with ``auth``: holding the admin's token, unless
        ``token=`` says otherwise)."""
        if self.auth and "token" not in overrides:
            overrides["token"] = self.admin_token_file.read_text().strip()
        if self.tls_ca is not None and "tls_ca" not in overrides:
            overrides["tls_ca"] = str(self.tls_ca)
        settings = ClientSettings(master=self.master_url, **overrides)  # type: ignore[arg-type]
        return Client(settings=settings)

    def kill_worker(self, i: int, sig: int = signal.SIGKILL) -> None:
        self.stop_process(f"worker-{i}", sig)

    def restart_worker(self, i: int, timeout: float = 20.0) -> None:
        """Start worker ``i`` again and return once the master's ring lists it at its new
        address (a reader that refreshes its ring then finds it)."""
        addr = self.start_worker(i)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            req = urllib.request.Request(self.master_url + RING)
            if self.auth:
                token = self.admin_token_file.read_text().strip()
                req.add_header("Authorization", f"Bearer {token}")
            with urllib.request.urlopen(req, timeout=5) as r:
                ring = json.load(r)
            if any(w["id"] == addr["id"] and w["port"] == addr["port"] for w in ring["workers"]):
                return
            time.sleep(0.05)
        raise Unavailable(f"worker {i} did not rejoin the ring at port {addr['port']}")

    def stop_master(self, sig: int = signal.SIGTERM) -> None:
        self.stop_process("master", sig)

    def restart_master(self, sig: int = signal.SIGKILL) -> str:
        """Stop the master with ``sig`` (default: a crash) and start it again on the same
        port and state directory, so workers and clients find it where it was."""
        self.stop_master(sig)
        url = self.start_master()
        self.save()
        return url

    def s3_dataset(
        self, bucket: str, endpoint: str, options: dict[str, str] | None = None, name: str = "ds"
    ) -> None:
        """Create dataset ``name`` with one mount ``data`` over ``s3://bucket`` at ``endpoint``."""
        with self.client() as c:
            mount = Mount("data", f"s3://{bucket}", {"endpoint_url": endpoint})
            c.create_dataset(name, [mount], options)


def start_cluster(dir: Path, workers: int = 2, **kw: object) -> TestCluster:
    c = TestCluster(dir, workers=workers, env=dict(S3_ENV), **kw)  # type: ignore[arg-type]
    c.start()
    return c


@contextmanager
def one_file_cluster(
    dir: Path, data: bytes, disk: str = "256MiB", policy: dict[str, str] | None = None
) -> Iterator[TestCluster]:
    """A one-worker cluster (disk tier only) with dataset ``ds`` (of ``policy``) whose
    mount ``m`` is a directory holding one file, ``big.bin`` (``/ds/m/big.bin``), of
    ``data``."""
    src = dir / "src"
    src.mkdir(parents=True)
    (src / "big.bin").write_bytes(data)
    c = start_cluster(dir / "c", workers=1, mem="0", disk=disk)
    try:
        with c.client() as cl:
            cl.create_dataset("ds", [Mount("m", f"file://{src}", {})], policy)
        yield c
    finally:
        c.stop()


@contextmanager
def with_spare_master_address(dir: Path, workers: int = 2) -> Iterator[tuple[TestCluster, str]]:
    """A running cluster whose workers (and ``master_url``, for clients) know two
    master addresses: the running master's, then a free port where a second master --
    a restored one, a standby -- will come up. Yields (cluster, the spare URL)."""
    c = TestCluster(dir, workers=workers, env=dict(S3_ENV))
    c.dir.mkdir(parents=True)
    first = c.start_master()
    spare = f"http://127.0.0.1:{free_port()}"
    c.master_url = f"{first},{spare}"
    try:
        for i in range(c.workers):
            c.start_worker(i)
        c.save()
        c.wait_ring(c.workers)
        yield c, spare
    finally:
        c.stop()

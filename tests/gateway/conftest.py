"""Fixtures shared by the gateway tests: one real cluster per module, a dataset over a
moto bucket with its manifest, a credentials file, and a gateway started as a real
process (``python -m shoal gateway KIND ...``) on port 0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.s3 import MotoServer, make_bucket, s3_client

#: access keys of the credentials file (user -> (access key, secret))
KEYS = {
    "reader": ("AKIDREADER", "reader-secret-0123456789"),
    "writer": ("AKIDWRITER", "writer-secret-0123456789"),
    "stranger": ("AKIDSTRANGER", "stranger-secret-0123456789"),
    "everyone": ("AKIDEVERYONE", "everyone-secret-0123456789"),
}


@dataclass
class GatewayData:
    """A dataset over a moto bucket: ``files`` are its keys ('<mount>/<path>')."""

    cluster: TestCluster
    moto: MotoServer
    dataset: str
    bucket: str
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class Gateway:
    url: str
    proc: subprocess.Popen[str]
    credentials: Path
    log: Path


def wait_job(cluster: TestCluster, spec: dict[str, object], timeout: float = 60.0) -> None:
    with cluster.client() as c:
        view = c.submit_job(spec)
        deadline = time.monotonic() + timeout
        while view["state"] not in ("done", "failed", "stopped"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {view['id']} still {view['state']}")
            time.sleep(0.05)  # the master has no completion event to wait on
            view = c.job(view["id"])
        assert view["state"] == "done", view


def seed_dataset(
    cluster: TestCluster,
    moto: MotoServer,
    name: str,
    files: dict[str, bytes],
    manifest: bool = True,
) -> GatewayData:
    """Bucket ``name`` with ``files`` (relative keys), dataset ``name`` with mount
    ``data`` over it, and (``manifest``) a metadata load so that it has a manifest."""
    make_bucket(moto.endpoint, name)
    s3 = s3_client(moto.endpoint)
    with ThreadPoolExecutor(8) as pool:  # moto takes a few ms per PUT
        list(pool.map(lambda kv: s3.put_object(Bucket=name, Key=kv[0], Body=kv[1]), files.items()))
    cluster.s3_dataset(name, moto.endpoint, name=name)
    if manifest:
        wait_job(cluster, {"kind": "load", "dataset": name, "metadata_only": True})
    return GatewayData(cluster, moto, name, name, {f"data/{k}": v for k, v in files.items()})


def write_credentials(
    path: Path, datasets: dict[str, list[str] | str], public: Sequence[str] = ()
) -> Path:
    """A TOML credentials file: users of :data:`KEYS` (``datasets``: user -> datasets,
    or "*"); reader is read-only, writer may write, stranger reads only its own."""
    roles = {"reader": "read", "writer": "write", "stranger": "read", "everyone": "read"}
    lines = [f"public = {list(public)!r}".replace("'", '"'), ""]
    for user, (key, secret) in KEYS.items():
        ds = datasets.get(user, [])
        ds_toml = '"*"' if ds == "*" else repr(list(ds)).replace("'", '"')
        lines += [
            f"[users.{user}]",
            f'role = "{roles[user]}"',
            f"datasets = {ds_toml}",
            f'keys = [{{ access_key = "{key}", secret = "{secret}" }}]',
            "",
        ]
    path.write_text("\n".join(lines))
    os.chmod(path, 0o600)
    return path


def start_gateway(
    kind: str, master: str, args: list[str], log: Path
) -> tuple[str, subprocess.Popen[str]]:
    """``python -m shoal gateway KIND --master URL --port 0 ARGS`` as a real process;
    (its URL from the banner line, the process)."""
    cmd = [sys.executable, "-m", "shoal", "gateway", kind, "--master", master, "--port", "0", *args]
    err = open(log, "w")  # noqa: SIM115 - the process keeps it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the banner: its first line of output
    if not line:
        proc.wait(10)
        raise RuntimeError(f"gateway {kind} exited {proc.returncode}: {log.read_text()[-2000:]}")
    url = line.strip().rsplit(" ", 1)[-1]
    assert url.startswith(("http://", "https://")), line
    return url, proc


def stop_gateway(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="session")
def gw_cluster(
    tmp_path_factory: pytest.TempPathFactory, s3_credentials: None
) -> Iterator[TestCluster]:
    """One master and two workers for every gateway test module (each module makes its
    own datasets, named after the module)."""
    c = start_cluster(tmp_path_factory.mktemp("gwcluster"), workers=2)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def gw_dataset(
    gw_cluster: TestCluster, moto: MotoServer, request: pytest.FixtureRequest
) -> GatewayData:
    """A dataset (named after the test module) of 60 small files, one 9 MiB file and
    one with an awkward name, with a manifest."""
    files = sample_files(60, 100, 150_000, seed=15)
    files["big/large.bin"] = os.urandom(9 << 20)
    files["odd/sp ace+plus%pct ü.txt"] = b"odd names\n"
    name = request.module.__name__.rsplit(".", 1)[-1].replace("_", "-")
    return seed_dataset(gw_cluster, moto, name, files)


@pytest.fixture(scope="module")
def s3_gateway(
    gw_dataset: GatewayData, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """The S3 gateway over ``gw_dataset``: reader may read it, writer may write it
    (and it is --writable), stranger may read only another dataset, everyone may read
    every dataset."""
    d = tmp_path_factory.mktemp("s3gw")
    ds = gw_dataset.dataset
    creds = write_credentials(
        d / "credentials.toml",
        {"reader": [ds], "writer": [ds], "stranger": ["elsewhere"], "everyone": "*"},
    )
    log = d / "gateway.log"
    url, proc = start_gateway(
        "s3",
        gw_dataset.cluster.master_url,
        ["--credentials", str(creds), "--writable", ds, "--spool-dir", str(d)],
        log,
    )
    try:
        yield Gateway(url, proc, creds, log)
    finally:
        stop_gateway(proc)


def boto3_client(
    url: str, user: str | None = "reader", verify: str | None = None, **config: object
) -> Any:
    """A boto3 S3 client of ``user`` (None: unsigned) against the gateway, path style,
    no retries (a test sees the first answer)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    kw: dict[str, Any] = {"s3": {"addressing_style": "path"}, "retries": {"max_attempts": 1}}
    kw.update(config)
    if user is None:
        kw["signature_version"] = UNSIGNED
        return boto3.client("s3", endpoint_url=url, region_name="us-east-1", config=Config(**kw))
    key, secret = KEYS[user]
    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(**kw),
        verify=verify,
    )


@pytest.fixture(scope="session")
def s3_client_for() -> Any:
    """:func:`boto3_client` as a fixture (test modules do not import conftest)."""
    return boto3_client


@pytest.fixture(scope="session")
def seed() -> Any:
    """:func:`seed_dataset` as a fixture."""
    return seed_dataset


@pytest.fixture(scope="session")
def gwkit() -> Any:
    """This module's helpers (KEYS, start_gateway, write_credentials ...) for test
    modules, which do not import conftest."""
    return _THIS


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate and key for 127.0.0.1 (the gateways over HTTPS)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (needed for a test certificate)")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


#: this module, taken while it is being imported: every conftest.py of the tree is
#: imported under the name "conftest", so sys.modules[__name__] later is the last one
_THIS = sys.modules[__name__]

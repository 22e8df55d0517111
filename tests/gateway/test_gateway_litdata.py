"""LitData against the S3 gateway: a shard set written by ``litdata.optimize()`` in the
under store of a dataset, read back with ``litdata.StreamingDataset("s3://...")``
through an HTTPS gateway, in one process and in a DataLoader of 2 workers, every sample
compared byte for byte; the second pass is served from the cache (no GET reaches the
under store).

What LitData 0.2.76 does (read from its source, checked here): ``index.json`` comes
with boto3 (``storage_options`` are passed to ``boto3.client``, so ``endpoint_url`` goes
there) and every chunk with obstore, whose ``S3Store`` LitData builds from the boto3
client's endpoint with client options of its own. Those options replace the ones
obstore would read from the environment, so ``AWS_ALLOW_HTTP=true`` is lost and obstore
refuses an ``http://`` endpoint ("builder error"; :func:`test_litdata_http_refused`
keeps that claim honest). Over https both trust a private CA by file: boto3 through
``AWS_CA_BUNDLE``, obstore (rustls with native roots) through ``SSL_CERT_FILE``.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from shoal.testing.s3 import CountingProxy, make_bucket

if TYPE_CHECKING:
    from shoal.testing.cluster import TestCluster
    from shoal.testing.s3 import MotoServer

pytestmark = pytest.mark.integration

#: LitData and the two packages it needs that the project's venv lacks; torch, numpy,
#: boto3, filelock and requests come from the venv. torchvision is left out: LitData
#: imports it only for image and video serializers, and PyPI's torchvision imports only
#: beside PyPI's (CUDA) torch, not the CPU build a clean set-up has
LITDATA_PINS = ["litdata==0.2.76", "obstore==0.12.1", "lightning-utilities==0.15.3"]

SAMPLES = 200
PREFIX = "data/ld"  # <mount>/<path> inside the dataset's bucket


def _blob(i: int) -> bytes:
    import numpy as np

    return np.random.default_rng(i).bytes(1000 + 37 * i)


_WRITE = """
import sys
import numpy as np
from litdata import optimize

def sample(i):
    return {"i": i, "blob": np.random.default_rng(i).bytes(1000 + 37 * i)}

if __name__ == "__main__":
    optimize(fn=sample, inputs=list(range(int(sys.argv[2]))), output_dir=sys.argv[1],
             chunk_bytes=64_000, num_workers=1, mode="overwrite", verbose=False)
"""

# one pass over the dataset: argv = url, endpoint, local cache dir, workers, out file.
# obstore's GETs are wrapped to note which process fetched which key, so the test knows
# that obstore (not a boto3 fallback) carried the chunks
_READ = """
import os, pickle, sys, warnings
warnings.simplefilter("ignore")
import obstore
from litdata import StreamingDataLoader, StreamingDataset

url, endpoint, cache, workers, out = sys.argv[1:6]

def noted(fn):
    def call(store, key, *args, **kw):
        with open(out + ".obstore", "a") as f:
            f.write(f"{os.getpid()} {key}\\n")
        return fn(store, key, *args, **kw)
    return call

for name in ("get", "get_async", "get_range", "get_range_async", "get_ranges", "get_ranges_async"):
    setattr(obstore, name, noted(getattr(obstore, name)))

ds = StreamingDataset(url, cache_dir=cache, storage_options={"endpoint_url": endpoint})
seen = {}
if int(workers) == 0:
    for s in ds:
        seen[int(s["i"])] = s["blob"]
else:
    for batch in StreamingDataLoader(ds, batch_size=10, num_workers=int(workers)):
        for i, blob in zip(batch["i"].tolist(), batch["blob"]):
            assert i not in seen, f"sample {i} twice"
            seen[i] = blob
with open(out, "wb") as f:
    pickle.dump({"len": len(ds), "samples": seen, "pid": os.getpid()}, f)
"""


@dataclass
class Shards:
    """The shard set: its files (relative names -> bytes) in ``bucket`` under PREFIX,
    behind ``proxy``, which counts what the cluster's workers fetch."""

    python: Path
    bucket: str
    files: dict[str, bytes]
    proxy: CountingProxy


@dataclass
class TlsGateway:
    url: str
    ca: Path


@pytest.fixture(scope="session")  # session: set up before the cluster, so a skip is at once
def litdata_python() -> Path:
    from shoal.testing.overlay import overlay_python

    python = overlay_python("litdata", LITDATA_PINS)
    if python is None:
        from shoal.testing import overlay

        pytest.skip(overlay.LAST_ERROR)
    probe = subprocess.run([str(python), "-c", "import litdata, obstore"], capture_output=True, text=True, timeout=300)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"litdata does not import beside this torch: {probe.stderr.strip().splitlines()[-1:]}")  # fmt: skip
    return python


@pytest.fixture(scope="module")
def shards(
    litdata_python: Path,
    gw_cluster: TestCluster,
    moto: MotoServer,
    gwkit: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Shards]:
    """Shards written by optimize(), put straight into a bucket, and a dataset of the
    same name over it whose workers reach the bucket through a counting proxy (so the
    first read is cold)."""
    d = tmp_path_factory.mktemp("litdata")
    out, script = d / "optimized", d / "write.py"
    script.write_text(_WRITE)  # a file: optimize()'s workers import fn from __main__
    # optimize() stages in $TMPDIR/chunks and $TMPDIR/data unless told otherwise
    env = dict(os.environ, DATA_OPTIMIZER_CACHE_FOLDER=str(d / "chunks"),
               DATA_OPTIMIZER_DATA_CACHE_FOLDER=str(d / "data"))  # fmt: skip
    w = subprocess.run([str(litdata_python), str(script), str(out), str(SAMPLES)], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert w.returncode == 0, w.stderr[-2000:]
    files = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert "index.json" in files and len(files) > 4, sorted(files)
    name = "gw-litdata"
    make_bucket(moto.endpoint, name, {f"ld/{k}": v for k, v in files.items()})
    with CountingProxy(moto.endpoint) as proxy:
        gw_cluster.s3_dataset(name, proxy.endpoint, name=name)
        gwkit.wait_job(gw_cluster, {"kind": "load", "dataset": name, "metadata_only": True})
        yield Shards(litdata_python, name, files, proxy)


def _gateway(
    gwkit: Any, cluster: TestCluster, bucket: str, d: Path, tls: list[str]
) -> tuple[str, subprocess.Popen[str]]:
    creds = gwkit.write_credentials(d / "c.toml", {"reader": [bucket]})
    args = ["--credentials", str(creds), *tls]
    url, proc = gwkit.start_gateway("s3", cluster.master_url, args, d / "log")
    return url, proc


@pytest.fixture(scope="module")
def tls_gateway(
    shards: Shards, gw_cluster: TestCluster, gwkit: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsGateway]:
    """An HTTPS gateway with a certificate from a local CA (shoal.cli.pki.local_pki)."""
    pytest.importorskip("cryptography")
    from shoal.cli.pki import local_pki

    d = tmp_path_factory.mktemp("ldgw")
    pki = local_pki(d / "pki", "127.0.0.1")
    tls = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key)]
    url, proc = _gateway(gwkit, gw_cluster, shards.bucket, d, tls)
    assert url.startswith("https://"), url
    try:
        yield TlsGateway(url, pki.ca)
    finally:
        gwkit.stop_gateway(proc)


@pytest.fixture(scope="module")
def http_gateway(
    shards: Shards, gw_cluster: TestCluster, gwkit: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    url, proc = _gateway(gwkit, gw_cluster, shards.bucket, tmp_path_factory.mktemp("ldgw"), [])
    try:
        yield url
    finally:
        gwkit.stop_gateway(proc)


def _env(gwkit: Any, user: str, **extra: str) -> dict[str, str]:
    key, secret = gwkit.KEYS[user]
    drop = ("AWS_", "SSL_CERT", "REQUESTS_CA", "CURL_CA", "LITDATA_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        AWS_ACCESS_KEY_ID=key,
        AWS_SECRET_ACCESS_KEY=secret,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
        **extra,
    )
    return env


def _read(
    shards: Shards, endpoint: str, env: dict[str, str], workers: int, tmp: Path
) -> dict[str, Any]:
    """One pass in the overlay's interpreter with a fresh local cache: what it read and
    which process fetched which chunk key with obstore."""
    out = tmp / f"pass-{workers}.pkl"
    url = f"s3://{shards.bucket}/{PREFIX}"
    cmd = [str(shards.python), "-c", _READ, url, endpoint, str(tmp / f"cache-{workers}"), str(workers), str(out)]  # fmt: skip
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(out, "rb") as f:
        got: dict[str, Any] = pickle.load(f)
    noted = Path(f"{out}.obstore")
    lines = noted.read_text().split() if noted.exists() else []
    got["obstore"] = list(zip(lines[::2], lines[1::2], strict=True))
    return got


def _under_gets(proxy: CountingProxy, bucket: str, names: list[str]) -> dict[str, int]:
    """GETs (ranged or not) the workers sent to the under store for each shard file."""
    return {n: proxy.counts_for(f"{bucket}/ld/{n}").get("GET", 0) for n in names}


def _gateway_requests(url: str, ca: Path) -> dict[tuple[str, str], int]:
    """The gateway's request counts by (op, status), from its /metrics."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(f"{url}/metrics", timeout=10, context=ctx) as r:
        text = r.read().decode()
    pattern = r"^shoal_gateway_requests_total\{(.*)\} (\S+)$"
    out: dict[tuple[str, str], int] = {}
    for labels, value in re.findall(pattern, text, re.MULTILINE):
        kv = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        out[kv["op"], kv["status"]] = int(float(value))
    return out


def _gets(counts: dict[tuple[str, str], int]) -> int:
    return sum(n for (op, status), n in counts.items() if op == "GetObject" and status in ("200", "206"))  # fmt: skip


@pytest.mark.timeout(900)  # the overlay is built once (three wheels from PyPI)
def test_litdata_streaming_dataset(
    shards: Shards, tls_gateway: TlsGateway, gwkit: Any, tmp_path: Path
) -> None:
    """Cold pass in one process, then a warm pass in a DataLoader of 2 workers: every
    sample byte-exact both times, every chunk fetched by obstore through the gateway,
    and the warm pass sends no GET to the under store."""
    ca = str(tls_gateway.ca)
    env = _env(gwkit, "reader", AWS_CA_BUNDLE=ca, SSL_CERT_FILE=ca)
    want = {i: _blob(i) for i in range(SAMPLES)}
    chunks = sorted(n for n in shards.files if n != "index.json")
    shards.proxy.reset()  # the metadata load listed the bucket

    cold = _read(shards, tls_gateway.url, env, 0, tmp_path)
    assert cold["len"] == SAMPLES
    assert cold["samples"] == want
    assert {k for _, k in cold["obstore"]} == {f"{PREFIX}/{n}" for n in chunks}
    assert {pid for pid, _ in cold["obstore"]} == {str(cold["pid"])}
    first = _under_gets(shards.proxy, shards.bucket, ["index.json", *chunks])
    assert all(first.values()), f"a cold read that never reached the under store: {first}"

    shards.proxy.reset()
    before = _gateway_requests(tls_gateway.url, tls_gateway.ca)
    warm = _read(shards, tls_gateway.url, env, 2, tmp_path)
    assert warm["len"] == SAMPLES
    assert warm["samples"] == want
    assert {k for _, k in warm["obstore"]} == {f"{PREFIX}/{n}" for n in chunks}
    fetchers = {pid for pid, _ in warm["obstore"]}
    assert len(fetchers) == 2 and str(warm["pid"]) not in fetchers  # the two workers
    # litdata fetched every file again through the gateway (a fresh local cache), each
    # request it made was answered with a success ...
    after = _gateway_requests(tls_gateway.url, tls_gateway.ca)
    assert _gets(after) - _gets(before) >= len(chunks) + 1
    assert all(int(status) < 400 for _, status in after), after
    # ... and the gateway served all of it from the cache
    assert _under_gets(shards.proxy, shards.bucket, ["index.json", *chunks]) == dict.fromkeys(
        ["index.json", *chunks], 0
    ), json.dumps(shards.proxy.counts())


@pytest.mark.timeout(600)
def test_litdata_http_refused(
    shards: Shards, http_gateway: str, gwkit: Any, tmp_path: Path
) -> None:
    """Over plain http LitData's chunk downloads fail in obstore even with
    AWS_ALLOW_HTTP=true (LitData's own client options replace the environment's); the
    index, fetched with boto3, arrives. When a LitData release passes allow_http
    through, this test fails and the docs can drop the https requirement."""
    env = _env(gwkit, "reader", AWS_ALLOW_HTTP="true")
    out = tmp_path / "pass-0.pkl"
    url = f"s3://{shards.bucket}/{PREFIX}"
    cmd = [str(shards.python), "-c", _READ, url, http_gateway, str(tmp_path / "cache"), "0", str(out)]  # fmt: skip
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and not out.exists()
    assert "builder error" in r.stderr, r.stderr[-3000:]
    assert list(tmp_path.joinpath("cache").rglob("index.json")), "boto3 fetched no index.json"

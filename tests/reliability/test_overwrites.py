"""S3 objects overwritten while readers read, against a model of the allowed versions:
a read returns exactly one version that was written (never a mix of two, never a torn
object); after ``shoal sync`` under ``staleness=never`` every reader reaches the latest
version within the documented bound (the client's ring refresh)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from relhelpers import Figures, digest, wait_for

from shoal.client import Client
from shoal.testing.cluster import TestCluster, start_cluster
from shoal.testing.s3 import MotoServer, make_bucket, s3_client

pytestmark = pytest.mark.integration

MiB = 1 << 20
KEYS = 8
OVERWRITES = 40
#: the client's ring refresh in these tests; the README's bound for seeing a sync
RING_REFRESH = 2.0


@pytest.fixture
def cluster2(tmp_path: Path, s3_credentials: None) -> Iterator[TestCluster]:
    c = start_cluster(tmp_path / "c", workers=2, mem="0")
    try:
        yield c
    finally:
        c.stop()


class Model:
    """Every version written to each key so far (a version is added before its PUT)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.versions: dict[str, list[str]] = {}

    def add(self, key: str, data: bytes) -> None:
        with self.lock:
            self.versions.setdefault(key, []).append(digest(data))

    def allowed(self, key: str) -> list[str]:
        with self.lock:
            return list(self.versions[key])

    def latest(self, key: str) -> str:
        with self.lock:
            return self.versions[key][-1]


def _version(rng: random.Random, key: str) -> bytes:
    # the large key spans several pages, where a mix of versions could hide
    size = rng.randint(2 * MiB, 3 * MiB) if key.startswith("big") else rng.randint(1, 200_000)
    return rng.randbytes(size)


def _setup(
    moto: MotoServer, cluster: TestCluster, bucket: str, staleness: str
) -> tuple[Model, dict[str, bytes]]:
    rng = random.Random(61)
    keys = [f"k{i}.bin" for i in range(KEYS - 1)] + ["big.bin"]
    first = {k: _version(rng, k) for k in keys}
    model = Model()
    for k, v in first.items():
        model.add(k, v)
    make_bucket(moto.endpoint, bucket, first)
    cluster.s3_dataset(bucket, moto.endpoint, {"staleness": staleness})
    return model, first


def _overwrite(moto: MotoServer, bucket: str, model: Model, n: int, seed_: int) -> None:
    rng = random.Random(seed_)
    s3 = s3_client(moto.endpoint)
    keys = sorted(model.versions)
    for _ in range(n):
        k = rng.choice(keys)
        data = _version(rng, k)
        model.add(k, data)
        s3.put_object(Bucket=bucket, Key=k, Body=data)


def _read_loop(
    c: Client, model: Model, stop: threading.Event, out: dict[str, Any], seed_: int
) -> None:
    rng = random.Random(seed_)
    keys = sorted(model.versions)
    while not stop.is_set():
        k = rng.choice(keys)
        try:
            data = c.read(f"/ds/data/{k}")
        except Exception as exc:  # counted: a failed read is reported, see the test
            out["failed"] += 1
            if len(out["errors"]) < 5:
                out["errors"].append(f"{k}: {type(exc).__name__}: {exc}")
        else:
            if digest(data) not in model.allowed(k):
                out["wrong"] += 1
                out["errors"].append(f"{k}: bytes of no written version ({len(data)} bytes)")
        out["reads"] += 1


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("staleness", ["never", "always", "1"])
def test_reads_under_overwrites_return_only_written_versions(
    moto: MotoServer, cluster2: TestCluster, bucket: str, figures: Figures, staleness: str
) -> None:
    model, _ = _setup(moto, cluster2, bucket, staleness)
    stop = threading.Event()
    outs: list[dict[str, Any]] = []
    threads = []
    clients = [cluster2.client(short_circuit=sc, request_timeout=10.0) for sc in (True, False)]
    try:
        for i, c in enumerate(clients * 2):
            out: dict[str, Any] = {"reads": 0, "wrong": 0, "failed": 0, "errors": []}
            outs.append(out)
            threads.append(threading.Thread(target=_read_loop, args=(c, model, stop, out, i)))
        for t in threads:
            t.start()
        _overwrite(moto, bucket, model, OVERWRITES, 62)
        # and read on a while with the last versions in place
        target = sum(o["reads"] for o in outs) + 100
        wait_for(lambda: sum(o["reads"] for o in outs) >= target, 60, "more reads")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        for c in clients:
            c.close()
    reads = sum(o["reads"] for o in outs)
    wrong = sum(o["wrong"] for o in outs)
    failed = sum(o["failed"] for o in outs)
    errors = [e for o in outs for e in o["errors"]]
    figures.record(
        f"reads during {OVERWRITES} overwrites of {KEYS} objects, staleness={staleness}",
        reads,
        "every read is one written version (no mix, no torn object), 0 failed reads",
        wrong + failed,
    )
    assert reads > 100
    assert wrong == 0, errors[:5]
    assert failed == 0, errors[:5]


def _reaches_latest(c: Client, model: Model, bound: float) -> float:
    """Seconds until every key reads as its latest version (AssertionError past bound)."""
    t0 = time.monotonic()
    keys = sorted(model.versions)

    def all_latest() -> bool:
        return all(digest(c.read(f"/ds/data/{k}")) == model.latest(k) for k in keys)

    wait_for(all_latest, bound, "every key at its latest version", every=0.1)
    return time.monotonic() - t0


def _sync(cluster: TestCluster) -> None:
    with cluster.client() as c:
        job = c.submit_job({"kind": "sync", "dataset": "ds", "paths": [""]})
        wait_for(lambda: c.job(job["id"])["state"] == "done", 60, "the sync job", every=0.1)


@pytest.mark.parametrize(
    "short_circuit",
    [
        False,
        pytest.param(True, id="short_circuit"),
    ],
)
@pytest.mark.timeout(120)
def test_sync_reaches_long_running_readers_within_the_ring_refresh(
    moto: MotoServer, cluster2: TestCluster, bucket: str, figures: Figures, short_circuit: bool
) -> None:
    model, first = _setup(moto, cluster2, bucket, "never")
    bound = RING_REFRESH + 8.0  # the refresh, plus a sync's own round trips on a busy host
    with cluster2.client(short_circuit=short_circuit, ring_refresh=RING_REFRESH) as old:
        for k, v in first.items():  # cached, and known to this reader
            assert old.read(f"/ds/data/{k}") == v
        _overwrite(moto, bucket, model, 2 * KEYS, 63)
        # staleness=never: until the sync, the cached versions stand
        for k in first:
            assert digest(old.read(f"/ds/data/{k}")) in model.allowed(k)
        _sync(cluster2)
        with cluster2.client(short_circuit=short_circuit) as new:
            new_s = _reaches_latest(new, model, 5.0)
        old_s = _reaches_latest(old, model, bound)
    kind = "short-circuit" if short_circuit else "TCP"
    figures.record(
        f"after sync (staleness=never), {kind} readers: a new one, one that read before",
        2 * KEYS,
        f"latest version within {bound:.0f} s (ring refresh {RING_REFRESH:.0f} s)",
        0,
        new_reader_s=round(new_s, 1),
        old_reader_s=round(old_s, 1),
    )

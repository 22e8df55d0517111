"""Workers killed (SIGKILL) and hung (SIGSTOP) while several reader processes read:
every byte is checked against the source, and no read may fail."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from relhelpers import (
    Figures,
    Readers,
    load,
    ring_size,
    seed,
    wait_for,
    worker_info,
    worker_pid,
)

from shoal.client import Client
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
    reason="under load some reads went to the restarted worker's old port (1-25 of 40 "
    "in full runs, 0 alone). Suspected cause, fixed in issue 12 (see the next test): the "
    "old port reused by another listener answered garbage, a protocol error instead of "
    "a failover; kept non-strict until a loaded full run confirms it",
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


class _Squatter(threading.Thread):
    """A listener on a dead worker's old port that is no shoal worker (what a port
    reused by another program looks like): it answers every connection with an HTTP
    error and hangs up."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(daemon=True)
        self.sock = sock
        self.served = 0

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed: the test is over
            with conn:
                self.served += 1
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" * 4)


@pytest.mark.timeout(90)
def test_a_restarted_workers_old_port_taken_by_another_program_fails_over(
    moto: MotoServer, cluster2: TestCluster, bucket: str, figures: Figures
) -> None:
    """replicas=2, no fallback: worker 1 restarts on a new port and another program
    listens on its old one; then worker 0 dies. The reader's HELLO to the old port gets
    garbage: that is "no worker there" (a failover and a look at the ring, which has
    worker 1's new port), not a protocol error for the read."""
    files = sample_files(20, 1000, 20_000, seed=41)
    ds = seed(moto, cluster2, bucket, files, options={"replicas": "2"})
    load(cluster2)
    old = worker_info(cluster2, 1)
    failed: list[str] = []
    with cluster2.client(ufs_fallback=False, short_circuit=False, ring_refresh=60.0) as c:
        for k, v in files.items():  # the reader learns the ring: both workers
            assert c.read(ds.path(k)) == v
        cluster2.kill_worker(1)
        squat = socket.socket()
        squat.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            squat.bind((old["host"], int(old["port"])))
        except OSError as exc:
            squat.close()
            pytest.skip(f"the old port was taken before the test could: {exc}")
        squat.listen(64)
        squatter = _Squatter(squat)
        squatter.start()
        try:
            cluster2.restart_worker(1)  # binds port 0: never the squatted port
            cluster2.kill_worker(0)
            for k, v in files.items():
                try:
                    assert c.read(ds.path(k)) == v
                except Exception as exc:  # counted
                    failed.append(f"{type(exc).__name__}: {exc}")
        finally:
            squat.close()
    figures.record(
        "reads after a replica restarted, its old port taken by another program, and the "
        "other replica died",
        len(files),
        "0 failed reads (the garbage answer is a failover)",
        len(failed),
        error=failed[0][:100] if failed else "",
    )
    assert squatter.served >= 1  # the reader did knock on the old port
    assert not failed, failed[:3]


def test_read_fast_serves_located_files_while_their_worker_is_stopped(
    moto: MotoServer, cluster2: TestCluster, bucket: str
) -> None:
    """Issue 12 item 4: the one public fast entry (Client.read_fast, AsyncClient's too)
    serves a file whose pages a local worker handed over with no frame at all, so it
    answers while that worker is stopped; it says None (never an error) for what it
    cannot serve, and counts what it serves as short-circuit hits."""
    files = sample_files(6, 1000, 20_000, seed=43)
    ds = seed(moto, cluster2, bucket, files, options={"staleness": "never"})
    with cluster2.client() as c:
        k, data = next(iter(files.items()))
        path = ds.path(k)
        assert c.read_fast(path) is None  # nothing located in this process yet
        assert c.read(path) == data  # LOCATE_DIR / LOCATE: the descriptors come over
        before = c.counters()["short_circuit"]
        pids = [worker_pid(cluster2, i) for i in (0, 1)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            assert c.read_fast(path) == data
            assert c.read_fast(path, 10, 100) == data[10:110]
            assert c.read_fast("shoal:/" + path, 5, 5) == data[5:10]
            assert asyncio.run(_aio_read_fast(c, path)) == data
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert c.counters()["short_circuit"] == before + 4
        assert c.read_fast(ds.path("000/missing.bin")) is None
        assert c.read_fast("/nope") is None and c.read_fast("not a path") is None


async def _aio_read_fast(c: Client, path: str) -> bytes | None:
    # on a loop that is not the client's: the read is served, a flush goes to its loop
    return c.aio.read_fast(path)

"""The master SIGKILLed while reader processes read and a load runs: the master is off
the data path, so no read fails, and the load (resumed from the master's state) ends
with counts that add up."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from relhelpers import Figures, Readers, ring_size, seed, wait_for

from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.s3 import MotoServer

pytestmark = pytest.mark.integration

KILLS = 3


@pytest.fixture
def cluster2(tmp_path: Path, s3_credentials: None) -> Iterator[TestCluster]:
    c = start_cluster(tmp_path / "c", workers=2, mem="0")
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_master_sigkill_during_reads_and_a_load(
    moto: MotoServer, cluster2: TestCluster, bucket: str, readers: Readers, figures: Figures
) -> None:
    files = sample_files(400, 1000, 40_000, seed=81)
    ds = seed(moto, cluster2, bucket, files)
    keys = sorted(files)
    # the readers read the first half (cached by their own reads); the load brings in
    # the rest while the master dies under it
    want = {ds.path(k): ds.want[ds.path(k)] for k in keys[:200]}
    settings = {"request_timeout": 5.0, "ring_refresh": 1.0}
    readers.start(cluster2.master_url, want, 2, settings={**settings, "short_circuit": True})
    readers.start(cluster2.master_url, want, 1, settings={**settings, "short_circuit": False})
    readers.wait_reads(10, 60)
    with cluster2.client() as c:
        job = c.submit_job({"kind": "load", "dataset": "ds", "paths": [""]})
    for _ in range(KILLS):
        cluster2.restart_master(signal.SIGKILL)  # the same port and state directory
        readers.wait_more(30, 60)
        wait_for(lambda: ring_size(cluster2) == 2, 30, "the workers back in the ring")
    # API writes work after the restarts: a policy change
    with cluster2.client() as c:
        c.update_dataset("ds", {"readahead": "2"})
        state: dict[str, Any] = {}

        def finished() -> bool:
            state.update(c.job(job["id"]))
            return state["state"] in ("done", "failed")

        wait_for(finished, 120, "the load to finish", every=0.2)
    total = readers.stop()
    counted = state["files_done"] + state["files_skipped"] + state["files_failed"]
    figures.record(
        f"master SIGKILL x{KILLS} during reads (3 processes) and a load",
        total["reads"],
        "0 wrong bytes, 0 failed reads",
        total["wrong"] + total["failed"],
        kills=KILLS,
    )
    figures.record(
        f"load of {len(files)} files across {KILLS} master SIGKILLs",
        len(files),
        "done; done + skipped + failed = total files",
        int(state["state"] != "done") + abs(counted - len(files)),
        files_done=state["files_done"],
        files_skipped=state["files_skipped"],
    )
    assert total["wrong"] == 0 and total["failed"] == 0, total["errors"]
    assert state["state"] == "done", state
    assert counted == len(files), state
    with cluster2.client(short_circuit=False) as c:
        for k in keys[200:220]:
            assert c.read(ds.path(k)) == files[k]

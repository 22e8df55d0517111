"""A master whose own event loop stalls (a large task report, a slow disk) does not
expire the workers whose heartbeats waited in its socket meanwhile: expiry counts only
the time its loop could have read a heartbeat (shoal.master.loopclock). A worker that
really falls silent is still expired."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.proto.control import RING
from shoal.testing.cluster import TestCluster, start_cluster

pytestmark = pytest.mark.integration

EXPIRY = 2.0


@pytest.fixture
def small(tmp_path: Path) -> Iterator[TestCluster]:
    c = start_cluster(tmp_path / "c", workers=1, heartbeat=0.4, expiry=EXPIRY)
    try:
        yield c
    finally:
        c.stop()


def _ring(c: TestCluster) -> dict[str, Any]:
    with urllib.request.urlopen(c.master_url + RING, timeout=10) as r:
        body: dict[str, Any] = json.load(r)
    return body


def test_a_stalled_master_loop_expires_no_worker(small: TestCluster) -> None:
    before = _ring(small)
    assert len(before["workers"]) == 1
    pid = small.pids["master"]
    # the whole process stands still, as its loop does inside a long handler, while the
    # worker goes on sending heartbeats into its socket; the monotonic clock runs on
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(EXPIRY * 2)  # the stall itself, not a wait for an event
    finally:
        os.kill(pid, signal.SIGCONT)
    after = _ring(small)  # a ring answer expires first: it must find the worker live
    assert after["epoch"] == before["epoch"]
    assert [w["id"] for w in after["workers"]] == [w["id"] for w in before["workers"]]
    log = (small.dir / "master.log").read_text()
    assert "expired after" not in log
    assert "master loop stalled" in log


def test_a_silent_worker_is_still_expired(small: TestCluster) -> None:
    before = _ring(small)
    pid = small.pids["worker-0"]
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + EXPIRY * 10
        while time.monotonic() < deadline and _ring(small)["workers"]:
            time.sleep(0.1)  # polling the master's answer: no event to await across processes
        assert _ring(small)["workers"] == []
        assert _ring(small)["epoch"] > before["epoch"]
    finally:
        os.kill(pid, signal.SIGCONT)

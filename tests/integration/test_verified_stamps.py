"""Stamps end to end: a worker checks a data file's pages once when it first hands them
over, later readers on the node skip their own checksum while the file's ctime holds,
and a byte flipped behind everyone's back is still caught and refetched; a restarted
worker checks again before it stamps anything."""

from __future__ import annotations

import json
import os
import random
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.client import Client
from shoal.client.cache import RUN_CHECK
from shoal.testing.cluster import TestCluster, one_file_cluster

pytestmark = pytest.mark.integration

MiB = 1 << 20
PATH = "/ds/m/big.bin"


@pytest.fixture
def one(tmp_path: Path) -> Iterator[tuple[TestCluster, bytes]]:
    data = random.Random(16).randbytes(3 * MiB + 99)
    with one_file_cluster(tmp_path, data) as c:
        yield c, data


def _stamped(c: Client) -> dict[int, int]:
    """page index -> the stamp (or own check) this reader holds, for the big file (a
    worker's check of the file located as one run stands for each of its pages)."""
    cache = c._aio.cache
    got = {k[3]: v for k, v in cache.verified.items() if k[1] == "m/big.bin"}
    whole = got.pop(RUN_CHECK, None)
    for key, run in cache.runs.items():
        if key[1] == "m/big.bin" and whole is not None:
            got.update(dict.fromkeys(range(run.first, run.first + run.count), whole))
    return got


def _ctime(c: Client) -> int:
    cache = c._aio.cache
    (fd,) = cache.fds.values()
    return int(os.fstat(fd).st_ctime_ns)


def _until_stamped(cluster: TestCluster) -> Client:
    """A fresh reader that got stamps for every page with its first LOCATE."""
    deadline = time.monotonic() + 20
    while True:
        c = cluster.client()
        c.read(PATH, 0, 100)  # checks page 0 itself; pages 1-3 only if stamped
        got = _stamped(c)
        if set(got) == {0, 1, 2, 3} and set(got.values()) == {_ctime(c)}:
            return c
        c.close()
        if time.monotonic() > deadline:
            raise AssertionError(f"no stamps handed over: {got}")
        time.sleep(0.2)


def _corrupt_pages(cluster: TestCluster) -> float:
    w = json.loads((cluster.worker_dir(0) / "worker.json").read_text())
    with urllib.request.urlopen(f"http://127.0.0.1:{w['metrics_port']}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("shoal_corrupt_pages_total")
    )


def _flip_in_cache(cluster: TestCluster, needle: bytes) -> None:
    for f in (cluster.worker_dir(0) / "cache").rglob("*.data"):
        raw = f.read_bytes()
        at = raw.find(needle)
        if at >= 0:
            with open(f, "r+b") as fh:  # in place: the readers' descriptors see it
                fh.seek(at + 10)
                fh.write(bytes(b ^ 0xFF for b in needle[10:18]))
            return
    raise AssertionError("cached bytes not found")


def test_readers_trust_the_workers_check_and_still_catch_a_byte_flipped_behind_it(
    one: tuple[TestCluster, bytes],
) -> None:
    cluster, data = one
    with cluster.client() as warm:
        assert warm.read(PATH) == data
    reader = _until_stamped(cluster)
    try:
        assert reader.read(PATH) == data
        for i in (3, 0, 2, 1):
            assert reader.read(PATH, i * MiB, MiB) == data[i * MiB : (i + 1) * MiB]
        assert reader.counters()["corrupt"] == 0
        bad0 = _corrupt_pages(cluster)
        _flip_in_cache(cluster, data[2 * MiB + 500 : 2 * MiB + 564])  # page 2
        # the stamp is of the ctime before the write: this reader checks, and catches it
        assert reader.read(PATH) == data
        assert reader.read(PATH, 2 * MiB, MiB) == data[2 * MiB : 3 * MiB]
        assert reader.counters()["corrupt"] >= 1
        deadline = time.monotonic() + 10
        while _corrupt_pages(cluster) < bad0 + 1:
            assert time.monotonic() < deadline, "the worker did not drop the bad page"
            time.sleep(0.05)
    finally:
        reader.close()
    # refetched, checked again by the worker and stamped for the new ctime
    again = _until_stamped(cluster)
    try:
        assert again.read(PATH) == data
        assert again.counters()["corrupt"] == 0
    finally:
        again.close()


def test_a_restarted_worker_checks_a_file_again_before_it_stamps_it(
    one: tuple[TestCluster, bytes],
) -> None:
    cluster, data = one
    with cluster.client() as warm:
        assert warm.read(PATH) == data
    _until_stamped(cluster).close()
    cluster.kill_worker(0)
    cluster.restart_worker(0)
    # its checks were in memory only: the first reader after the restart gets none
    with cluster.client() as first:
        assert first.read(PATH, 0, 100) == data[:100]
        # page 0 only if it read it locally and checked it itself; never a stamp for 1-3
        assert set(_stamped(first)) <= {0}, "stamped before the restarted worker checked"
        assert first.read(PATH) == data
    with _until_stamped(cluster) as later:
        assert later.read(PATH) == data

"""A new reader process of a cached large file asks the local worker once: the whole
file comes back as one run (LocateReply.run), not in 256 MiB windows of a record per
page -- or, in a dataset that never revalidates, with the directory's other cached
files in one LOCATE_DIR answer (LocateDirReply.runs) -- and every byte read from it is
the file's."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from shoal.client.handover import LOCATE_AHEAD
from shoal.core.types import Mount
from shoal.proto import wire
from shoal.testing.cluster import TestCluster, one_file_cluster, start_cluster
from shoal.worker.ops import DIR_RUNS

pytestmark = pytest.mark.integration

MiB = 1 << 20
PS = 64 << 10
PATH = "/ds/m/big.bin"
#: past one LOCATE window, so that a reader of it page by page asked twice before
SIZE = LOCATE_AHEAD + 3 * MiB + 5


@pytest.fixture(params=["never", "3600s"])
def big(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TestCluster, bytes, str]]:
    data = os.urandom(SIZE)
    with one_file_cluster(tmp_path, data, "1GiB", {"staleness": request.param}) as c:
        yield c, data, request.param


def test_a_large_file_is_located_once_per_reader(big: tuple[TestCluster, bytes, str]) -> None:
    cluster, data, staleness = big
    with cluster.client() as warm:
        assert warm.read(PATH) == data  # cached whole
    with cluster.client() as reader:
        for off in range(0, SIZE, MiB):
            assert reader.read(PATH, off, MiB) == data[off : off + MiB], off
        for off in random.Random(3).sample(range(SIZE - 10), 50):  # any range, too
            assert reader.read(PATH, off, 3 * MiB) == data[off : off + 3 * MiB], off
        got = reader.counters()
        reads = len(range(0, SIZE, MiB)) + 50
        if staleness == "never":
            # the first read's LOCATE_DIR located it: every read a hit, no LOCATE
            assert (got["local"], got["short_circuit"]) == (0, reads)
        else:
            # the first read's LOCATE (each open revalidates: no directory answers)
            assert (got["local"], got["short_circuit"]) == (1, reads - 1)
        assert got["corrupt"] == 0


@contextmanager
def _cached(tmp_path: Path, want: dict[str, bytes]) -> Iterator[TestCluster]:
    """A one-worker cluster whose dataset ``ds`` (64 KiB pages) mounts a directory of
    ``want`` as ``m``, every file of it read once (cached whole)."""
    src = tmp_path / "src"
    for name, b in want.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(b)
    c = start_cluster(tmp_path / "c", workers=1, mem="0", disk="256MiB")
    try:
        with c.client() as cl:
            cl.create_dataset("ds", [Mount("m", f"file://{src}", {})], {"page_size": "64KiB"})
            for name, b in want.items():
                assert cl.read(f"/ds/m/{name}") == b
        yield c
    finally:
        c.stop()


def test_a_directory_of_large_and_small_files_takes_no_locate_per_file(
    tmp_path: Path,
) -> None:
    """A new reader of a directory of cached files of one and of several pages (an
    image-like mix) asks for the directory's locations once; past the large files one
    answer holds the rest are located one LOCATE each, and every byte is right."""
    rng = random.Random(7)
    want = {}
    large = DIR_RUNS + 6
    for i in range(large):  # 3-5 pages of 64 KiB, some pages short
        want[f"d/big{i:03d}"] = rng.randbytes(rng.randrange(2 * PS + 1, 5 * PS))
    for i in range(40):
        want[f"d/small{i:03d}"] = rng.randbytes(rng.randrange(1, PS))
    with _cached(tmp_path, want) as c, c.client() as reader:
        order = sorted(want)
        rng.shuffle(order)
        for name in order:
            assert reader.read(f"/ds/m/{name}") == want[name], name
        got = reader.counters()
    # one LOCATE_DIR taught the small files (one segment: one descriptor) and as many
    # of the large ones as the answer's other descriptors; each other large file took
    # a LOCATE of its own
    held = min(DIR_RUNS, wire.MAX_FDS - 1)
    assert got["local"] == large - held
    assert got["short_circuit"] == len(want) - (large - held)
    assert got["corrupt"] == 0


def test_a_dataset_answer_short_of_runs_is_completed_by_directory_answers(
    tmp_path: Path,
) -> None:
    """More large files than one answer holds, over several directories read in
    random order (a training epoch): the whole dataset's answer goes first (the third
    directory), each directory's answer brings the rest: no LOCATE for any file."""
    rng = random.Random(8)
    want = {}
    for d in range(4):
        # a third of an answer's runs each: more than one answer holds, and within
        # the descriptors one reader keeps (ClientCache.max_fds)
        for i in range(DIR_RUNS // 3):
            want[f"d{d}/big{i:03d}"] = rng.randbytes(rng.randrange(PS + 1, 3 * PS))
        for i in range(10):
            want[f"d{d}/small{i:03d}"] = rng.randbytes(rng.randrange(1, PS))
    with _cached(tmp_path, want) as c, c.client() as reader:
        # d0, d1, then d3: the third directory asks for the whole dataset's
        # answer, whose runs are d0's and d1's; d3's and d2's must come from their own
        order = ["d0/big000", "d1/big000", "d3/big000"]
        rest = sorted(set(want) - set(order))
        rng.shuffle(rest)
        for name in order + rest:
            assert reader.read(f"/ds/m/{name}") == want[name], name
        got = reader.counters()
    assert (got["local"], got["short_circuit"], got["corrupt"]) == (0, len(want), 0)


def _cache_fds(cluster: TestCluster) -> list[str]:
    """This process's descriptors of files under the cluster's directory."""
    root = str(cluster.dir)
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root):
            out.append(target)
    return out


def test_a_closed_client_keeps_no_descriptor_of_the_cache(tmp_path: Path) -> None:
    """The descriptors a worker handed over (runs, segments) are closed with the
    client: a process that makes and closes clients does not pile them up (before,
    each client's stayed open for the life of the process: past 1,024 of them,
    select() failed in the same process)."""
    rng = random.Random(9)
    want = {f"d/big{i}": rng.randbytes(3 * PS) for i in range(8)}
    want.update({f"d/small{i}": rng.randbytes(100 + i) for i in range(5)})
    with _cached(tmp_path, want) as c:
        before = _cache_fds(c)
        for _ in range(3):
            with c.client() as reader:
                for name in sorted(want):
                    assert reader.read(f"/ds/m/{name}") == want[name], name
                held = _cache_fds(c)
                assert len(held) > len(before)  # it was handed descriptors
                assert reader.counters()["short_circuit"] == len(want)
            assert _cache_fds(c) == before

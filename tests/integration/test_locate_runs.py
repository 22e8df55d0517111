"""A new reader process of a cached large file asks the local worker once: the whole
file comes back as one run (LocateReply.run), not in 256 MiB windows of a record per
page, and every byte read from it is the file's."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.client.handover import LOCATE_AHEAD
from shoal.testing.cluster import TestCluster, one_file_cluster

pytestmark = pytest.mark.integration

MiB = 1 << 20
PATH = "/ds/m/big.bin"
#: past one LOCATE window, so that a reader of it page by page asked twice before
SIZE = LOCATE_AHEAD + 3 * MiB + 5


@pytest.fixture
def big(tmp_path: Path) -> Iterator[tuple[TestCluster, bytes]]:
    data = os.urandom(SIZE)
    with one_file_cluster(tmp_path, data, disk="1GiB") as c:
        yield c, data


def test_a_large_file_is_located_once_per_reader(big: tuple[TestCluster, bytes]) -> None:
    cluster, data = big
    with cluster.client() as warm:
        assert warm.read(PATH) == data  # cached whole
    with cluster.client() as reader:
        for off in range(0, SIZE, MiB):
            assert reader.read(PATH, off, MiB) == data[off : off + MiB], off
        for off in random.Random(3).sample(range(SIZE - 10), 50):  # any range, too
            assert reader.read(PATH, off, 3 * MiB) == data[off : off + 3 * MiB], off
        got = reader.counters()
        assert got["local"] == 1  # the first read's LOCATE; the rest from its answer
        assert got["short_circuit"] == len(range(0, SIZE, MiB)) - 1 + 50
        assert got["corrupt"] == 0

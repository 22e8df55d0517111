"""Store requests and daemon client calls per metadata operation through the mount, as
the bench's meta workload does them: list every directory (one process), then stat its
files in random order (another process). Once a directory was listed, its stats cost
nothing more: no HEAD, no second listing; and a directory's entries (the
subdirectories) are answered from its listing too. (The mount keeps each listing's
entries itself, so this holds also once the kernel forgot its entries under memory
pressure: measured with a drop_caches, which a test must not do to the whole host.)"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from shoal.core.types import Mount
from shoal.testing.cluster import TestCluster
from shoal.testing.fuse import Mounted, can_mount, mounted
from shoal.testing.s3 import CountingProxy, MotoServer, make_bucket

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not can_mount(), reason="needs /dev/fuse and root"),
]

LS = "import os,sys\nfor d in sys.argv[1:]: os.listdir(d)"
STAT = "import os,sys\nfor k in sys.argv[1:]: os.stat(k)"


@contextmanager
def proxied_mount(
    moto: MotoServer, cluster: TestCluster, bucket: str, tmp_path: Path, files: dict[str, bytes]
) -> Iterator[tuple[CountingProxy, Mounted, Path]]:
    """``files`` in a bucket read through a counting proxy, dataset "ds" on it, mounted:
    (the proxy, the mount, the dataset's mount root in it)."""
    make_bucket(moto.endpoint, bucket, files)
    with CountingProxy(moto.endpoint) as proxy:
        with cluster.client() as c:
            c.create_dataset(
                "ds", [Mount("data", f"s3://{bucket}", {"endpoint_url": proxy.endpoint})]
            )
        with mounted(cluster.master_url, tmp_path) as m:
            yield proxy, m, m.path / "ds" / "data"


def run(code: str, *args: str) -> None:
    subprocess.run([sys.executable, "-c", code, *args], check=True, timeout=120)


def test_stats_after_listing_cost_no_store_requests(
    moto: MotoServer, cluster: TestCluster, bucket: str, tmp_path: Path
) -> None:
    rng = random.Random(5)
    files = {f"d{d}/f{i:03d}.bin": b"x" * (1 + i) for d in range(6) for i in range(20)}
    with proxied_mount(moto, cluster, bucket, tmp_path, files) as (proxy, m, root):
        dirs = sorted({k.rsplit("/", 1)[0] for k in files})
        os.stat(root)
        proxy.reset()
        calls0 = m.metrics().get("shoal_fuse_client_calls_total", 0)
        run(LS, *(str(root / d) for d in dirs))
        listed = proxy.counts()
        calls1 = m.metrics().get("shoal_fuse_client_calls_total", 0)
        order = sorted(files)
        rng.shuffle(order)
        proxy.reset()
        run(STAT, *(str(root / k) for k in order))
        counts = proxy.counts()
        calls2 = m.metrics().get("shoal_fuse_client_calls_total", 0)
        print("ls", listed, calls1 - calls0, "stat", counts, calls2 - calls1)
        assert sum(counts.values()) == 0, counts  # answered from the listings
        assert calls2 - calls1 == 0
        for k in order[:5]:
            assert os.stat(root / k).st_size == len(files[k])


def test_cold_stats_cost_one_listing_per_directory(
    moto: MotoServer, cluster: TestCluster, bucket: str, tmp_path: Path
) -> None:
    """Cold stats in random order over many directories, nothing listed before: at most
    one listing per directory (plus the first lookup's HEAD), never a HEAD per file."""
    rng = random.Random(6)
    files = {f"d{d}/f{i:03d}.bin": b"y" * (1 + i) for d in range(6) for i in range(20)}
    with proxied_mount(moto, cluster, bucket, tmp_path, files) as (proxy, _m, root):
        os.stat(root)
        order = sorted(files)
        rng.shuffle(order)
        proxy.reset()
        run(STAT, *(str(root / k) for k in order))
        counts = proxy.counts()
        print("stat", counts, proxy.counts_for(bucket))
        dirs = len({k.rsplit("/", 1)[0] for k in files})
        # per directory a lone lookup's HEAD, then one listing; the directories
        # from one listing of their parent
        assert counts.get("HEAD", 0) <= dirs + 1, counts
        assert proxy.counts_for(bucket).get("GET", 0) <= dirs + 2, counts
        for k in order[:5]:
            assert os.stat(root / k).st_size == len(files[k])

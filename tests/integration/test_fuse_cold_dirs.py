"""Cold reads through the mount of a dataset without a manifest: the lookups of a
directory's files are answered from one listing of it (not a store HEAD each), the
bytes are exact when many readers open files of the same cold directory at once, and
a sync after the listing still shows new names and new bytes."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shoal.core.types import Mount
from shoal.testing.cluster import TestCluster
from shoal.testing.fuse import can_mount, mounted
from shoal.testing.s3 import CountingProxy, MotoServer, make_bucket, s3_client

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not can_mount(), reason="needs /dev/fuse and root"),
]


def shoal(cluster: TestCluster, *args: str) -> None:
    env = dict(os.environ, SHOAL_MASTER=cluster.master_url, **cluster.env)
    r = subprocess.run(
        [sys.executable, "-m", "shoal", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr


def read(p: Path) -> bytes:
    with open(p, "rb", buffering=0) as f:
        return f.read()


def test_cold_directory_is_listed_once_not_stated_per_file(
    moto: MotoServer, cluster: TestCluster, bucket: str, tmp_path: Path
) -> None:
    rng = random.Random(21)
    files = {
        f"d{d}/f{i:03d}.bin": rng.randbytes(rng.randint(1, 60_000))
        for d in range(2)
        for i in range(60)
    }
    make_bucket(moto.endpoint, bucket, files)
    with CountingProxy(moto.endpoint) as proxy:
        with cluster.client() as c:  # no load: no manifest, every lookup is cold
            c.create_dataset(
                "ds", [Mount("data", f"s3://{bucket}", {"endpoint_url": proxy.endpoint})]
            )
        with mounted(cluster.master_url, tmp_path) as m:
            root = m.path / "ds" / "data"
            order = sorted(files)
            rng.shuffle(order)
            proxy.reset()
            with ThreadPoolExecutor(16) as pool:  # concurrent opens in both cold directories
                got = dict(zip(order, pool.map(lambda k: read(root / k), order), strict=True))
            assert got == {k: files[k] for k in order}
            counts = proxy.counts()
            # a HEAD per file before (120); now the first lookups of each directory at
            # most, then one listing answers for the rest
            assert counts.get("HEAD", 0) <= 20, counts
            assert counts.get("GET", 0) >= len(files), counts  # the reads themselves
            assert proxy.counts_for(bucket).get("GET", 0) <= 6, counts  # a few listings
            for k in order[:10]:  # warm now: the same bytes
                assert read(root / k) == files[k]

            # after the listing, a sync still brings new names and new bytes
            s3 = s3_client(moto.endpoint)
            changed = {"d0/f000.bin": b"new bytes", "d1/fresh.bin": b"a new name"}
            for k, b in changed.items():
                s3.put_object(Bucket=bucket, Key=k, Body=b)
            s3.delete_object(Bucket=bucket, Key="d0/f001.bin")
            shoal(cluster, "sync", "/ds", "--wait")
            for k, b in changed.items():
                assert read(root / k) == b, k
            with pytest.raises(FileNotFoundError):
                os.stat(root / "d0/f001.bin")
            assert read(root / "d1/f002.bin") == files["d1/f002.bin"]


def test_a_lone_lookup_does_not_list_its_directory(
    moto: MotoServer, cluster: TestCluster, bucket: str, tmp_path: Path
) -> None:
    """One stat in a large cold directory costs one HEAD, not a listing of it all."""
    files = {f"big/f{i:04d}": b"x" for i in range(50)}
    make_bucket(moto.endpoint, bucket, files)
    with CountingProxy(moto.endpoint) as proxy:
        with cluster.client() as c:
            c.create_dataset(
                "ds", [Mount("data", f"s3://{bucket}", {"endpoint_url": proxy.endpoint})]
            )
        with mounted(cluster.master_url, tmp_path) as m:
            root = m.path / "ds" / "data"
            os.stat(root / "big")  # the directory itself
            proxy.reset()
            assert os.stat(root / "big" / "f0007").st_size == 1
            assert read(root / "big" / "f0007") == b"x"
            assert proxy.counts().get("HEAD", 0) == 1, proxy.counts()
            assert proxy.counts_for(bucket).get("GET", 0) == 0  # no listing of the bucket

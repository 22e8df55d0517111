"""The mount after `shoal sync --wait`: a read that starts once the sync returned gets
the new bytes, also when the kernel held the old ones in its page cache (keep_cache)
or read them by passthrough from the local worker's data file."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.testing.cluster import TestCluster
from shoal.testing.fuse import can_mount, mounted
from shoal.testing.s3 import MotoServer, make_bucket, s3_client

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not can_mount(), reason="needs /dev/fuse and root"),
]

MiB = 1 << 20


def h(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def shoal(cluster: TestCluster, *args: str) -> None:
    env = dict(os.environ, SHOAL_MASTER=cluster.master_url, **cluster.env)
    r = subprocess.run(
        [sys.executable, "-m", "shoal", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr


def read(p: Path) -> bytes:
    with open(p, "rb", buffering=0) as f:
        out = bytearray()
        while chunk := f.read(MiB):
            out += chunk
        return bytes(out)


def test_reads_after_sync_are_new_bytes(
    moto: MotoServer, cluster: TestCluster, bucket: str, tmp_path: Path
) -> None:
    rng = random.Random(5)
    files = {"small.bin": rng.randbytes(50_000), "big.bin": rng.randbytes(3 * MiB + 17)}
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint)
    shoal(cluster, "load", "/ds", "--wait")
    s3 = s3_client(moto.endpoint)
    with mounted(cluster.master_url, tmp_path) as m:
        root = m.path / "ds" / "data"
        for name in files:  # twice: the kernel keeps the pages; big.bin in passthrough
            assert read(root / name) == files[name]
            assert read(root / name) == files[name]
        passthrough = m.state["passthrough"]
        if passthrough:
            opens = m.metrics()['shoal_fuse_opens_total{mode="passthrough"}']
            assert opens >= 1
        # the same size, then another size, then the same again: never the old bytes
        for i, delta in enumerate((0, 1234, 0, -999)):
            new = {n: rng.randbytes(len(b) + delta) for n, b in files.items()}
            for n, b in new.items():
                s3.put_object(Bucket=bucket, Key=n, Body=b)
            # the kernel still holds the old pages: read them (within staleness=never)
            assert h(read(root / "small.bin")) == h(files["small.bin"]), i
            sent = m.metrics()["shoal_fuse_notifications_total"]
            shoal(cluster, "sync", "/ds", "--wait")
            # small.bin was just read, so the kernel holds its inode and it must be
            # invalidated; the others only if the kernel still holds them (a
            # drop_caches elsewhere on the machine makes it forget inodes)
            assert m.metrics()["shoal_fuse_notifications_total"] >= sent + 1
            for n, b in new.items():
                assert os.stat(root / n).st_size == len(b), (i, n)
                assert h(read(root / n)) == h(b), (i, n)
                assert h(read(root / n)) == h(b), (i, n)
            files = new
        assert passthrough or not os.environ.get("SHOAL_TEST_NEEDS_PASSTHROUGH")
        if passthrough:
            shoal(cluster, "load", "/ds", "--wait")
            assert h(read(root / "big.bin")) == h(files["big.bin"])
            before = m.metrics()['shoal_fuse_opens_total{mode="passthrough"}']
            assert h(read(root / "big.bin")) == h(files["big.bin"])
            assert m.metrics()['shoal_fuse_opens_total{mode="passthrough"}'] > before


def test_names_added_and_deleted_by_a_sync(
    moto: MotoServer, cluster: TestCluster, bucket: str, tmp_path: Path
) -> None:
    """New names appear (the kernel's negative entries are invalidated) and deleted ones
    vanish, with the kernel's entries for them, as soon as the sync returned."""
    files = {"d/keep.bin": b"k" * 3000, "d/gone.bin": b"g" * 3000}
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint)
    shoal(cluster, "load", "/ds", "--wait")
    s3 = s3_client(moto.endpoint)
    with mounted(cluster.master_url, tmp_path) as m:
        d = m.path / "ds" / "data" / "d"
        assert sorted(os.listdir(d)) == ["gone.bin", "keep.bin"]
        assert read(d / "gone.bin") == files["d/gone.bin"]
        for _ in range(2):  # the kernel now holds a negative entry for new.bin
            with pytest.raises(FileNotFoundError):
                os.stat(d / "new.bin")
        s3.put_object(Bucket=bucket, Key="d/new.bin", Body=b"fresh")
        s3.delete_object(Bucket=bucket, Key="d/gone.bin")
        shoal(cluster, "sync", "/ds", "--wait")
        assert read(d / "new.bin") == b"fresh"
        with pytest.raises(FileNotFoundError):
            os.stat(d / "gone.bin")
        assert sorted(os.listdir(d)) == ["keep.bin", "new.bin"]
        assert read(d / "keep.bin") == files["d/keep.bin"]

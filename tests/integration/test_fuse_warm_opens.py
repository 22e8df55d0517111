"""The warm open's requests in the default mode, through a real mount: each open of a
cached file is one OPEN and one RELEASE, and a buffered ``open()`` adds one IOCTL (its
isatty(); the kernel hands every ioctl on). The daemon answers those on its fast path:
the OPEN from the inode table, the IOCTL ENOTTY without raising, counted as an error
reply like any other. Bytes stay exact on every read."""

from __future__ import annotations

import errno
import fcntl
import os
import termios
import time
from pathlib import Path

import pytest

from shoal.testing.cluster import TestCluster, sample_files
from shoal.testing.fuse import Mounted, can_mount, mounted
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not can_mount(), reason="needs /dev/fuse and root"),
]

ENOTTY = 'shoal_fuse_errors_total{errno="ENOTTY"}'


def released(m: Mounted, want: int, timeout: float = 30.0) -> int:
    """The RELEASE count once it reaches ``want`` (the kernel sends RELEASE in the
    background after close() returns), or what it was at the deadline."""
    deadline = time.monotonic() + timeout
    while (got := m.requests("RELEASE")) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_warm_opens_are_one_open_one_release_and_an_ioctl_per_isatty(
    moto: MotoServer, cluster: TestCluster, bucket: str, tmp_path: Path
) -> None:
    files = sample_files(60, 1, 120_000, seed=7)
    make_bucket(moto.endpoint, bucket, files)
    cluster.s3_dataset(bucket, moto.endpoint)
    with mounted(cluster.master_url, tmp_path) as m:
        root = m.path / "ds" / "data"
        for k, v in files.items():  # cold: read through the daemon, now cached
            assert (root / k).read_bytes() == v
        opens, ioctls = m.requests("OPEN"), m.requests("IOCTL")
        rel, notty = released(m, m.requests("OPEN")), m.metrics().get(ENOTTY, 0)
        for k, v in files.items():
            with open(root / k, "rb") as f:  # buffered: isatty() is one IOCTL
                assert f.read() == v
            with open(root / k, "rb", buffering=0) as f:  # raw: no isatty()
                assert f.read() == v
        n = len(files)
        assert m.requests("OPEN") - opens == 2 * n
        assert m.requests("IOCTL") - ioctls == n
        assert released(m, rel + 2 * n) - rel == 2 * n
        # an ioctl is refused as no terminal (Python's isatty() relies on it), counted
        fd = os.open(root / next(iter(files)), os.O_RDONLY)
        try:
            assert not os.isatty(fd)
            with pytest.raises(OSError) as exc:
                fcntl.ioctl(fd, termios.TCGETS, bytes(64))
            assert exc.value.errno == errno.ENOTTY
        finally:
            os.close(fd)
        assert m.metrics().get(ENOTTY, 0) - notty == n + 2

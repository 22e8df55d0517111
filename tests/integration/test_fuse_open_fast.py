"""The mount's kernel-open mode (``--kernel-open``): no OPEN or RELEASE round trip per
file, so nothing at open time drops the kernel's pages of an old version. A new
version the daemon learns when the kernel revalidates (staleness bound) must be
invalidated before the reply that carries its attributes: with the same size and
mtime the kernel's own check (AUTO_INVAL_DATA) sees no change and would read the
old pages. Large files' read windows are bounded (no RELEASE ever drops them) and
never mixed up."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from shoal.core.types import Mount
from shoal.fuse.ops import MAX_CHUNKS
from shoal.testing.cluster import TestCluster
from shoal.testing.fuse import can_mount, mounted
from shoal.testing.s3 import MotoServer, make_bucket, s3_client

#: the staleness bound (s)
BOUND = 1.0

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not can_mount(), reason="needs /dev/fuse and root"),
]


def raw_read(p: Path) -> bytes:
    """open(2) + read(2), no isatty(): no IOCTL round trip between the lookup's reply
    and the first read to let a late invalidation land first."""
    fd = os.open(p, os.O_RDONLY)
    try:
        out = b""
        while chunk := os.read(fd, 1 << 20):
            out += chunk
        return out
    finally:
        os.close(fd)


def test_new_version_same_size_is_never_read_from_old_pages(
    moto: MotoServer, cluster: TestCluster, bucket: str, tmp_path: Path
) -> None:
    """Read, overwrite (same size), read after the bound: the new bytes. The fault it
    guards against needs the store to report the same mtime for both versions (moto's
    listings carry milliseconds), so it does not fail reliably without the fix."""
    names = [f"f{i}.bin" for i in range(8)]
    make_bucket(moto.endpoint, bucket, {n: b"a" * 4096 for n in names})
    s3 = s3_client(moto.endpoint)
    with cluster.client() as c:
        mount = Mount("data", f"s3://{bucket}", {"endpoint_url": moto.endpoint})
        c.create_dataset("ds", [mount], {"staleness": f"{BOUND}s"})
    with mounted(cluster.master_url, tmp_path, "--kernel-open") as m:
        root = m.path / "ds" / "data"
        for i, n in enumerate(names):
            old, new = bytes([65 + i]) * 4096, bytes([97 + i]) * 4096  # same size
            time.sleep(1 - time.time() % 1)  # both PUTs in one second: the same mtime
            s3.put_object(Bucket=bucket, Key=n, Body=old)
            assert raw_read(root / n) == old  # now in the kernel's page cache
            s3.put_object(Bucket=bucket, Key=n, Body=new)
            # no event says the bound ran out: the kernel's entry (and the client's
            # metadata) expire with time; the next open revalidates (LOOKUP only: the
            # attributes it returns are valid again, no GETATTR before the read)
            time.sleep(BOUND + 0.2)
            assert raw_read(root / n) == new, n
        assert m.requests("OPEN") <= 1


def test_large_files_read_exact_past_the_kept_windows(
    moto: MotoServer, cluster: TestCluster, bucket: str, tmp_path: Path
) -> None:
    """More large files than read windows kept, read interleaved: each read is served
    from its own file's window or a fresh one, never another file's."""
    page = 64 * 1024
    files = {f"big{i:02d}.bin": os.urandom(3 * page + 10) for i in range(MAX_CHUNKS + 8)}
    make_bucket(moto.endpoint, bucket, files)
    with cluster.client() as c:
        mount = Mount("data", f"s3://{bucket}", {"endpoint_url": moto.endpoint})
        c.create_dataset("ds", [mount], {"page_size": "64KiB"})
    with mounted(cluster.master_url, tmp_path, "--kernel-open") as m:
        root = m.path / "ds" / "data"
        fds = {n: os.open(root / n, os.O_RDONLY | os.O_DIRECT) for n in sorted(files)}
        try:
            for off in range(0, 3 * page + 10, 16 * 1024):  # every file, window by window
                for n, fd in fds.items():
                    got = os.pread(fd, 16 * 1024, off)
                    assert got == files[n][off : off + 16 * 1024], (n, off)
        finally:
            for fd in fds.values():
                os.close(fd)
        assert m.requests("RELEASE") == 0

"""LocalStore.read_many: many files in one call, each read checked as ``read`` checks it
(inside the root, at its version), one result per range, a failure confined to its file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shoal.errors import (
    FatalStoreError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ShoalError,
    StaleVersion,
)
from shoal.ufs.local import LocalStore


def _version(p: Path) -> str:
    st = p.stat()
    return f"{st.st_size}-{st.st_mtime_ns}"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "d").mkdir(parents=True)
    for i in range(20):
        (r / "d" / f"f{i}").write_bytes(bytes([i]) * (100 + i))
    (r / "empty").write_bytes(b"")
    return r


async def test_every_range_comes_back_in_order_and_matches_read(root: Path) -> None:
    s = LocalStore(str(root))
    ranges = [(f"d/f{i}", 0, 100 + i, _version(root / "d" / f"f{i}")) for i in range(20)]
    ranges.append(("d/f3", 10, 20, None))
    ranges.append(("empty", 0, 0, _version(root / "empty")))
    got = await s.read_many(ranges)
    assert got[:20] == [bytes([i]) * (100 + i) for i in range(20)]
    assert got[20] == await s.read("d/f3", 10, 20) == bytes([3]) * 10
    assert got[21] == b""


async def test_a_failure_is_that_files_result_and_fails_no_other(
    root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "secret"
    outside.write_bytes(b"not for you")
    os.symlink(outside, root / "leak")
    (root / "d" / "f5").write_bytes(b"changed after it was listed")
    s = LocalStore(str(root))
    ranges = [
        ("d/f1", 0, 101, _version(root / "d" / "f1")),
        ("d/f5", 0, 105, "105-1"),  # the version the listing saw
        ("gone", 0, 10, "10-1"),
        ("leak", 0, 11, None),
        ("../root/d/f1", 0, 101, None),
        ("d", 0, 10, None),
        ("d/f2", 0, 102, _version(root / "d" / "f2")),
    ]
    got = await s.read_many(ranges)
    assert got[0] == bytes([1]) * 101 and got[6] == bytes([2]) * 102
    assert isinstance(got[1], StaleVersion) and "d/f5" in str(got[1])
    assert isinstance(got[2], NotFound)
    assert isinstance(got[3], PermissionDenied) and "leak" in str(got[3])
    assert isinstance(got[4], InvalidArgument)
    assert isinstance(got[5], FatalStoreError)  # a directory: EISDIR
    assert not any(isinstance(g, bytes) and b"not for you" in g for g in got)
    # the same answers as one read each
    for (path, start, end, version), g in zip(ranges, got, strict=True):
        if isinstance(g, ShoalError):
            with pytest.raises(type(g)):
                await s.read(path, start, end, version)


async def test_a_changed_empty_file_is_stale_not_empty(root: Path) -> None:
    s = LocalStore(str(root))
    listed = _version(root / "empty")
    (root / "empty").write_bytes(b"now it has bytes")
    (got,) = await s.read_many([("empty", 0, 0, listed)])
    assert isinstance(got, StaleVersion)

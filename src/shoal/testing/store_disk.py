"""Test helpers for the cache store on real disks: a small tmpfs to fill, and what a
tier directory really holds on disk (to compare with what the tier says it tracks)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(path: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (skips the test without root), unmounted
    (lazily, in case a process still holds a file there) when the block ends."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def data_bytes(tier_dir: Path) -> int:
    """Bytes of data files under a tier directory (segments and large files), counting
    only what is allocated for sparse files."""
    total = 0
    for sub in ("seg", "files"):
        for dirpath, _, names in os.walk(tier_dir / sub):
            for n in names:
                try:
                    st = os.lstat(os.path.join(dirpath, n))
                except FileNotFoundError:
                    continue
                total += min(st.st_size, st.st_blocks * 512)
    return total

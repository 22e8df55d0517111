"""Data a tier does not track (a lost index, a crash before a commit) is reclaimed in
slices after open, never what the tier tracks or is writing; cache files are private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from shoal.config import TierSpec
from shoal.store import layout
from shoal.store.disk import DiskTier
from shoal.testing.store_conformance import PAGE, blob, fkey, put_file
from shoal.testing.store_disk import data_bytes

MiB = 1 << 20


def fill(t: DiskTier, prefix: str, n: int) -> None:
    for i in range(n):
        size = 3 * PAGE + 7 if i % 4 == 0 else 1000 + i  # large and small files
        assert put_file(t, fkey(f"{prefix}{i}"), blob(i, size))


def reclaim_all(t: DiskTier, budget: int = 4) -> int:
    steps = 0
    while t.reclaim(budget):
        steps += 1
        assert steps < 10_000
    return steps


def test_lost_index_data_is_reclaimed_in_slices_and_tracked_data_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    spec = TierSpec("ssd", str(root), 64 * MiB)
    t = DiskTier(spec, segment_size=8 * 1024)
    fill(t, "old", 40)
    t.close()
    lost = data_bytes(root)
    assert lost > 100_000
    for name in (layout.INDEX_FILE, layout.INDEX_FILE + "-wal", layout.INDEX_FILE + "-shm"):
        (root / name).unlink(missing_ok=True)

    t = DiskTier(spec, segment_size=8 * 1024)
    try:
        assert t.usage().used == 0  # opening did not scan anything
        fill(t, "new", 12)  # written before and while the walk runs: never touched
        assert t.reclaim(4)  # a slice, not the whole walk
        fill(t, "newer", 12)
        assert reclaim_all(t) > 3
        assert not t.reclaim(4)  # once per open
        assert data_bytes(root) <= t.usage().used + 8 * 1024
        for prefix in ("new", "newer"):
            for i in range(12):
                size = 3 * PAGE + 7 if i % 4 == 0 else 1000 + i
                got = b"".join(
                    t.get(fkey(f"{prefix}{i}").page(p)) or b""
                    for p in range(-(-size // PAGE) if size > PAGE else 1)
                )
                assert got == blob(i, size), (prefix, i)
    finally:
        t.close()


def test_files_that_are_not_shoal_data_are_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    t = DiskTier(TierSpec("ssd", str(root), 64 * MiB))
    try:
        fill(t, "a", 4)
        (root / "seg" / "notes.txt").write_text("mine")
        (root / "files" / "README").write_text("mine")
        os.symlink("/etc/passwd", root / "seg" / "99999999.seg")
        reclaim_all(t)
        assert (root / "seg" / "notes.txt").exists() and (root / "files" / "README").exists()
        assert os.path.islink(root / "seg" / "99999999.seg")
    finally:
        t.close()


def test_cache_files_are_private_and_old_ones_are_made_private(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    spec = TierSpec("ssd", str(root), 64 * MiB)
    t = DiskTier(spec)
    fill(t, "a", 8)
    t.flush()
    modes = {}
    for dirpath, dirs, names in os.walk(root):
        for n in names:
            p = Path(dirpath, n)
            modes[str(p.relative_to(root))] = stat.S_IMODE(p.stat().st_mode)
        for d in dirs:
            p = Path(dirpath, d)
            assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p
    t.close()
    assert any(k.startswith("seg/") for k in modes) and any(k.startswith("files/") for k in modes)
    assert {k: m for k, m in modes.items() if m & 0o077} == {}
    # a cache written by an older version (0644) is made private by the walk
    for dirpath, _, names in os.walk(root / "seg"):
        for n in names:
            os.chmod(os.path.join(dirpath, n), 0o644)
    t = DiskTier(spec)
    try:
        reclaim_all(t)
        for p in (root / "seg").iterdir():
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    finally:
        t.close()

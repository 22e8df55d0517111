"""Overlay environments: keyed by the base environment, orphans pruned (pure logic, no pip)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.testing import overlay


def _fake_overlay(cache: Path, name: str, base: Path) -> Path:
    root = cache / name
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "zz-shoal-base.pth").write_text(f"import site; site.addsitedir({str(base)!r})\n")
    return root


def test_overlays_over_deleted_environments_are_pruned_and_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOAL_OVERLAY_CACHE", str(tmp_path / "cache"))
    live = tmp_path / "live-venv"
    live.mkdir()
    kept = _fake_overlay(tmp_path / "cache", "torchvision-aaa", live)
    orphan = _fake_overlay(tmp_path / "cache", "torchvision-bbb", tmp_path / "deleted-venv")
    other = _fake_overlay(tmp_path / "cache", "litdata-ccc", tmp_path / "deleted-venv")
    broken = tmp_path / "cache" / "torchvision-ddd"
    broken.mkdir()  # a build cut off before its .pth was written

    assert sorted(overlay.prune_orphans("torchvision")) == sorted([orphan, broken])
    assert kept.is_dir() and other.is_dir()
    assert not orphan.exists() and not broken.exists()


def test_the_overlay_key_names_the_base_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two venvs (two clones) get two overlays, so neither's .pth names the other's path."""
    monkeypatch.setenv("SHOAL_OVERLAY_CACHE", str(tmp_path / "cache"))
    roots = []
    for clone in ("a", "b", "a"):
        base = str(tmp_path / clone / "site-packages")
        monkeypatch.setattr(overlay.site, "getsitepackages", lambda b=base: [b])
        roots.append(overlay.overlay_root("torchvision", ["pkg==1"]))
    assert roots[0] != roots[1] and roots[0] == roots[2]
    assert roots[0].parent == tmp_path / "cache" and roots[0].name.startswith("torchvision-")

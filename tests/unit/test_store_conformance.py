"""Every page store passes the same conformance suite (shoal.testing.store_conformance)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.config import TierSpec
from shoal.store.base import PageStore
from shoal.store.disk import DiskTier
from shoal.store.tiered import TieredStore
from shoal.testing.store_conformance import PageStoreConformance, StoreFactory


class TestDiskTier(PageStoreConformance):
    @pytest.fixture
    def factory(self, tmp_path: Path) -> StoreFactory:
        def make(capacity: int = 64 << 20, eviction: str = "lru") -> PageStore:
            return DiskTier(TierSpec("ssd", str(tmp_path / "ssd"), capacity, eviction=eviction))

        return make


def _shm_dir() -> str | None:
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        return None
    return tempfile.mkdtemp(prefix="shoal-test-", dir="/dev/shm")


class TestDiskTierOnShm(PageStoreConformance):
    @pytest.fixture
    def factory(self) -> Iterator[StoreFactory]:
        root = _shm_dir()
        if root is None:
            pytest.skip("/dev/shm is not writable here")

        def make(capacity: int = 64 << 20, eviction: str = "lru") -> PageStore:
            return DiskTier(TierSpec("mem", root, capacity, eviction=eviction))

        yield make
        shutil.rmtree(root, ignore_errors=True)


class TestTieredStore(PageStoreConformance):
    """MEM over SSD, each half the capacity, evicted pages demoted from MEM to SSD."""

    @pytest.fixture
    def factory(self, tmp_path: Path) -> StoreFactory:
        run = uuid.uuid4().hex[:8]

        def make(capacity: int = 64 << 20, eviction: str = "lru") -> PageStore:
            specs = [
                TierSpec("ssd", str(tmp_path / f"ssd-{run}"), capacity // 2, eviction=eviction),
                TierSpec("mem", str(tmp_path / f"mem-{run}"), capacity // 2, eviction=eviction),
            ]
            return TieredStore.from_specs(specs)

        return make

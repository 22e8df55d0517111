"""Loader.load_many (the batched load of small files from a mount with read_many): the
same outcome per file as Loader.load -- fetched, skipped, failed -- with the version
checked, nothing cached under a version that changed, refusals and corrupt pages
reported, and retryable failures retried on their own."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from shoal.config import TierSpec
from shoal.core.types import CachePolicy, Dataset, FileKey, Mount
from shoal.errors import CorruptData, RetryableStoreError, ShoalError, StaleVersion
from shoal.store.disk import DiskTier
from shoal.testing.faultystores import FaultyUnderStore
from shoal.testing.store_conformance import blob, corrupt
from shoal.ufs.base import UnderStore
from shoal.ufs.local import LocalStore
from shoal.worker import datasets
from shoal.worker.datasets import DatasetTable
from shoal.worker.loader import Loader

PAGE = 4096


def listing(root: Path, names: Sequence[str]) -> list[list[Any]]:
    out = []
    for n in names:
        st = (root / n).stat()
        out.append([f"m/{n}", st.st_size, f"{st.st_size}-{st.st_mtime_ns}"])
    return out


class Setup:
    def __init__(
        self, tmp: Path, capacity: int = 64 << 20, pin: bool = False, src: Path | None = None
    ) -> None:
        """Files under ``tmp/src`` (or the existing ``src``), a store under ``tmp``."""
        tmp.mkdir(exist_ok=True)
        self.root = src or tmp / "src"
        self.names = [f"d{i % 3}/f{i:03d}" for i in range(60)]
        if src is None:
            self.root.mkdir()
            for i, n in enumerate(self.names):
                (self.root / n).parent.mkdir(exist_ok=True)
                (self.root / n).write_bytes(blob(i, 1 + (i * 97) % PAGE))
            (self.root / "empty").write_bytes(b"")
            (self.root / "large").write_bytes(blob(1000, 3 * PAGE + 5))
        self.table = DatasetTable(tmp / "datasets.json")
        policy = CachePolicy(page_size=PAGE, readahead=0, pin=pin)
        self.table.replace([Dataset("ds", (Mount("m", f"file://{self.root}"),), policy)], 1)
        self.store = DiskTier(TierSpec("ssd", str(tmp / "ssd"), capacity))
        self.loader = Loader(self.store, self.table)

    def cached(self, item: list[Any]) -> bytes | None:
        path, size, version = item
        fk = FileKey("ds", path, version)
        pages = [self.store.get(fk.page(i)) for i in range(max(1, -(-size // PAGE)))]
        if any(p is None for p in pages):
            return None
        return b"".join(p for p in pages if p is not None)

    async def close(self) -> None:
        await self.loader.close()
        await self.table.close()
        self.store.close()


@pytest.fixture
async def s(tmp_path: Path) -> Iterator[Setup]:  # type: ignore[misc]
    setup = Setup(tmp_path)
    yield setup
    await setup.close()


async def test_loads_skips_and_matches_load(s: Setup, tmp_path: Path) -> None:
    items = listing(s.root, [*s.names, "empty", "large"])
    batched, rest = s.loader.batchable("ds", items)
    assert len(batched) == len(s.names) + 1 and [items[i][0] for i in rest] == ["m/large"]
    got = await s.loader.load_many("ds", items, verify=True)
    assert got == [(True, it[1]) for it in items]
    for it in items:
        assert s.cached(it) == (s.root / it[0][2:]).read_bytes()
    assert s.loader.ufs_gets >= len(items)
    # again: every file is cached at its version, nothing is fetched
    gets = s.loader.ufs_gets
    assert await s.loader.load_many("ds", items, verify=False) == [(False, 0)] * len(items)
    assert s.loader.ufs_gets == gets
    # the same outcomes as Loader.load, one by one, on a fresh store
    other = Setup(tmp_path / "other", src=s.root)
    try:
        one = [await other.loader.load("ds", p, size, v, True) for p, size, v in items]
        assert one == got
    finally:
        await other.close()


async def test_a_file_changed_after_listing_is_stale_and_not_cached(s: Setup) -> None:
    items = listing(s.root, s.names[:10])
    (s.root / s.names[3]).write_bytes(b"rewritten since the listing")
    got = await s.loader.load_many("ds", items, verify=False)
    assert isinstance(got[3], StaleVersion)
    assert [g for i, g in enumerate(got) if i != 3] == [
        (True, it[1]) for it in items if it is not items[3]
    ]
    # nothing of the listed version is kept, nor remembered as current
    assert s.store.versions("ds", items[3][0]) == {}
    assert s.loader.cached_info(s.table.get("ds"), items[3][0]) is None


async def test_refused_puts_and_corrupt_pages_are_failures(tmp_path: Path) -> None:
    s = Setup(tmp_path, capacity=64 << 10, pin=True)  # pinned: nothing can be evicted
    try:
        items = listing(s.root, s.names)
        got = await s.loader.load_many("ds", items, verify=False)
        refused = [it for it, g in zip(items, got, strict=True) if isinstance(g, ShoalError)]
        assert refused and all("not cached" in str(g) for g in got if isinstance(g, ShoalError))
        assert all(s.cached(it) is None for it in refused)
        kept = [it for it, g in zip(items, got, strict=True) if g == (True, it[1])]
        assert len(kept) + len(refused) == len(items)
        assert all(s.cached(it) == (s.root / it[0][2:]).read_bytes() for it in kept)
        # a cached file whose page went bad fails verification
        fk = FileKey("ds", kept[0][0], kept[0][2])
        loc = s.store.locate(fk.page(0))
        assert loc is not None
        corrupt(loc)
        (bad,) = await s.loader.load_many("ds", [kept[0]], verify=True)
        assert isinstance(bad, CorruptData)
    finally:
        await s.close()


class Flaky(LocalStore):
    """read_many's first call fails every other file with a retryable error."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.calls = 0
        self.reads = 0

    async def read_many(self, ranges: Sequence[Any]) -> list[bytes | ShoalError]:
        self.calls += 1
        got = await super().read_many(ranges)
        if self.calls > 1:
            return got
        return [RetryableStoreError("injected") if i % 2 else g for i, g in enumerate(got)]

    async def read(self, path: str, start: int, end: int, version: str | None = None) -> bytes:
        self.reads += 1
        return await super().read(path, start, end, version)


async def test_retryable_failures_are_fetched_again_on_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Flaky] = []

    def open_flaky(mount: Mount) -> UnderStore:
        opened.append(Flaky(mount.uri[len("file://") :]))
        return opened[-1]

    monkeypatch.setattr(datasets, "open_store", open_flaky)
    s = Setup(tmp_path)
    try:
        items = listing(s.root, s.names[:20])
        got = await s.loader.load_many("ds", items, verify=True)
        assert got == [(True, it[1]) for it in items]
        assert opened[0].reads == 10  # the failed half, one read each
        assert all(s.cached(it) == (s.root / it[0][2:]).read_bytes() for it in items)
    finally:
        await s.close()


async def test_a_mount_without_read_many_loads_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = datasets.open_store
    monkeypatch.setattr(
        datasets, "open_store", lambda m: FaultyUnderStore(real(m), fail_on=(), methods=())
    )
    s = Setup(tmp_path)
    try:
        items = listing(s.root, s.names[:10])
        assert s.loader.batchable("ds", items) == ([], list(range(10)))
        assert await s.loader.load_many("ds", items, verify=False) == [
            (True, it[1]) for it in items
        ]
    finally:
        await s.close()

"""The worker's read-through path (Loader) over an under store that fails on chosen
calls (shoal.testing.faults.FaultyUnderStore): a failed fetch is an error, never bytes,
nothing of it is cached, and the next read returns the whole file. In process, fast."""

from __future__ import annotations

from pathlib import Path

import pytest
from relhelpers import Figures

from shoal.config import TierSpec
from shoal.core.types import CachePolicy, Dataset, FileKey, Mount
from shoal.errors import RetryableStoreError, StaleVersion
from shoal.store.base import Location
from shoal.store.disk import DiskTier
from shoal.testing.faults import FaultyUnderStore
from shoal.testing.store_conformance import blob, read_location
from shoal.ufs.base import UnderStore
from shoal.worker import datasets
from shoal.worker.datasets import DatasetTable
from shoal.worker.loader import Loader, Pages

PAGE = 4096
SIZE = 5 * PAGE + 123  # six pages


def _bytes(pages: Pages) -> bytes:
    return b"".join(read_location(p) if isinstance(p, Location) else bytes(p) for p in pages.pieces)


@pytest.fixture
def setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Loader, DiskTier, list[FaultyUnderStore], bytes]:
    root = tmp_path / "src"
    root.mkdir()
    data = blob(91, SIZE)
    (root / "a.bin").write_bytes(data)
    faulty: list[FaultyUnderStore] = []
    real = datasets.open_store

    def open_faulty(mount: Mount) -> UnderStore:
        # every second page read fails, as a flaky store would
        s = FaultyUnderStore(real(mount), fail_on=range(2, 1000, 2), methods=("read",))
        faulty.append(s)
        return s

    monkeypatch.setattr(datasets, "open_store", open_faulty)
    table = DatasetTable(tmp_path / "datasets.json")
    policy = CachePolicy(page_size=PAGE, readahead=0)
    table.replace([Dataset("ds", (Mount("m", f"file://{root}"),), policy)], 1)
    store = DiskTier(TierSpec("ssd", str(tmp_path / "ssd"), 64 << 20))
    return Loader(store, table), store, faulty, data


async def test_failed_fetches_are_errors_and_nothing_torn_is_cached(
    setup: tuple[Loader, DiskTier, list[FaultyUnderStore], bytes], figures: Figures
) -> None:
    loader, store, faulty, data = setup
    try:
        attempts = failures = 0
        got = b""
        for _ in range(10):  # each try completes some pages and fails on another
            attempts += 1
            try:
                got = _bytes(await loader.read("ds", "m/a.bin", None, 0, -1))
                break
            except RetryableStoreError:
                failures += 1
        assert failures >= 1 and faulty[0].faults.injected >= failures
        assert got == data
        # every page in the store is whole and right
        fk = FileKey("ds", "m/a.bin", (await loader.stat("ds", "m/a.bin")).version)
        for i in range(6):
            page = store.get(fk.page(i))
            assert page == data[i * PAGE : (i + 1) * PAGE]
        figures.record(
            "worker reads of a 6-page file, every 2nd store GET failing",
            attempts,
            "a read fails or returns the whole file; every cached page whole",
            0,
            injected_failures=failures,
        )
    finally:
        await loader.close()
        store.close()


async def test_a_version_gone_from_the_store_is_an_error_then_forgotten(
    setup: tuple[Loader, DiskTier, list[FaultyUnderStore], bytes], figures: Figures
) -> None:
    loader, store, faulty, data = setup
    try:
        assert _bytes(await loader.read("ds", "m/a.bin", None, 0, PAGE)) == data[:PAGE]
        f = faulty[0]
        f.faults.fail_on = None  # every read from now on: the object changed under us
        f.faults.error = lambda: StaleVersion("If-Match failed (injected)")
        with pytest.raises(StaleVersion):
            await loader.read("ds", "m/a.bin", None, 2 * PAGE, PAGE)
        fk = FileKey("ds", "m/a.bin", (await loader.stat("ds", "m/a.bin")).version)
        # the version that can never be completed is dropped whole, not kept half
        assert store.get(fk.page(0)) is None
        figures.record(
            "worker read of a page whose version vanished from the store",
            1,
            "StaleVersion raised; the half-cached version dropped",
            0,
        )
    finally:
        await loader.close()
        store.close()

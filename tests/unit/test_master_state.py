"""Master SQLite state: dataset CRUD, counters, worker rows, survival across reopen."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.core.membership import EXPIRED, LIVE, TierDecl, WorkerInfo, WorkerRecord
from shoal.core.types import CachePolicy, Dataset, Mount
from shoal.errors import DatasetExists, DatasetNotFound
from shoal.master.state import DB_NAME, MasterState


def ds(name: str = "imagenet") -> Dataset:
    return Dataset(
        name,
        (Mount("train", "s3://bucket/train", {"endpoint_url": "http://minio:9000"}),),
        CachePolicy(replicas=2),
    )


@pytest.fixture
def state(tmp_path: Path) -> Iterator[MasterState]:
    s = MasterState(str(tmp_path))
    yield s
    s.close()


def test_dataset_crud_and_generations(state: MasterState) -> None:
    assert state.datasets_generation == 0
    created = state.create_dataset(ds())
    assert created.generation == 1
    assert state.get_dataset("imagenet") == created
    assert state.datasets_generation == 1
    with pytest.raises(DatasetExists):
        state.create_dataset(ds())
    assert state.datasets_generation == 1

    updated = state.update_policy("imagenet", CachePolicy(replicas=3, pin=True))
    assert updated.generation == 2 and updated.policy.pin and updated.mounts == created.mounts
    assert state.datasets_generation == 2

    state.create_dataset(ds("coco"))
    assert [d.name for d in state.list_datasets()] == ["coco", "imagenet"]
    state.delete_dataset("coco")
    assert state.datasets_generation == 4
    with pytest.raises(DatasetNotFound):
        state.get_dataset("coco")
    with pytest.raises(DatasetNotFound):
        state.delete_dataset("coco")
    with pytest.raises(DatasetNotFound):
        state.update_policy("coco", CachePolicy())
    assert state.datasets_generation == 4


def test_uses_wal(state: MasterState) -> None:
    db = sqlite3.connect(state.path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


def test_survives_reopen(tmp_path: Path) -> None:
    s = MasterState(str(tmp_path))
    s.create_dataset(ds())
    s.update_policy("imagenet", CachePolicy(readahead=8))
    w = WorkerInfo("w1", "10.0.0.1", 7000, "/run/w1.sock", "n1", (TierDecl("ssd", "/c", 100),))
    s.save_workers([(WorkerRecord(w, LIVE, 5.0, {"corrupt_pages": 2}), 1234.5)], epoch=7)
    s.save_workers([(WorkerRecord(w, EXPIRED, 6.0), 1235.0)], epoch=3)  # epoch never goes back
    s.close()

    s = MasterState(str(tmp_path))
    try:
        got = s.get_dataset("imagenet")
        assert got.generation == 2 and got.policy.readahead == 8
        assert s.datasets_generation == 2
        assert s.ring_epoch == 7
        [stored] = s.load_workers()
        assert stored.info == w and stored.state == EXPIRED and stored.last_heartbeat_wall == 1235.0
        assert stored.stats == {}
        rec = stored.record(now=99.0)
        assert rec.state == EXPIRED and rec.last_heartbeat == 99.0
    finally:
        s.close()
    assert (tmp_path / DB_NAME).exists()

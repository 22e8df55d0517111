"""What a cached or listed file costs the worker in memory: no object of its own per
file that nobody reads (shared page sets, version tuples, a columnar manifest, a bounded
metadata cache), and the master's task reports leave the task's file list alone."""

from __future__ import annotations

import gc
import json
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest

from shoal.config import TierSpec
from shoal.core.jobs import JobSpec
from shoal.core.manifest import Entry, Manifest
from shoal.core.ring import Ring
from shoal.core.types import Dataset, FileInfo, FileKey, Mount
from shoal.master.jobs import JobManager
from shoal.master.jobstate import JobState, Task
from shoal.store.base import PutMeta
from shoal.store.catalog import PAGE_0
from shoal.store.disk import DiskTier
from shoal.worker import loader as loader_mod


def _traced(make: object) -> tuple[object, int]:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = make()  # type: ignore[operator]
        gc.collect()
        return out, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_a_cached_small_file_costs_the_tier_well_under_a_kilobyte(tmp_path: Path) -> None:
    n = 4000
    keys = [FileKey("ds", f"m/d{i // 100:03d}/f{i:06d}.bin", f"v{i:06d}") for i in range(n)]
    tier = DiskTier(TierSpec("ssd", str(tmp_path / "ssd"), 1 << 30))
    meta = PutMeta(100, 1 << 20)
    data = b"x" * 100
    try:

        def fill() -> None:
            for k in keys:
                assert tier.put(k.page(0), data, meta)
            tier.flush()

        _, used = _traced(fill)
        cat = tier._cat
        assert all(cat.files[k].pages is PAGE_0 for k in keys)  # one shared set, not n
        assert all(type(v) is tuple for v in cat.by_path["ds"].values())
        # measured 1,090 bytes per file before (a set per file twice), 710 after
        assert used / n < 850, f"{used / n:.0f} bytes per cached file"
        # the shared sets behave as the per-file ones did
        assert tier.delete(keys[0]) == 100 and not tier.contains(keys[0].page(0))
        assert tier.versions("ds", keys[1].path) == {keys[1].version: 100}
        assert {fk.path for fk in tier.files("ds", "m/d000")} == {k.path for k in keys[1:100]}
    finally:
        tier.close()


def test_the_manifest_is_held_as_columns_and_answers_as_before() -> None:
    n = 20_000
    entries = [
        Entry(f"m/d{i // 500:03d}/f{i:06d}", i, f"v{i}", 1.5 + i, 0, "m/x" if i == 7 else "")
        for i in range(n)
    ]
    raw = Manifest("ds", reversed(entries), 3.0).to_bytes()
    back, used = _traced(lambda: Manifest.from_bytes(raw))
    assert isinstance(back, Manifest)
    # measured 335 bytes per entry with an Entry object per file, 188 as columns
    assert used / n < 260, f"{used / n:.0f} bytes per manifest entry"
    assert len(back) == n and back.total_bytes == sum(range(n)) and back.built_at == 3.0
    assert back.get("m/d000/f000007") == entries[7] and entries[7].link == "m/x"
    assert back.get("m/d000/f00000") is None and back.is_dir("m/d001")
    assert [e.path for e in back.under("m/d002")] == [e.path for e in entries[1000:1500]]
    assert len(back.ls("m")) == 40 and back.ls("m/d000")[3].path == "m/d000/f000003"
    assert Manifest.from_bytes(back.to_bytes()).to_bytes() == back.to_bytes()
    fresh = [["m/d000/f000001", 5, "w", 2.0], ["m/new", 1, "v", 1.0, 1_000_000_000]]
    a = back.merge_rows(["m/d000"], fresh, 4.0)
    b = back.merge(["m/d000"], [Entry.from_row(r) for r in fresh], 4.0)
    assert a.to_bytes() == b.to_bytes() and len(a) == n - 500 + 2
    changed, gone = back.diff(a, ["m/d000"])
    assert [e.path for e in changed] == ["m/d000/f000001"] and len(gone) == 499


def test_the_loaders_metadata_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader_mod, "META_MAX", 100)

    class Store:
        def delete(self, fk: FileKey) -> int:
            raise AssertionError("no version changed")

    ld = loader_mod.Loader(Store(), None)  # type: ignore[arg-type]
    ds = Dataset("ds", (Mount("m", "file:///x"),))
    for i in range(1000):
        ld._remember(ds, f"m/f{i}", FileInfo(f"m/f{i}", 1, "v"))
    assert len(ld._meta) == 100 and ("ds", "m/f999") in ld._meta and ("ds", "m/f0") not in ld._meta


def test_a_progress_report_does_not_rewrite_the_tasks_file_list(tmp_path: Path) -> None:
    ds = {"ds": Dataset("ds", (Mount("m", "file:///x"),))}

    def set_manifest(name: str, mid: str) -> Dataset:
        ds[name] = replace(ds[name], manifest=mid)
        return ds[name]

    state = JobState(str(tmp_path))
    jm = JobManager(state, ds.__getitem__, lambda: Ring.build(1, ["w1"]), set_manifest)
    job = jm.submit(JobSpec("load", "ds"))
    lst = jm.claim("w1")
    assert lst is not None
    entries = [[f"m/f{i}", 10, "v1", 0.0] for i in range(50)]
    jm.report(lst["id"], {"attempt": lst["attempt"], "seq": 1, "final": True, "entries": entries})
    task = jm.claim("w1")
    assert task is not None and len(task["items"]) == 50
    tid = task["id"]
    dumped: list[int] = []
    real = state.put_task
    monkeypatch = pytest.MonkeyPatch()

    def put_task(t: Task) -> None:
        dumped.append(t.id)
        real(t)

    monkeypatch.setattr(state, "put_task", put_task)
    try:
        prog = {"files_done": 10, "bytes_done": 100}
        jm.report(tid, {"attempt": task["attempt"], "seq": 1, "progress": prog})
        assert dumped == []  # counts written, items left as they are
        whole = state.task(tid)
        assert whole is not None and len(whole.items) == 50 and whole.run.files_done == 10
        rest = task["items"][10:]
        stop = {"attempt": task["attempt"], "seq": 2, "final": True, "remaining": rest}
        jm.stop(job["id"])
        jm.report(tid, stop | {"progress": prog})
    finally:
        monkeypatch.undo()
    whole = state.task(tid)
    assert whole is not None and whole.items == json.loads(json.dumps(rest))

import time

from shoal.core.manifest import Entry, Manifest


def m(paths: list[str], v: str = "v1") -> Manifest:
    return Manifest("ds", [Entry(p, len(p), v, 0.0) for p in paths], time.time())


def test_ls_children_files_and_dirs() -> None:
    man = m(["train/a/1.jpg", "train/a/2.jpg", "train/b.jpg", "train/a-b/x", "labels/l.txt"])
    assert [(e.path, e.is_dir) for e in man.ls("")] == [("labels", True), ("train", True)]
    assert [(e.path, e.is_dir) for e in man.ls("train")] == [
        ("train/a-b", True),
        ("train/a", True),
        ("train/b.jpg", False),
    ]  # byte order
    assert [e.path for e in man.ls("train/a")] == ["train/a/1.jpg", "train/a/2.jpg"]
    assert man.ls("nosuch") == []
    assert man.is_dir("train/a") and not man.is_dir("train/b.jpg")
    assert man.get("train/b.jpg") is not None and man.get("train") is None


def test_select_and_merge_and_diff() -> None:
    man = m(["t/a", "t/b", "u/c"])
    assert [e.path for e in man.select(["t"])] == ["t/a", "t/b"]
    assert [e.path for e in man.select([""], "*/c")] == ["u/c"]
    assert [e.path for e in man.select(["t/a", "t"])] == ["t/a", "t/b"]
    new = man.merge(["t"], [Entry("t/a", 1, "v2", 0.0), Entry("t/z", 1, "v1", 0.0)], 1.0)
    assert [e.path for e in new.select([""])] == ["t/a", "t/z", "u/c"]
    changed, gone = man.diff(new, ["t"])
    assert [e.path for e in changed] == ["t/a", "t/z"] and gone == ["t/b"]


def test_round_trip_and_a_million_entries_list_fast() -> None:
    paths = [f"train/{i // 1000:04d}/{i:07d}.jpg" for i in range(200_000)]
    man = m(paths)
    back = Manifest.from_bytes(man.to_bytes())
    assert len(back) == len(man) and back.get(paths[12345]) == man.get(paths[12345])
    assert len(back.ls("train")) == 200
    assert len(back.ls("train/0007")) == 1000


def test_nanosecond_mtimes_round_trip_and_format_1_is_read() -> None:
    import msgpack

    ns = 1_700_000_000_123_456_789
    man = Manifest("ds", [Entry("m/a", 1, "v", ns / 1e9, ns)], 1.0)
    back = Manifest.from_bytes(man.to_bytes())
    e = back.get("m/a")
    assert e is not None and e.mtime_ns == ns and e.info().mtime_ns == ns
    assert Entry.from_row(["m/b", 2, "v", 1.5]).mtime_ns == 1_500_000_000
    v1 = {"v": 1, "dataset": "ds", "built_at": 1.0, "entries": [["m/a", 1, "v", 1.5]]}
    old = Manifest.from_bytes(msgpack.packb(v1, use_bin_type=True))
    got = old.get("m/a")
    assert got is not None and got.mtime == 1.5 and got.mtime_ns == 1_500_000_000

import time

import pytest

from shoal.core.manifest import Entry, Manifest
from shoal.errors import ProtocolError


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


def _v3(man: Manifest, **change: object) -> bytes:
    import msgpack

    body = msgpack.unpackb(man.to_bytes(), raw=False)
    assert body["v"] == 3
    body.update(change)
    out: bytes = msgpack.packb(body, use_bin_type=True)
    return out


def test_columns_round_trip_every_field_and_ls_takes_a_prefix() -> None:
    ns = 1_700_000_000_123_456_789
    entries = [
        Entry("m/a", 10, "va", ns / 1e9, ns),
        Entry("m/d/b", 1 << 40, "vb", 1.5),
        Entry("m/l", 0, "vl", 2.0, 0, "m/a"),  # a symbolic link to m/a
    ]
    back = Manifest.from_bytes(Manifest("ds", entries, 3.0).to_bytes())
    assert back.built_at == 3.0 and [back.get(e.path) for e in entries] == entries
    listed = back.ls("m", "/ds/")
    assert [(e.path, e.size, e.version, e.is_dir, e.link) for e in listed] == [
        ("/ds/m/a", 10, "va", False, ""),
        ("/ds/m/d", 0, "", True, ""),
        ("/ds/m/l", 0, "vl", False, "m/a"),
    ]
    assert listed[0].mtime_ns == ns and listed[0].mtime == ns / 1e9


def test_format_2_rows_are_still_read() -> None:
    import msgpack

    ns = 1_700_000_000_123_456_789
    rows = [["m/a", 1, "v", ns / 1e9, ns], ["m/l", 0, "w", 2.0, 0, "m/a"]]
    v2 = {"v": 2, "dataset": "ds", "built_at": 1.0, "entries": rows}
    old = Manifest.from_bytes(msgpack.packb(v2, use_bin_type=True))
    a, link = old.get("m/a"), old.get("m/l")
    assert a is not None and a.mtime_ns == ns
    assert link is not None and link.link == "m/a" and link.version == "w"


@pytest.mark.parametrize(
    "change",
    [
        {"paths": ["m/b", "m/a"]},  # not sorted: ls and stat bisect it
        {"paths": ["m/a", "m/a"]},  # not unique
        {"paths": ["m/a", 7]},
        {"versions": ["v"]},  # another length
        {"versions": ["v", None]},
        {"sizes": b"\0" * 8},  # one item short
        {"mtimes": "not bytes"},
        {"ns": None},
        {"links": [[5, "m/a"]]},  # no such entry
        {"links": [[0, ""]]},
        {"paths": "m/a"},
    ],
)
def test_a_malformed_manifest_is_a_protocol_error(change: dict[str, object]) -> None:
    man = Manifest("ds", [Entry("m/a", 1, "v", 1.0), Entry("m/b", 2, "v", 1.0)], 1.0)
    with pytest.raises(ProtocolError, match="unreadable manifest"):
        Manifest.from_bytes(_v3(man, **change))


@pytest.mark.parametrize("splice_max", [256, 0])  # columns spliced; one pass over rows
def test_replacing_named_files_equals_a_rebuild(
    splice_max: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    from shoal.core import manifest as m

    monkeypatch.setattr(m, "SPLICE_MAX", splice_max)
    rng = random.Random(7)
    for _ in range(60):
        n = rng.randrange(0, 40)
        base = [
            Entry(
                f"d{rng.randrange(5)}/f{i:03d}", i, f"v{i}", 1.5 + i, 0, rng.choice(["", "", "t"])
            )
            for i in range(n)
        ]
        old = Manifest("ds", base, 1.0)
        paths = [e.path for e in base]
        named = rng.sample(paths, min(len(paths), rng.randrange(0, 4)))
        named += [f"d{rng.randrange(5)}/new{k}" for k in range(rng.randrange(0, 3))]
        # each named file: listed again (changed or new) or gone from under storage
        fresh = [
            [p, 7, f"w{k}", 9.25, 9_250_000_001 + k, rng.choice(["", "lnk"])]
            for k, p in enumerate(named)
            if rng.random() < 0.7
        ]
        got = old.replace_rows(named, fresh, 2.0)
        want = Manifest(
            "ds",
            [e for e in base if e.path not in set(named)] + [Entry.from_row(r) for r in fresh],
            2.0,
        )
        assert got.to_bytes() == want.to_bytes(), (named, fresh)
        assert old.to_bytes() == Manifest("ds", base, 1.0).to_bytes()  # the old one unchanged

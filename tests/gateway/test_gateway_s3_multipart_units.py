"""The shared multipart state of the S3 gateway without processes: expiry of abandoned
uploads (clock injected), racing re-sent parts, leftovers, ids, copy-source ranges."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from shoal.gateway.s3_copy import copy_range
from shoal.gateway.s3_multipart import Upload, Uploads
from shoal.gateway.s3_xml import S3Error


def _uploads(tmp_path: Path, max_age: float = 100.0) -> Uploads:
    return Uploads(tmp_path / "spool", tmp_path / "up", max_age)


def _part(u: Uploads, up: Upload, n: int, body: bytes, etag: str, mtime: float) -> None:
    tmp = u.part_tmp(up)
    tmp.write_bytes(body)
    os.utime(tmp, (mtime, mtime))
    u.add_part(up, n, tmp, etag)


def test_idle_uploads_expire(tmp_path: Path) -> None:
    u = _uploads(tmp_path)
    now = time.time()
    idle, busy = u.create("b", "k1", "w"), u.create("b", "k2", "w")
    assert b"<Key>k1</Key>" in u.list_doc("b", {}) and b"<Key>k2</Key>" in u.list_doc("b", {})
    assert u.sweep(now + 50) == []
    # busy was initiated long ago but got a part a moment ago: its activity counts
    meta = json.loads((busy.dir / "upload.json").read_text())
    (busy.dir / "upload.json").write_text(json.dumps({**meta, "initiated": now - 1000}))
    _part(u, busy, 1, b"x", "0" * 32, now)
    os.utime(busy.dir, (now + 140, now + 140))
    assert u.sweep(now + 150) == [idle.id]
    assert u.load(idle.id) is None and not idle.dir.exists()
    assert u.load(busy.id) is not None
    doc = u.list_doc("b", {})
    assert b"<Key>k1</Key>" not in doc and b"<Key>k2</Key>" in doc
    assert u.sweep(now + 500) == [busy.id]
    assert os.listdir(u.root / ".trash") == []


def test_leftovers_are_swept(tmp_path: Path) -> None:
    u = _uploads(tmp_path)
    now = time.time()
    (u.root / ".trash" / "half-removed").mkdir()
    (u.root / ".trash" / "half-removed" / "p00001.x").write_bytes(b"x")
    fresh, stale = u.root / ".tmp" / "fresh", u.root / ".tmp" / "stale"
    fresh.mkdir()
    stale.mkdir()
    os.utime(stale, (now - 1000, now - 1000))
    (u.root / "not-an-upload").mkdir()
    assert u.sweep(now) == []
    assert os.listdir(u.root / ".trash") == []
    assert fresh.exists() and not stale.exists()
    assert (u.root / "not-an-upload").exists()  # not a name this module gives out


def test_the_newest_resent_part_wins(tmp_path: Path) -> None:
    u = _uploads(tmp_path)
    up = u.create("b", "k", "w")
    now = time.time()
    # two uploads of part 1 race: the newer bytes land first, the older ones after
    _part(u, up, 1, b"newer", "b" * 32, now)
    _part(u, up, 1, b"old", "a" * 32, now - 10)
    assert u.parts(up)[1].etag == "b" * 32 and u.parts(up)[1].size == 5
    _part(u, up, 1, b"newest", "c" * 32, now + 10)  # a later re-send removes both
    assert [p.name for p in sorted(up.dir.glob("p*"))] == [f"p00001.{'c' * 32}"]
    u.drop(up)
    with pytest.raises(S3Error) as e:
        u.parts(up)
    assert e.value.code == "NoSuchUpload"
    tmp = u.part_tmp(up)
    with pytest.raises(FileNotFoundError):
        tmp.write_bytes(b"late")  # a part arriving after the abort has nowhere to go


def test_ids_and_metadata(tmp_path: Path) -> None:
    u = _uploads(tmp_path)
    up = u.create("b", "dir/k", "w")
    assert len(up.id) == 32 and up.id != u.create("b", "dir/k", "w").id
    got = u.load(up.id)
    assert got is not None and (got.bucket, got.key, got.owner) == ("b", "dir/k", "w")
    for bad in ("", "..", "../up/" + up.id, up.id + "x", ".trash"):
        assert u.load(bad) is None
    assert oct((u.root / up.id).stat().st_mode & 0o777) == "0o700"
    assert b"<Uploads>" not in u.list_doc("other", {})
    assert up.id.encode() not in u.list_doc("b", {"prefix": "elsewhere/"})


def test_copy_range() -> None:
    assert copy_range(None, 10) == (0, 10)
    assert copy_range("bytes=0-9", 10) == (0, 10)
    assert copy_range("bytes=3-3", 10) == (3, 1)
    for bad in ("bytes=5-4", "bytes=0-", "bytes=-5", "bytes=a-b", "0-4", "bytes=0-1,3-4"):
        with pytest.raises(S3Error) as e:
            copy_range(bad, 10)
        assert (e.value.code, e.value.status) == ("InvalidArgument", 400), bad
    with pytest.raises(S3Error) as e:
        copy_range("bytes=0-10", 10)
    assert (e.value.code, e.value.status) == ("InvalidRange", 416)

"""DirAnswers: kept LOCATE_DIR answers and their descriptors follow the store."""

from __future__ import annotations

import os
from pathlib import Path

from shoal.core.types import CachePolicy, Dataset, Mount
from shoal.worker.handover import DirAnswer, DirAnswers, Handover


def _ds(generation: int = 1, ttl: float = 0.0) -> Dataset:
    return Dataset("ds", (Mount("m", "file:///x"),), CachePolicy(ttl=ttl), generation=generation)


def _handover(tmp_path: Path, names: list[str]) -> Handover:
    h = Handover()
    for n in names:
        p = tmp_path / n
        p.write_bytes(n.encode())
        assert h.slot(str(p)) is not None
    return h


def _ans(meta: bytes, h: Handover, runs: bool = False) -> DirAnswer:
    return DirAnswer(meta, h, runs)


def _meta(got: tuple[DirAnswer, list[int]] | None) -> tuple[bytes, list[int]] | None:
    return None if got is None else (got[0].meta, got[1])


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def test_answers_are_kept_until_the_store_moves(tmp_path: Path) -> None:
    stamp = [1]
    d = DirAnswers(lambda: stamp[0])
    ds = _ds()
    assert d.get(ds, "a", False) is None
    h = _handover(tmp_path, ["s1", "s2"])
    fds = d.put(ds, "a", _ans(b"answer-a", h))
    assert fds is not None and h.fds == []  # owned by the cache now
    assert _meta(d.get(ds, "a", False)) == (b"answer-a", fds)
    assert d.get(ds, "a", True) is None  # an answer with runs is another answer
    # a second answer naming the same file shares its descriptor
    h2 = _handover(tmp_path, ["s2"])
    fds2 = d.put(ds, None, _ans(b"whole", h2, True))
    assert fds2 == [fds[1]]
    assert _meta(d.get(ds, None, True)) == (b"whole", fds2)
    # another generation of the dataset (a sync, a policy change) is a miss
    assert d.get(_ds(generation=2), "a", False) is None
    # the store moved: everything is dropped and the descriptors closed
    stamp[0] = 2
    assert d.get(ds, "a", False) is None and d.get(ds, None, True) is None
    assert not any(_open(fd) for fd in fds)


def test_nothing_is_kept_under_a_ttl_or_an_untracked_store(tmp_path: Path) -> None:
    d = DirAnswers(lambda: 1)
    h = _handover(tmp_path, ["s1"])
    assert d.put(_ds(ttl=60), "a", _ans(b"x", h)) is None
    assert h.fds and _open(h.fds[0])  # still the sender's to close
    h.abort()
    untracked = DirAnswers(lambda: None)
    h = _handover(tmp_path, ["s1"])
    assert untracked.put(_ds(), "a", _ans(b"x", h)) is None
    h.abort()


def test_answers_are_bounded_in_bytes(tmp_path: Path) -> None:
    d = DirAnswers(lambda: 1, limit=1000)
    ds = _ds()
    for i in range(10):
        assert d.put(ds, f"d{i}", _ans(bytes(200), _handover(tmp_path, [f"s{i}"]))) is not None
    kept = [i for i in range(10) if d.get(ds, f"d{i}", False) is not None]
    assert kept == [5, 6, 7, 8, 9]  # the least recently used went first
    assert d.put(ds, "huge", _ans(bytes(600), _handover(tmp_path, ["h"]))) is None
    d.clear()

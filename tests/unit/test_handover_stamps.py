"""Stamps: a worker's check of a data file's handed-over pages (by file identity and
ctime) that lets local readers skip their own checksum -- and never trust a page that
changed after the check (shoal.worker.handover, shoal.client.local)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import xxhash

from shoal.client import local
from shoal.client.cache import ClientCache, PageLoc
from shoal.errors import ProtocolError
from shoal.proto import messages as m
from shoal.worker import handover
from shoal.worker.handover import Handover, Page, Verified, check_pages, revoke

PS = 4096


def _data_file(tmp_path: Path, pages: int = 4) -> tuple[str, list[Page]]:
    p = tmp_path / "f.data"
    chunks = [os.urandom(PS) for _ in range(pages)]
    p.write_bytes(b"".join(chunks))
    return str(p), [(i * PS, PS, xxhash.xxh3_64_intdigest(c)) for i, c in enumerate(chunks)]


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's clock tick has moved past every ctime (deterministic, no sleep)."""
    monkeypatch.setattr(handover, "_coarse_now", lambda: 1 << 62)
    monkeypatch.setattr(local, "_coarse_now", lambda: 1 << 62)


def test_check_pages_finds_bad_pages_and_only_counts_a_settled_ctime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, pages = _data_file(tmp_path)
    st = os.stat(path)
    monkeypatch.setattr(handover, "_coarse_now", lambda: st.st_ctime_ns + 1)
    assert check_pages(path, st.st_dev, st.st_ino, pages) == (st.st_ctime_ns, [])
    # another file at that path now: no answer
    assert check_pages(path, st.st_dev, st.st_ino + 1, pages) is None
    # the clock tick of the last change has not passed: a write now could keep the
    # ctime, so no check stands for it
    monkeypatch.setattr(handover, "_coarse_now", lambda: st.st_ctime_ns)
    assert check_pages(path, st.st_dev, st.st_ino, pages) is None
    _flip(path, PS + 7)
    st2 = os.stat(path)
    monkeypatch.setattr(handover, "_coarse_now", lambda: st2.st_ctime_ns + 1)
    assert check_pages(path, st.st_dev, st.st_ino, pages) == (st2.st_ctime_ns, [pages[1]])


def test_revoke_moves_the_ctime(tmp_path: Path) -> None:
    path, _ = _data_file(tmp_path)
    before = os.stat(path)
    deadline = 200
    while os.stat(path).st_ctime_ns == before.st_ctime_ns and deadline:
        revoke(path)  # within one clock tick the ctime may stay: the tick moves on
        deadline -= 1
        asyncio.run(asyncio.sleep(0.001))
    after = os.stat(path)
    assert after.st_ctime_ns > before.st_ctime_ns
    assert after.st_mode == before.st_mode and after.st_mtime_ns == before.st_mtime_ns


def _handover(path: str) -> Handover:
    h = Handover()
    assert h.slot(path) == 0
    return h


def test_verified_stamps_after_a_check_and_not_after_a_write_or_expiry(
    tmp_path: Path, settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, pages = _data_file(tmp_path)
    now = [1000.0]
    v = Verified(clock=lambda: now[0])
    bad: list[list[Page]] = []

    async def go() -> None:
        h = _handover(path)
        try:
            assert v.stamps(h, [pages], lambda p, b: bad.append(b)) == [0]  # not checked yet
            while v._tasks:
                await asyncio.sleep(0.01)
            assert v.stamps(h, [pages], lambda p, b: bad.append(b)) == [h.ctimes[0]]
            # a page this answer hands over that was not checked: no stamp
            other = [(0, PS, pages[0][2] ^ 1)]
            assert v.stamps(h, [other], lambda p, b: bad.append(b)) == [0]
            while v._tasks:
                await asyncio.sleep(0.01)
            assert v.stamps(h, [pages], lambda p, b: bad.append(b)) == [0]  # revoked
        finally:
            h.abort()
        assert bad == [other]
        # the bad check moved the file's ctime: no stamp of the old one holds
        assert os.stat(path).st_ctime_ns != h.ctimes[0]
        h2 = _handover(path)
        try:
            v.stamps(h2, [pages], lambda p, b: bad.append(b))
            while v._tasks:
                await asyncio.sleep(0.01)
            assert v.stamps(h2, [pages], lambda p, b: bad.append(b)) == [h2.ctimes[0]]
            now[0] += handover.VERIFY_EVERY  # the check stood long enough: check again
            assert v.stamps(h2, [pages], lambda p, b: bad.append(b)) == [0]
        finally:
            h2.abort()
        _flip(path, 5)  # a write: a new ctime, nothing checked for it
        h3 = _handover(path)
        try:
            assert h3.ctimes[0] != h2.ctimes[0]
            while v._tasks:
                await asyncio.sleep(0.01)
            assert v.stamps(h3, [pages[1:]], lambda p, b: bad.append(b)) == [0]
        finally:
            h3.abort()

    asyncio.run(go())


def _reader(
    path: str, pages: list[Page]
) -> tuple[ClientCache, int, list[tuple[str, str, str, int]]]:
    c = ClientCache()
    fd = os.open(path, os.O_RDONLY)
    st = os.fstat(fd)
    fk = c.add_fd((st.st_dev, st.st_ino), fd)
    keys = []
    for i, (off, n, ck) in enumerate(pages):
        key = ("ds", "f", "v1", i)
        c.locs[key] = PageLoc(fk, off, n, ck, "w", PS)
        keys.append(key)
    return c, st.st_ctime_ns, keys


def test_reader_trusts_a_stamp_only_while_the_ctime_holds(tmp_path: Path, settled: None) -> None:
    path, pages = _data_file(tmp_path)
    want = Path(path).read_bytes()
    c, ctime, keys = _reader(path, pages)
    # stamped with a checksum that does not match: a stamped read does not checksum...
    c.locs[keys[0]] = PageLoc(c.locs[keys[0]].fdkey, 0, PS, 12345, "w", PS)
    c.verified[keys[0]] = ctime
    assert local._page(c, keys[0], c.locs[keys[0]], 0, PS) == want[:PS]
    # ...and an unstamped one does, whole or in part
    assert local._page(c, keys[1], c.locs[keys[1]], 0, PS) == want[PS : 2 * PS]
    assert c.verified[keys[1]] == ctime  # checked here: remembered for this ctime
    _flip(path, 2 * PS + 9)  # a write behind the reader's back
    c.verified[keys[2]] = ctime  # a stamp of the ctime before the write
    assert local._page(c, keys[2], c.locs[keys[2]], 0, PS) is None  # checked: caught
    assert local._page(c, keys[2], c.locs[keys[2]], 100, 200) is None
    assert c.counters.corrupt == 2 and len(c.bad_pages) == 2
    assert local._page(c, keys[1], c.locs[keys[1]], 0, PS) == want[PS : 2 * PS]
    assert c.verified[keys[1]] != ctime  # checked again for the new ctime


def test_reader_remembers_no_check_of_a_ctime_its_clock_tick_has_not_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, pages = _data_file(tmp_path)
    c, ctime, keys = _reader(path, pages)
    monkeypatch.setattr(local, "_coarse_now", lambda: ctime)
    assert local._page(c, keys[0], c.locs[keys[0]], 0, PS) is not None
    assert keys[0] not in c.verified


def test_reader_forgets_checks_after_trust_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, pages = _data_file(tmp_path)
    c, ctime, keys = _reader(path, pages)
    c.verified[keys[0]] = ctime
    local._trust_due(c, 100.0)
    local._trust_due(c, 100.0 + local.TRUST_FOR / 2)
    assert c.verified
    local._trust_due(c, 101.0 + local.TRUST_FOR)
    assert not c.verified


def test_locate_reply_stamps_are_a_trailing_optional_field() -> None:
    r = m.LocateReply("v", 10, 1.0, 2, [[0, 0, 10, 7]], [[1, 2]], False, [123])
    enc = r.encode()
    assert len(enc) == 10 and m.LocateReply.decode(enc) == r
    old = enc[:7]  # a worker before stamps
    assert m.LocateReply.decode(old).stamps == []
    before_runs = m.LocateReply.decode(enc[:8])  # a worker before runs
    assert (before_runs.stamps, before_runs.run, before_runs.sums) == ([123], [], b"")
    assert m.LocateReply.decode([*enc, "later"]).stamps == [123]  # fields after: ignored
    # a stamp of another type never equals a ctime: the reader checks those pages
    assert m.LocateReply.decode([*enc[:7], 5]).stamps == 5
    with pytest.raises(ProtocolError):  # the fields before it are checked as ever
        m.LocateReply.decode([*enc[:6], "no", [123]])


def test_back_to_back_pages_are_one_read_checked_page_by_page(
    tmp_path: Path, settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, pages = _data_file(tmp_path)
    want = Path(path).read_bytes()
    c, ctime, keys = _reader(path, pages)
    reads: list[int] = []
    real = os.pread

    def counting(fd: int, n: int, off: int) -> bytes:
        reads.append(n)
        return real(fd, n, off)

    monkeypatch.setattr(local.os, "pread", counting)
    locs = [c.locs[k] for k in keys]
    # unchecked: one read of the whole run, every page checked, then remembered
    assert local._pages(c, keys, locs, 100, 4 * PS - 50) == want[100 : 4 * PS - 50]
    assert reads == [4 * PS] and all(c.verified[k] == ctime for k in keys)
    # checked: one read of just the range asked for
    reads.clear()
    assert local._pages(c, keys[1:], locs[1:], 10, 2 * PS) == want[PS + 10 : 3 * PS]
    assert reads == [2 * PS - 10]
    # a write behind the reader's back: the stamps no longer hold, the bad page is
    # caught and reported, and nothing is returned
    _flip(path, 2 * PS + 9)
    assert local._pages(c, keys, locs, 0, 4 * PS) is None
    assert c.counters.corrupt == 1 and c.bad_pages == [("w", keys[2])]
    assert keys[2] not in c.locs  # asked of the worker next time


def test_pages_apart_are_read_one_by_one(tmp_path: Path, settled: None) -> None:
    path, pages = _data_file(tmp_path)
    want = Path(path).read_bytes()
    c, _ctime, keys = _reader(path, pages)
    # pages 0 and 1 located in the other order in the file: not one run
    a, b = c.locs[keys[0]], c.locs[keys[1]]
    swapped = [
        PageLoc(a.fdkey, PS, PS, pages[1][2], "w", PS),
        PageLoc(b.fdkey, 0, PS, pages[0][2], "w", PS),
    ]
    assert local._pages(c, keys[:2], swapped, 0, 2 * PS) == want[PS : 2 * PS] + want[:PS]
    # a short page before the last one: its successor's bytes would shift, so the
    # pages are read one by one, and the short read shows
    short = [PageLoc(a.fdkey, 0, PS - 1, 0, "w", PS), c.locs[keys[1]]]
    got = local._pages(c, keys[:2], short, 0, 2 * PS)
    assert got is None or len(got) != 2 * PS


def test_a_file_still_being_written_is_checked_once_it_settles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data file written to moments ago (a cold reader's pages still being appended)
    is left to its readers' own checks: reading it back now would be in vain. It is
    checked once it has settled -- by the next answer, or with none (the first warm
    reader after a cold one is the only one: the next must be stamped)."""
    monkeypatch.setattr(handover, "SETTLE_NS", 100_000_000)
    path, pages = _data_file(tmp_path)
    v = Verified()

    async def go() -> None:
        h = _handover(path)
        try:
            # the real clock: written just now, so not settled yet
            assert v.stamps(h, [pages], lambda p, b: None) == [0]
            assert not v._tasks and path in v._timers  # no check started, one due
            await _drain(v)  # settled: checked with no further answer
            assert v.stamps(h, [pages], lambda p, b: None) == [h.ctimes[0]]
            # another file, settled by the clock: the next answer starts its check
            (tmp_path / "b").mkdir()
            other, more = _data_file(tmp_path / "b")
            h2 = _handover(other)
            ctime = h2.ctimes[0]
            monkeypatch.setattr(handover, "_coarse_now", lambda: ctime)
            assert v.stamps(h2, [more], lambda p, b: None) == [0]
            assert not v._tasks
            monkeypatch.setattr(handover, "_coarse_now", lambda: ctime + handover.SETTLE_NS)
            assert v.stamps(h2, [more], lambda p, b: None) == [0]
            assert v._tasks
            await _drain(v)
            assert v.stamps(h2, [more], lambda p, b: None) == [ctime]
            h2.abort()
        finally:
            h.abort()

    asyncio.run(go())


# -- queued checks: none dropped while another runs, none waiting for another answer ----


def _drain(v: Verified) -> object:
    async def wait() -> None:
        while v._tasks or v._timers:
            await asyncio.sleep(0.01)

    return asyncio.wait_for(wait(), 10)


def test_pages_handed_over_during_a_check_are_checked_after_it(
    tmp_path: Path, settled: None
) -> None:
    """A sequential reader locates a large file's windows moments apart: the second
    window's pages must not be dropped because the first's check is still running
    (before, every later window of the file went out unstamped to reader after reader)."""
    path, pages = _data_file(tmp_path, pages=6)
    v = Verified()
    seen: list[tuple[str, list[Page]]] = []

    async def go() -> None:
        h = _handover(path)
        try:
            assert v.stamps(h, [pages[:2]], lambda p, b: seen.append(("a", b))) == [0]
            assert path in v._busy  # the first window's check runs
            assert v.stamps(h, [pages[2:]], lambda p, b: seen.append(("b", b))) == [0]
            await _drain(v)
            # one answer later, every page of the file is stamped: nothing was dropped
            assert v.stamps(h, [pages], lambda p, b: None) == [h.ctimes[0]]
        finally:
            h.abort()

    asyncio.run(go())
    assert seen == []


def test_a_failed_page_goes_to_the_answer_that_handed_it_over(
    tmp_path: Path, settled: None
) -> None:
    path, pages = _data_file(tmp_path, pages=4)
    v = Verified()
    seen: list[tuple[str, list[Page]]] = []
    wrong = (pages[3][0], PS, pages[3][2] ^ 1)  # a checksum the bytes do not have

    async def go() -> None:
        h = _handover(path)
        try:
            v.stamps(h, [pages[:2]], lambda p, b: seen.append(("a", b)))
            v.stamps(h, [[pages[2], wrong]], lambda p, b: seen.append(("b", b)))
            await _drain(v)
        finally:
            h.abort()

    asyncio.run(go())
    assert seen == [("b", [wrong])]  # not to the first answer's callback, nor lost
    assert v.bad_pages == 1


def test_a_relocated_page_keeps_the_readers_own_check_only_at_the_same_place(
    tmp_path: Path, settled: None
) -> None:
    """A LOCATE answer without stamps (the worker has not checked the file yet) keeps
    this process's check of a page it locates again at the same place -- before, every
    re-locate made the reader hash those pages again -- and drops it elsewhere."""
    from shoal.client.handover import take_locations
    from shoal.core.types import CachePolicy, Dataset, Mount

    path, pages = _data_file(tmp_path)
    st = os.stat(path)
    ds = Dataset("ds", (Mount("m", tmp_path.as_uri()),), CachePolicy(page_size=PS))
    c = ClientCache()
    rows = [[0, off, n, ck] for off, n, ck in pages]

    def locate(rows: list[list[int]], at: int = 0) -> bytes | None:
        reply = m.LocateReply("v1", 4 * PS, 1.0, 0, rows, [[st.st_dev, st.st_ino]], False, [0])
        return take_locations(c, "w", ds, "f", reply, [os.open(path, os.O_RDONLY)], at, PS)

    want = Path(path).read_bytes()
    try:
        assert locate(rows) == want[:PS]
        keys = [("ds", "f", "v1", i) for i in range(4)]
        assert local._page(c, keys[1], c.locs[keys[1]], 0, PS) == want[PS : 2 * PS]
        assert set(c.verified) == {keys[0], keys[1]}  # checked by this process
        moved = [rows[0], [0, 3 * PS, PS, pages[3][2]], *rows[2:]]  # page 1 elsewhere
        # (the read that comes with it is of page 3: it checks page 3 only)
        assert locate(moved, 3 * PS) == want[3 * PS :]
        assert keys[0] in c.verified and keys[1] not in c.verified
    finally:
        c.drop_locations()


def test_the_queue_of_files_waiting_for_a_check_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each queued file holds its answers' page lists: past VERIFY_QUEUE files the
    oldest wait is dropped (its readers check their own pages), its timer with it."""
    monkeypatch.setattr(handover, "VERIFY_QUEUE", 2)
    monkeypatch.setattr(handover, "_coarse_now", lambda: 0)  # nothing has settled
    v = Verified()
    paths = []
    for name in "abc":
        (tmp_path / name).mkdir()
        paths.append(_data_file(tmp_path / name))

    async def go() -> None:
        hs = [_handover(path) for path, _ in paths]
        try:
            for h, (_, pages) in zip(hs, paths, strict=True):
                assert v.stamps(h, [pages], lambda p, b: None) == [0]
            assert list(v._todo) == [paths[1][0], paths[2][0]]
            assert set(v._timers) == {paths[1][0], paths[2][0]} and not v._tasks
        finally:
            for h in hs:
                h.abort()
            for t in v._timers.values():
                t.cancel()

    asyncio.run(go())

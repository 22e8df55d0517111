"""A large file located as one run (LocateReply.run): one record per file in the
reader, byte-exact ranges across page edges and the short last page, a worker's check
trusted only while the data file keeps its ctime, and a malformed run never used
(shoal.client.handover, shoal.client.local)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xxhash

from shoal.client import local
from shoal.client.cache import RUN_CHECK, ClientCache
from shoal.client.handover import take_dir, take_locations
from shoal.core.types import CachePolicy, Dataset, FileInfo, Mount
from shoal.proto import messages as m

PS = 4096
SIZE = 3 * PS + 100  # the last page is short
KEY = ("ds", "f", "v1")


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's clock tick has moved past every ctime (deterministic, no sleep)."""
    monkeypatch.setattr(local, "_coarse_now", lambda: 1 << 62)


@pytest.fixture
def data(tmp_path: Path) -> Iterator[tuple[Path, bytes, Dataset, ClientCache]]:
    path = tmp_path / "f.data"
    want = os.urandom(SIZE)
    path.write_bytes(want)
    ds = Dataset("ds", (Mount("m", tmp_path.as_uri()),), CachePolicy(page_size=PS))
    c = ClientCache()
    c.checked_at = time.monotonic()  # the definitions were just fetched
    try:
        yield path, want, ds, c
    finally:
        c.drop_locations()


def _sums(want: bytes) -> bytes:
    pages = [want[i : i + PS] for i in range(0, len(want), PS)]
    return m.pack_sums([xxhash.xxh3_64_intdigest(p) for p in pages])


def _locate(
    c: ClientCache, ds: Dataset, path: Path, run: Any, sums: Any, stamp: int = 0, at: int = 0
) -> tuple[bytes | None, int]:
    """take_locations of a run answer; (what it read, its descriptor)."""
    st = os.stat(path)
    fd = os.open(path, os.O_RDONLY)
    reply = m.LocateReply(
        "v1", SIZE, 1.0, 0, [], [[st.st_dev, st.st_ino]], False, [stamp], run, sums
    )
    return take_locations(c, "w", ds, "f", reply, [fd], at, PS), fd


def test_a_run_is_one_record_and_reads_every_range_exactly(
    data: tuple[Path, bytes, Dataset, ClientCache], settled: None
) -> None:
    path, want, ds, c = data
    got, _ = _locate(c, ds, path, [0, 0, 0, 4], _sums(want))
    assert got == want[:PS]
    assert list(c.runs) == [KEY] and not c.locs  # no record per page
    for off, n in [(0, -1), (PS - 1, 2), (10, 2 * PS), (3 * PS, 100), (3 * PS + 50, 99), (SIZE, 5)]:
        end = SIZE if n < 0 else min(SIZE, off + n)
        assert local.read_located(c, ds, "f", off, n) == want[off:end], (off, n)
    # not stamped by the worker: this process checked each page itself, once
    assert set(c.verified) == {(*KEY, i) for i in range(4)}


def test_a_worker_stamp_is_trusted_only_while_the_ctime_holds(
    data: tuple[Path, bytes, Dataset, ClientCache], settled: None
) -> None:
    path, want, ds, c = data
    ctime = os.stat(path).st_ctime_ns
    got, _ = _locate(c, ds, path, [0, 0, 0, 4], _sums(want), stamp=ctime, at=PS)
    assert got == want[PS : 2 * PS]
    assert c.verified == {(*KEY, RUN_CHECK): ctime}  # one entry for the whole file
    assert local.read_located(c, ds, "f", 0, -1) == want
    with open(path, "r+b") as f:  # a byte flipped in place: the ctime moves
        f.seek(2 * PS + 7)
        f.write(bytes([want[2 * PS + 7] ^ 0xFF]))
    assert os.stat(path).st_ctime_ns != ctime
    assert local.read_located(c, ds, "f", 2 * PS, PS) is None  # checked, and caught
    assert c.counters.corrupt == 1 and c.bad_pages == [("w", (*KEY, 2))]
    assert KEY not in c.runs  # the next read asks the worker


@pytest.mark.parametrize(
    ("run", "sums"),
    [
        ([1, 0, 0, 4], None),  # no such descriptor
        ([0, -1, 0, 4], None),
        ([0, 0, 0, 0], None),
        ([0, 0, 1, 4], None),  # past the file's last page
        ([0, 0, 0, 4], b"\0" * 31),  # a checksum short
        ([0, 0, 0, 4], "not bytes"),
        ([0, 0, 0], None),
        ([0, 0, 0, "4"], None),
        ("run", None),
    ],
)
def test_a_malformed_run_is_never_used(
    data: tuple[Path, bytes, Dataset, ClientCache], run: Any, sums: Any
) -> None:
    path, want, ds, c = data
    got, fd = _locate(c, ds, path, run, _sums(want) if sums is None else sums)
    assert got is None and not c.runs and not c.fds
    with pytest.raises(OSError):
        os.fstat(fd)  # closed, not leaked
    assert c.info(ds, "f") is not None  # its metadata is still learnt


# -- runs in LOCATE_DIR answers ---------------------------------------------------------


def _dir(c: ClientCache, ds: Dataset, path: Path, runs: Any, sums: Any, stamps: Any = None) -> bool:
    """take_dir of an answer holding the file as a run and nothing else."""
    st = os.stat(path)
    fd = os.open(path, os.O_RDONLY)
    reply = m.LocateDirReply([], [[st.st_dev, st.st_ino]], True, runs, sums, stamps=stamps or [0])
    return take_dir(c, "w", ds, "", reply, [fd])


def test_a_directory_answer_locates_a_large_file_with_its_metadata(
    data: tuple[Path, bytes, Dataset, ClientCache], settled: None
) -> None:
    path, want, ds, c = data
    assert _dir(c, ds, path, [["f", "v1", SIZE, 7.5, 0, 0]], _sums(want))
    info = c.info(ds, "f")
    assert info is not None and (info.size, info.version, info.mtime) == (SIZE, "v1", 7.5)
    assert list(c.runs) == [KEY] and not c.locs
    for off, n in [(0, -1), (PS - 1, 2), (3 * PS + 50, 99)]:
        end = SIZE if n < 0 else min(SIZE, off + n)
        assert local.read_located(c, ds, "f", off, n) == want[off:end], (off, n)
    assert c.counters.short_circuit == 3  # each read a hit, reported to the worker later
    assert [t[4] for t in c.touch_log] == [4, 2, 1]  # pages read, reported later


def test_a_directory_answer_stamp_is_the_workers_check_of_the_run(
    data: tuple[Path, bytes, Dataset, ClientCache], settled: None
) -> None:
    path, want, ds, c = data
    ctime = os.stat(path).st_ctime_ns
    assert _dir(c, ds, path, [["f", "v1", SIZE, 1.0, 0, 0]], _sums(want), [ctime])
    assert c.verified == {(*KEY, RUN_CHECK): ctime}
    assert local.read_located(c, ds, "f", 0, -1) == want
    assert set(c.verified) == {(*KEY, RUN_CHECK)}  # trusted: no page checked here


def test_a_directory_answer_leaves_another_version_alone(
    data: tuple[Path, bytes, Dataset, ClientCache], settled: None
) -> None:
    path, want, ds, c = data
    c.remember("ds", FileInfo("f", SIZE, "v0", 1.0))  # this process reads v0
    assert _dir(c, ds, path, [["f", "v1", SIZE, 1.0, 0, 0]], _sums(want))
    info = c.info(ds, "f")
    assert info is not None and info.version == "v0" and not c.runs


@pytest.mark.parametrize(
    ("runs", "sums", "stamps"),
    [
        ([["f", "v1", SIZE, 1.0, 0, 0]], b"\0" * 8, None),  # sums of another length
        ([["f", "v1", SIZE, 1.0, 1, 0]], None, None),  # no such descriptor
        ([["f", "v1", PS, 1.0, 0, 0]], None, None),  # one page: not a run
        ([["f", "v1", SIZE, 1.0, 0, -1]], None, None),
        ([["f", "v1", SIZE, "1", 0, 0]], None, None),
        ([["f", "v1", SIZE, 1.0, 0]], None, None),
        (["run"], None, None),
        ("runs", None, None),
        ([["f", "v1", SIZE, 1.0, 0, 0]], "not bytes", None),
    ],
)
def test_a_malformed_directory_run_is_never_used(
    data: tuple[Path, bytes, Dataset, ClientCache], runs: Any, sums: Any, stamps: Any
) -> None:
    path, want, ds, c = data
    _dir(c, ds, path, runs, _sums(want) if sums is None else sums, stamps)
    assert not c.runs and c.info(ds, "f") is None
    assert local.read_located(c, ds, "f", 0, -1) is None  # the slow path asks the worker


def test_odd_directory_stamps_mean_check_every_page(
    data: tuple[Path, bytes, Dataset, ClientCache], settled: None
) -> None:
    path, want, ds, c = data
    assert _dir(c, ds, path, [["f", "v1", SIZE, 1.0, 0, 0]], _sums(want), ["x"])
    assert not c.verified
    assert local.read_located(c, ds, "f", 0, -1) == want
    assert set(c.verified) == {(*KEY, i) for i in range(4)}  # checked here, page by page


def test_each_run_of_an_answer_takes_its_own_checksums(
    data: tuple[Path, bytes, Dataset, ClientCache], settled: None
) -> None:
    """Two files in one answer, of 4 and 2 pages: the sums are sliced run by run (a
    slice one off would fail every page check of the second)."""
    path, want, ds, c = data
    other = path.parent / "g.data"
    two = os.urandom(PS + 7)
    other.write_bytes(two)
    ids, fds = [], []
    for p in (path, other):
        st = os.stat(p)
        ids.append([st.st_dev, st.st_ino])
        fds.append(os.open(p, os.O_RDONLY))
    runs = [["f", "v1", SIZE, 1.0, 0, 0], ["g", "v2", len(two), 1.0, 1, 0]]
    sums = _sums(want) + m.pack_sums(
        [xxhash.xxh3_64_intdigest(two[:PS]), xxhash.xxh3_64_intdigest(two[PS:])]
    )
    reply = m.LocateDirReply([], ids, True, runs, sums, stamps=[0, 0])
    assert take_dir(c, "w", ds, "", reply, fds)
    assert local.read_located(c, ds, "f", 0, -1) == want
    assert local.read_located(c, ds, "g", 0, -1) == two
    assert c.counters.corrupt == 0 and not c.bad_pages


@pytest.mark.parametrize("runs_full", [True, False])
def test_a_dataset_answer_short_of_runs_asks_for_the_directories(
    data: tuple[Path, bytes, Dataset, ClientCache], runs_full: bool
) -> None:
    path, want, ds, c = data
    st = os.stat(path)
    fd = os.open(path, os.O_RDONLY)
    runs = [["f", "v1", SIZE, 1.0, 0, 0]]
    reply = m.LocateDirReply([], [[st.st_dev, st.st_ino]], True, runs, _sums(want), runs_full, [0])
    # True: the answer held every cached file, no directory needs asking
    assert take_dir(c, "w", ds, None, reply, [fd]) is runs_full
    assert list(c.runs) == [KEY]  # what it held is used either way

"""What a local worker's answers teach the short circuit, installed in a
:class:`~shoal.client.cache.ClientCache`: a LOCATE answer's page locations (and the
read of the range that asked for them), a LOCATE_DIR answer's small files, which
directories to ask for, and the TOUCH batches that report the hits served from them.

No I/O and no event loop here: the async short circuit
(:mod:`shoal.client.shortcircuit`) and the sync client's blocking first reads
(:mod:`shoal.client.direct`) send the requests their own way and install the answers
through these same functions, so both follow one set of rules (descriptor counts,
layout changes, the workers' check stamps).
"""

from __future__ import annotations

import array
import os
import time
from collections.abc import Iterator

from shoal.client.cache import RUN_CHECK, ClientCache, FileRun, PageLoc
from shoal.client.local import read_located
from shoal.core.paging import page_count
from shoal.core.types import Dataset, FileInfo
from shoal.proto.messages import (
    LocateDirReply,
    LocateReply,
    TouchItem,
    TouchRequest,
    unpack_sums,
)
from shoal.proto.wire import MAX_TOUCH_ITEMS

#: bytes of already cached pages past a located range a worker also hands over
LOCATE_AHEAD = 256 << 20
#: after this many directories located, a reader asks for the whole dataset's cached
#: files (one answer instead of one per directory: a training epoch reads them all)
DATASET_LOCATE_AFTER = 3


def layout_moved(c: ClientCache, ds: Dataset) -> bool:
    """Whether the dataset's page layout changed since ``ds`` was read (a reply in
    the old layout must not be installed next to the new one)."""
    hit = c.datasets.get(ds.name)
    return hit is not None and hit[0].policy.page_size != ds.policy.page_size


def take_locations(
    c: ClientCache,
    wid: str,
    ds: Dataset,
    path: str,
    m: LocateReply,
    fds: list[int],
    offset: int,
    length: int,
) -> bytes | None:
    """Install a LOCATE answer of worker ``wid`` (its descriptors ``fds``, owned from
    here on) and read the range with pread; None: no usable locations (the file's
    metadata is still learnt). StaleLayout is the caller's to raise when
    :func:`layout_moved` (checked first, descriptors closed)."""
    ids = [(x[0], x[1]) for x in m.fds]
    run = _run_of(m, len(ids), ds.policy.page_size) if m.run else None
    if len(fds) != len(ids) or any(p[0] < 0 for p in m.pages) or (m.run and run is None):
        for fd in fds:
            os.close(fd)
        c.remember(ds.name, FileInfo(path, m.size, m.version, m.mtime))
        return None
    c.remember(ds.name, FileInfo(path, m.size, m.version, m.mtime))
    for key, fd in zip(ids, fds, strict=True):
        c.add_fd(key, fd)
    stamps = m.stamps  # unchecked by decode: none (an older worker) or odd: check all
    if type(stamps) is not list or len(stamps) != len(ids):
        stamps = [0] * len(ids)
    if run is not None:
        _take_run(c, wid, ds, path, m.version, ids, stamps, run)
        return read_located(c, ds, path, offset, length, touch=False)
    first = m.first
    verified, locs = c.verified, c.locs
    for i, (slot, off, n, ck) in enumerate(m.pages):
        lk = (ds.name, path, m.version, first + i)
        loc = PageLoc(ids[slot], off, n, ck, wid, ds.policy.page_size)
        # checked by the worker at this ctime: trusted while the file keeps it
        # (shoal.client.local); else this process checks the page itself -- unless it
        # already has, at this very location: that check still stands while the
        # file's ctime holds (a worker that has not checked the file yet must not
        # make every reader hash the pages it re-locates again, pass after pass)
        if stamps[slot]:
            verified[lk] = stamps[slot]
        elif locs.get(lk) != loc:
            verified.pop(lk, None)
        locs[lk] = loc
    # the worker counted this read when it answered: no touch for it
    return read_located(c, ds, path, offset, length, touch=False)


def _run_of(
    m: LocateReply, nfds: int, ps: int
) -> tuple[int, int, int, int, array.array[int]] | None:
    """A LOCATE answer's run as (slot, offset, first, count, sums), if well formed
    (decode leaves the trailing fields unchecked): else None, and nothing is used."""
    run, sums = m.run, m.sums
    if type(run) is not list or len(run) != 4 or not all(type(x) is int for x in run):
        return None
    slot, offset, first, count = run
    if (
        not 0 <= slot < nfds
        or offset < 0
        or first < 0
        or count < 1
        or ps <= 0
        or first + count > page_count(m.size, ps)
        or type(sums) is not bytes
        or len(sums) != 8 * count
    ):
        return None
    return slot, offset, first, count, unpack_sums(sums)


def _take_run(
    c: ClientCache,
    wid: str,
    ds: Dataset,
    path: str,
    version: str,
    ids: list[tuple[int, int]],
    stamps: list[int],
    run: tuple[int, int, int, int, array.array[int]],
) -> None:
    """Install a run: one record for the file, and the worker's check of it, if any.
    This process's own checks of its pages stand only while it stays where it was."""
    slot, offset, first, count, sums = run
    ps = ds.policy.page_size
    key = (ds.name, path, version)
    new = FileRun(ids[slot], offset, first, count, sums, wid, ps)
    old = c.runs.get(key)
    verified = c.verified
    if verified and (old is None or (old.fdkey, old.offset) != (new.fdkey, new.offset)):
        for i in range(first, first + count):
            verified.pop((*key, i), None)
    if stamps[slot]:
        verified[(*key, RUN_CHECK)] = stamps[slot]
    else:
        verified.pop((*key, RUN_CHECK), None)
    c.runs[key] = new


def directories_to_locate(c: ClientCache, wid: str, ds: Dataset, directories: list[str]) -> bool:
    """Note that ``directories`` are being located on ``wid``; whether to ask for the
    whole dataset's cached files first (a reader on its third directory is taken to
    read the dataset at large, a training epoch)."""
    now = time.monotonic()
    whole = (wid, ds.name, None)
    asked = c.dir_asks.get((wid, ds.name), 0) + len(directories)
    c.dir_asks[(wid, ds.name)] = asked
    for d in directories:
        c.dirs_located[(wid, ds.name, d)] = now
    if whole not in c.dirs_located and asked >= DATASET_LOCATE_AFTER:
        c.dirs_located[whole] = now
        return True
    return False


def take_dir(
    c: ClientCache, wid: str, ds: Dataset, directory: str | None, m: LocateDirReply, fds: list[int]
) -> bool:
    """Install a LOCATE_DIR answer of ``wid`` (its descriptors ``fds``, owned from here
    on); whether it held every cached file asked for."""
    ps = ds.policy.page_size
    ids = [(x[0], x[1]) for x in m.fds]
    if len(fds) != len(ids) or layout_moved(c, ds):
        for fd in fds:
            os.close(fd)
        return False
    if len(c.fds) + len(ids) > c.max_fds:
        c.drop_locations()  # now, not halfway through installing this answer
    keys = []
    for key, fd in zip(ids, fds, strict=True):
        keys.append(c.add_fd(key, fd))
    meta, locs, name = c.meta, c.locs, ds.name
    small, verified = c.dir_locs, c.verified
    # paths with a check of another location (a few: looked up without a key per item)
    checked = {k[1] for k in verified if k[0] == name and k[3] == 0} if verified else ()
    for path, v, size, slot, off, n, ck in m.items:
        if n != size or size > ps:
            continue  # a whole small file, or nothing
        if path in checked:
            verified.pop((name, path, v, 0), None)  # a check of another location
        known = meta.get((name, path))
        if known is None:
            # kept raw until read (shoal.client.local): no records per file here
            small[(name, path)] = (keys[slot], off, n, ck, v, wid, ps)
        elif known[0].version == v:
            locs[(name, path, v, 0)] = PageLoc(keys[slot], off, n, ck, wid, ps)
        # else: this process already reads another version of it
    if m.runs:
        _take_dir_runs(c, wid, ds, m, keys)
    if directory is None:
        # a whole dataset's answer short of some of its runs: the directories read
        # are asked for too (theirs fit), else each of those files takes a LOCATE
        return m.full and bool(m.items or m.runs) and m.runs_full is not False
    return m.full


#: a LOCATE_DIR run's fields: path, version, size, mtime, descriptor slot, offset
RUN_TYPES = (str, str, int, (int, float), int, int)


def _take_dir_runs(
    c: ClientCache, wid: str, ds: Dataset, m: LocateDirReply, keys: list[tuple[int, int]]
) -> None:
    """Install a LOCATE_DIR answer's runs, if well formed (decode leaves the trailing
    fields unchecked; else none is used): each file's metadata (unless this process
    reads another version of it) and its run, as a LOCATE answer's would be."""
    runs, raw, stamps, ps = m.runs, m.sums, m.stamps, ds.policy.page_size
    if type(runs) is not list or type(raw) is not bytes or ps <= 0:
        return
    counts: list[int] = []
    for r in runs:
        if (
            type(r) is not list
            or len(r) != 6
            or not all(map(isinstance, r, RUN_TYPES))
            or r[2] <= ps
            or not 0 <= r[4] < len(keys)
            or r[5] < 0
        ):
            return
        counts.append(page_count(r[2], ps))
    if len(raw) != 8 * sum(counts):
        return
    if (
        type(stamps) is not list
        or len(stamps) != len(keys)
        or not all(type(x) is int for x in stamps)
    ):
        stamps = [0] * len(keys)
    sums = unpack_sums(raw)
    at = 0
    for (path, v, size, mtime, slot, off), n in zip(runs, counts, strict=True):
        mine, at = sums[at : at + n], at + n
        known = c.meta.get((ds.name, path))
        if known is None:
            c.remember(ds.name, FileInfo(path, size, v, mtime))
        elif (known[0].version, known[0].size) != (v, size):
            continue  # this process already reads another version of it
        _take_run(c, wid, ds, path, v, keys, stamps, (slot, off, 0, n, mine))


def touch_batches(c: ClientCache) -> Iterator[tuple[str, TouchRequest]]:
    """The buffered hits, taken out of ``c``: (worker id, TOUCH) per worker and
    dataset, each at most MAX_TOUCH_ITEMS items (a worker refuses more)."""
    c.touched_at = time.monotonic()
    log_, c.touch_log = c.touch_log, []
    touches: dict[str, dict[str, list[TouchItem]]] = {}
    for wid, dsname, path, version, npages, nbytes in log_:
        touches.setdefault(wid, {}).setdefault(dsname, []).append((path, version, npages, nbytes))
    for wid, by_ds in touches.items():
        for dsname, items in by_ds.items():
            for i in range(0, len(items), MAX_TOUCH_ITEMS):
                yield wid, TouchRequest(dsname, tuple(items[i : i + MAX_TOUCH_ITEMS]))

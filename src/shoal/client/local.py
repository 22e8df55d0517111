"""Short-circuit reads: pages a worker on this host handed over as descriptors are read
with ``pread`` on the caller's thread, with no round trip to anyone.

No byte is served unverified: a page is checked whole against its xxh3 -- by this
process, or by the worker that handed it over (a LOCATE answer's *stamp*: the data
file's ctime when the worker read the page back and checked it, see
:class:`shoal.worker.handover.Verified`) -- and then trusted while the data file's ctime
is unchanged: any write to the file through the kernel moves its ctime (and ``utime``
cannot move it back), so a page changed on disk is read and checked whole again. A
check counts only once the kernel's clock has moved past the ctime it saw (a write in
the same clock tick would keep that ctime), and the ctime is compared *after* the
``pread`` it vouches for. Trust is the ctime rule, once per node: a 1 MiB page costs a
``pread`` and an ``fstat``, not an xxh3 too (35 vs 52 us). Bytes that change below the
kernel, with no write, keep the ctime: those are caught by the worker's checks, which
are kept in memory (a restarted worker checks each file again when it first hands it
over), stand VERIFY_EVERY seconds, and on a failure drop the page and move the file's
ctime (every reader's trust in it ends); and a reader forgets all its checks every
TRUST_FOR seconds.

A page that fails its checksum is counted, forgotten, and queued in ``bad_pages`` for the
async client to report (``DROP``) so the worker drops and refetches it; the read falls
back to the worker. Hits served here are reported to their worker later, in batches
(``touch_log``), for its statistics and its eviction order.
"""

from __future__ import annotations

import os
import time

import xxhash

from shoal.client.cache import RUN_CHECK, ClientCache, FileRun, LocKey, PageLoc, RunKey, SmallLoc
from shoal.core.types import NEVER, Dataset, FileInfo

#: hits buffered before a flush to the workers is due
TOUCH_FLUSH = 4096
#: seconds buffered hits may wait before a flush is due (the report stays current)
TOUCH_EVERY = 1.0

#: owners tried beyond the dataset's replicas before falling back to under storage
EXTRA_OWNERS = 2

#: seconds a page's check is trusted by a reader, at most (then checked whole again);
#: the workers' own checks stand as long (shoal.worker.handover.VERIFY_EVERY)
TRUST_FOR = 900.0

_xxh3 = xxhash.xxh3_64_intdigest
#: id(ClientCache) -> when its checks were last all forgotten (see _trust_due)
_trust_since: dict[int, float] = {}


#: CLOCK_REALTIME_COARSE (Linux), which typeshed does not name
_COARSE: int = getattr(time, "CLOCK_REALTIME_COARSE", 5)


def _coarse_now() -> int:
    """The clock the kernel stamps ctime from, in ns (a tick behind the precise one)."""
    return time.clock_gettime_ns(_COARSE)


def _bad(c: ClientCache, key: LocKey, worker: str) -> None:
    c.counters.corrupt += 1
    c.bad_pages.append((worker, key))


def _page(c: ClientCache, key: LocKey, loc: PageLoc, start: int, end: int) -> bytes | None:
    """Bytes [start, end) of one located page, verified (see the module docstring)."""
    return _span(c, key, loc.fdkey, loc.offset, loc.length, loc.checksum, loc.worker, start, end)


def _span(
    c: ClientCache,
    key: LocKey,
    fdkey: tuple[int, int],
    offset: int,
    length: int,
    checksum: int,
    worker: str,
    start: int,
    end: int,
) -> bytes | None:
    """Bytes [start, end) of the page ``length`` bytes at ``offset`` of a handed-over
    descriptor, verified: checked whole against ``checksum``, or trusted by its ctime."""
    fd = c.fds.get(fdkey)
    if fd is None:
        return None
    verified = c.verified
    try:
        stamp = verified.get(key)
        if stamp is not None:
            data = os.pread(fd, end - start, offset + start)
            # fstat after the pread: any write before the pread has moved the ctime
            if len(data) == end - start and os.fstat(fd).st_ctime_ns == stamp:
                return data
            # the file changed since the check: check the page again (pop: another
            # thread, or the trust expiry, may have dropped the stamp meanwhile)
            verified.pop(key, None)
        ctime = os.fstat(fd).st_ctime_ns
        # a check stands for this ctime only if a later write cannot share it: the
        # kernel's clock (that writes are stamped from) must have moved past it
        settled = _coarse_now() > ctime
        whole = os.pread(fd, length, offset)
    except OSError:
        return None
    if len(whole) != length or _xxh3(whole) != checksum:
        _bad(c, key, worker)
        return None
    if settled:
        verified[key] = ctime
    return whole if start == 0 and end == length else whole[start:end]


def _forget(c: ClientCache, key: LocKey) -> None:
    """A located page that could not be read as located: ask the worker next time."""
    c.locs.pop(key, None)
    c.verified.pop(key, None)
    if c.runs:
        c.runs.pop(key[:3], None)


def _pages(
    c: ClientCache, keys: list[LocKey], locs: list[PageLoc], start: int, end: int
) -> bytes | None:
    """Bytes [start, end) of consecutive located pages, counted from the first one's
    start, verified. Pages that lie back to back in one descriptor (a large file's
    pages do) are read with one ``pread`` straight into the bytes returned and
    checked through views of it, so a multi-page read costs one copy, as a local
    file's does, not a copy per page and a join; otherwise page by page."""
    head = locs[0]
    fdkey, at = head.fdkey, head.offset
    ps = head.page_size
    for i, loc in enumerate(locs):
        # a page short of the layout's size anywhere but last would shift the rest
        if loc.fdkey != fdkey or loc.offset != at or (loc.length != ps and i < len(locs) - 1):
            return _page_by_page(c, keys, locs, start, end)
        at += loc.length
    total = at - head.offset
    end = min(end, total)
    fd = c.fds.get(fdkey)
    if fd is None:
        return None
    verified = c.verified
    try:
        stamp = verified.get(keys[0])
        if stamp is not None and all(verified.get(k) == stamp for k in keys):
            data = os.pread(fd, end - start, head.offset + start)
            # fstat after the pread: any write before the pread has moved the ctime
            if len(data) == end - start and os.fstat(fd).st_ctime_ns == stamp:
                return data
            for k in keys:  # the file changed since the checks: check them again
                verified.pop(k, None)
        ctime = os.fstat(fd).st_ctime_ns
        settled = _coarse_now() > ctime  # as in _span
        whole = os.pread(fd, total, head.offset)
    except OSError:
        return None
    if len(whole) != total:
        return _page_by_page(c, keys, locs, start, end)  # finds and reports the short page
    view = memoryview(whole)
    pos = 0
    for k, loc in zip(keys, locs, strict=True):
        if _xxh3(view[pos : pos + loc.length]) != loc.checksum:
            _bad(c, k, loc.worker)
            _forget(c, k)
            return None
        pos += loc.length
    if settled:
        for k in keys:
            verified[k] = ctime
    return whole if start == 0 and end == total else whole[start:end]


def _page_by_page(
    c: ClientCache, keys: list[LocKey], locs: list[PageLoc], start: int, end: int
) -> bytes | None:
    """:func:`_pages` one page at a time (pages in several descriptors), joined."""
    ps = locs[0].page_size
    parts: list[bytes] = []
    for i, (key, loc) in enumerate(zip(keys, locs, strict=True)):
        base = i * ps
        piece = _page(c, key, loc, max(start, base) - base, min(end, base + loc.length) - base)
        if piece is None:
            _forget(c, key)
            return None
        parts.append(piece)
    return b"".join(parts)


def _run_read(
    c: ClientCache, rk: RunKey, run: FileRun, size: int, offset: int, end: int
) -> bytes | None:
    """Bytes [offset, end) of a file located as one run, verified: trusted on the
    worker's check of the run while the descriptor keeps its ctime (one ``pread`` and
    one ``fstat``), else checked page by page as :func:`_pages` does (and a page that
    fails drops the run: the next read asks the worker)."""
    ps = run.page_size
    at = run.offset + (offset - run.first * ps)
    verified = c.verified
    check = (*rk, RUN_CHECK)
    stamp = verified.get(check)
    if stamp is not None:
        fd = c.fds.get(run.fdkey)
        if fd is None:
            return None
        try:
            data = os.pread(fd, end - offset, at)
            # fstat after the pread: any write before the pread has moved the ctime
            if len(data) == end - offset and os.fstat(fd).st_ctime_ns == stamp:
                return data
        except OSError:
            return None
        verified.pop(check, None)  # the file changed since the worker's check
    first, last = offset // ps, (end - 1) // ps
    keys: list[LocKey] = []
    locs: list[PageLoc] = []
    for i in range(first, last + 1):
        j = i - run.first
        n = min(ps, size - i * ps)
        keys.append((*rk, i))
        locs.append(PageLoc(run.fdkey, run.offset + j * ps, n, run.sums[j], run.worker, ps))
    base = first * ps
    got = _read_pages(c, keys, locs, offset - base, end - base)
    if got is None:
        c.runs.pop(rk, None)
    return got


def _read_pages(
    c: ClientCache, keys: list[LocKey], locs: list[PageLoc], start: int, end: int
) -> bytes | None:
    """Bytes [start, end) of consecutive located pages, counted from the first one's
    start, verified; a page that cannot be read as located is forgotten."""
    if len(locs) > 1:
        return _pages(c, keys, locs, start, end)
    data = _page(c, keys[0], locs[0], start, min(end, locs[0].length))
    if data is None:
        _forget(c, keys[0])
    return data


def _trust_due(c: ClientCache, now: float) -> None:
    """Forget every check older than TRUST_FOR seconds (this process's and the
    workers'), so that a long-running reader checks each page whole again that often."""
    since = _trust_since.get(id(c))
    if since is None:
        _trust_since[id(c)] = now
    elif now - since > TRUST_FOR:
        c.verified.clear()
        _trust_since[id(c)] = now


def read_located(
    c: ClientCache, ds: Dataset, path: str, offset: int, length: int, touch: bool = True
) -> bytes | None:
    """The zero-round-trip read: metadata and page locations already known; else None.
    None too when the dataset definitions are due for a refresh (``refresh_every``), so
    that a reader served only from here still sees a sync or a policy change in time.
    ``touch=False``: locations a worker handed over just now for this read (it counted
    the read when it answered)."""
    if offset < 0:
        return None
    info = c.info(ds, path)
    if info is None:
        small = c.dir_locs.get((ds.name, path))
        return None if small is None else _read_small(c, ds, path, small, offset, length, touch)
    now = time.monotonic()
    if touch and now - c.checked_at > c.refresh_every:
        return None
    if c.verified:
        _trust_due(c, now)
    size = info.size
    end = size if length < 0 else min(size, offset + length)
    if offset >= end:  # an empty file, or a range past the end: no bytes to read
        if touch:
            c.counters.short_circuit += 1
        return b""
    ps = ds.policy.page_size
    first, last = offset // ps, (end - 1) // ps
    run = c.runs.get((ds.name, path, info.version)) if c.runs else None
    if (
        run is not None
        and run.page_size == ps
        and run.first <= first
        and last < run.first + run.count
    ):
        data = _run_read(c, (ds.name, path, info.version), run, size, offset, end)
        if data is None or len(data) != end - offset:
            return None  # never a short read: the slow path asks the worker
        if touch:
            _count(c, run.worker, ds.name, path, info.version, last - first + 1, len(data))
        return data
    keys: list[LocKey] = []
    locs: list[PageLoc] = []
    for i in range(first, last + 1):
        key: LocKey = (ds.name, path, info.version, i)
        loc = c.locs.get(key)
        if loc is None or loc.page_size != ps:
            return None
        keys.append(key)
        locs.append(loc)
    base = first * ps
    data = _read_pages(c, keys, locs, offset - base, end - base)
    if data is None or len(data) != end - offset:
        return None  # never a short read: the slow path asks the worker
    if touch:
        assert loc is not None  # the range is not empty
        _count(c, loc.worker, ds.name, path, info.version, last - first + 1, len(data))
    return data


def _count(
    c: ClientCache, worker: str, dsname: str, path: str, version: str, pages: int, nbytes: int
) -> None:
    """A short-circuit hit: counted here, reported to its worker later (TOUCH)."""
    counters = c.counters
    counters.short_circuit += 1
    counters.bytes_short_circuit += nbytes
    c.touch_log.append((worker, dsname, path, version, pages, nbytes))


def _read_small(
    c: ClientCache, ds: Dataset, path: str, small: SmallLoc, offset: int, length: int, touch: bool
) -> bytes | None:
    """:func:`read_located` of a whole small file a LOCATE_DIR answer located (see
    ``ClientCache.dir_locs``): one ``pread`` and its check, with no metadata or page
    records built for it (a reader of a quarter of a dataset's files would otherwise
    build them for all of them first)."""
    fdkey, off, size, checksum, version, worker, ps = small
    if ps != ds.policy.page_size or ds.policy.staleness != NEVER:
        return None  # located in another layout, or a policy that revalidates
    now = time.monotonic()
    if touch and now - c.checked_at > c.refresh_every:
        return None
    if c.verified:
        _trust_due(c, now)
    end = size if length < 0 else min(size, offset + length)
    if offset >= end:  # an empty file, or a range past the end: no bytes to read
        if touch:
            c.counters.short_circuit += 1
        return b""
    key: LocKey = (ds.name, path, version, 0)
    data = _span(c, key, fdkey, off, size, checksum, worker, offset, end)
    if data is None or len(data) != end - offset:
        c.dir_locs.pop((ds.name, path), None)
        c.verified.pop(key, None)
        return None  # never a short read: the slow path asks the worker
    if touch:
        _count(c, worker, ds.name, path, version, 1, len(data))
    return data


def read_path(c: ClientCache, path: str, offset: int = 0, length: int = -1) -> bytes | None:
    """:func:`read_located` by path ("/<dataset>/<mount>/<path>" or "shoal://..."): the
    one fast-path entry for front-ends (the clients' ``read_fast`` call it). No
    validation: only exact, normalised keys can hit the caches, and anything else (odd
    paths, errors) is None, left to the slow path to judge."""
    p = path[8:] if path.startswith("shoal://") else path
    name, _, key = p.lstrip("/").partition("/")
    hit = c.datasets.get(name)
    if hit is None or "/" not in key:
        return None
    return read_located(c, hit[0], key, offset, length)


def stat_path(c: ClientCache, path: str) -> FileInfo | None:
    """The stat of a file (or of a directory the manifest knows) by path, from what
    this process already holds within the dataset's staleness bound -- the metadata
    cache, then the dataset's manifest -- on the caller's thread; else None (then ask
    the async client). None too when the dataset definitions are due for a refresh, so
    that a sync or a policy change is seen in time, as for :func:`read_located`. Like
    :func:`read_path`, only exact, normalised paths can hit."""
    p = path[8:] if path.startswith("shoal://") else path
    name, _, key = p.lstrip("/").partition("/")
    hit = c.datasets.get(name)
    if hit is None or "/" not in key or key.endswith("/"):
        return None
    now = time.monotonic()
    if now - c.checked_at > c.refresh_every:
        return None
    ds = hit[0]
    bound = ds.policy.staleness
    known = c.meta.get((name, key))
    if known is not None and (bound == NEVER or now - known[1] <= bound):
        info: FileInfo = known[0]
        if info.mtime_ns or info.mtime:  # LOCATE_DIR teaches no mtime: ask for it
            return FileInfo(f"/{name}/{key}", info.size, info.version, info.mtime)
    man = c.manifests.get(name)
    if man is None or not ds.manifest or man[0] != ds.manifest:
        return None
    if bound != NEVER and time.time() - man[1].built_at > bound:
        return None
    e = man[1].get(key)  # a bisection; kept out of ``meta``, written on the loop only
    if e is not None:
        return FileInfo(f"/{name}/{key}", e.size, e.version, e.mtime)
    if man[1].is_dir(key):
        return FileInfo(f"/{name}/{key}", 0, "", 0.0, True)
    return None


def touches_due(c: ClientCache) -> bool:
    """Whether buffered hits should be sent to their workers now (many, or old)."""
    log_ = c.touch_log
    if not log_:
        return False
    return len(log_) >= TOUCH_FLUSH or time.monotonic() - c.touched_at > TOUCH_EVERY

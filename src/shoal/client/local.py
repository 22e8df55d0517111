"""Short-circuit reads: pages a worker on this host handed over as descriptors are read
with ``pread`` on the caller's thread, with no round trip to anyone.

Every page is checked against its checksum the first time this process reads it; after
that the process trusts the bytes at that location (a worker never overwrites a
location it handed out: segments are append-only and large files are replaced, not
rewritten), so a read of part of a page is one ``pread`` of just that part.

Hits served here are reported to their worker later, in batches (``touch_log``), for
its statistics and its eviction order.
"""

from __future__ import annotations

import os

import xxhash

from shoal.client.cache import ClientCache, LocKey, PageLoc
from shoal.core.types import Dataset

#: hits buffered before a flush to the workers is due
TOUCH_FLUSH = 4096


def _page(c: ClientCache, key: LocKey, loc: PageLoc, start: int, end: int) -> bytes | None:
    """Bytes [start, end) of one located page, checking the page once per process."""
    fd = c.fds.get(loc.fdkey)
    if fd is None:
        return None
    try:
        if key in c.verified:
            data = os.pread(fd, end - start, loc.offset + start)
            return data if len(data) == end - start else None
        whole = os.pread(fd, loc.length, loc.offset)
    except OSError:
        return None
    if len(whole) != loc.length or xxhash.xxh3_64_intdigest(whole) != loc.checksum:
        c.counters.corrupt += 1
        return None
    c.verified.add(key)
    return whole if start == 0 and end == loc.length else whole[start:end]


def read_located(
    c: ClientCache, ds: Dataset, path: str, offset: int, length: int, touch: bool = True
) -> bytes | None:
    """The zero-round-trip read: metadata and page locations already known; else None."""
    info = c.info(ds, path)
    if info is None:
        return None
    size = info.size
    end = size if length < 0 else min(size, offset + length)
    if offset < 0:
        return None
    if offset >= end:  # an empty file, or a range past the end: no bytes to read
        if touch:
            c.counters.short_circuit += 1
        return b""
    ps = ds.policy.page_size
    first, last = offset // ps, (end - 1) // ps
    parts: list[bytes] = []
    loc: PageLoc | None = None
    for i in range(first, last + 1):
        key: LocKey = (ds.name, path, info.version, i)
        loc = c.locs.get(key)
        if loc is None:
            return None
        base = i * ps
        piece = _page(c, key, loc, max(offset, base) - base, min(end, base + loc.length) - base)
        if piece is None:
            c.locs.pop(key, None)
            c.verified.discard(key)
            return None
        parts.append(piece)
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if touch:
        counters = c.counters
        counters.short_circuit += 1
        counters.bytes_short_circuit += len(data)
        assert loc is not None  # the range is not empty
        c.touch_log.append((loc.worker, ds.name, path, info.version, last - first + 1, len(data)))
    return data

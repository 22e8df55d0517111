"""A block cache for opened ``shoal://`` files that follows the access pattern.

fsspec's ``readahead`` cache fetches a whole block past every miss. That suits a file
read front to back (a tar shard, a CSV, a whole image), but a random-access reader
(parquet, zarr, HDF5, lance) seeks to a footer and then to column chunks, and every
such seek pulled ``block_size`` bytes it never used (a 2-of-10-column parquet read
fetched several times the bytes it needed). Here a read that continues where the last
one ended (or inside the buffer) is sequential and reads ahead, the window doubling
from ``MIN_AHEAD`` up to the block size, as the kernel's readahead does; a read
anywhere else is a seek: it fetches exactly the bytes asked for and resets the window.
"""

from __future__ import annotations

from fsspec.caching import BaseCache, Fetcher, caches, register_cache

#: the first readahead of a sequential stream; doubled on each sequential miss
MIN_AHEAD = 256 << 10


class PatternCache(BaseCache):
    """Readahead for sequential reads, exact fetches for seeks (``cache_type="shoal"``)."""

    name = "shoal"

    def __init__(self, blocksize: int, fetcher: Fetcher, size: int) -> None:
        super().__init__(blocksize, fetcher, size)
        self.cache = b""
        self.start = 0
        self.end = 0
        self.next = 0  # where a sequential read would start: a new file reads from 0
        self.window = 0

    def _fetch(self, start: int | None, end: int | None) -> bytes:
        start = 0 if start is None else start
        end = self.size if end is None or end > self.size else end
        if start >= self.size or start >= end:
            return b""
        if self.start <= start and end <= self.end:
            self.hit_count += 1
            self.next = end
            return self.cache[start - self.start : end - self.start]
        self.miss_count += 1
        sequential = start == self.next or self.start <= start < self.end
        if sequential:
            self.window = min(max(self.blocksize, 0), max(MIN_AHEAD, 2 * self.window))
        else:
            self.window = 0
        part = b""
        if self.start <= start < self.end:  # the head of the read is buffered already
            part = self.cache[start - self.start :]
        fetch_from = start + len(part)
        fetch_to = min(self.size, end + self.window)
        self.total_requested_bytes += fetch_to - fetch_from
        got = self.fetcher(fetch_from, fetch_to)
        # keep what was read ahead (and the buffered head, so a re-read stays a hit);
        # memory stays below block size + one request
        self.cache = part + got if part else got
        self.start = start if part else fetch_from
        self.end = self.start + len(self.cache)
        self.next = end
        return self.cache[start - self.start : end - self.start]


if PatternCache.name not in caches:
    register_cache(PatternCache)

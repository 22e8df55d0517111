"""Paging arithmetic: which pages cover a byte range, and how long each page is."""

from __future__ import annotations


def page_count(size: int, page_size: int) -> int:
    """Pages of a file; an empty file still has one (empty) page 0."""
    return max(1, -(-size // page_size))


def page_len(size: int, page_size: int, index: int) -> int:
    return max(0, min(page_size, size - index * page_size))


def pages_for_range(size: int, page_size: int, offset: int, length: int) -> range:
    """Indexes of the pages covering [offset, offset+length) clipped to the file;
    ``length < 0`` means to the end. An empty file is one empty page 0."""
    if size == 0:
        return range(0, 1)
    end = size if length < 0 else min(size, offset + length)
    if offset >= end:
        return range(0, 0)
    return range(offset // page_size, (end - 1) // page_size + 1)


def is_small(size: int, page_size: int) -> bool:
    """A small file is stored whole as page 0 (packed into a segment)."""
    return size <= page_size


#: the first readahead of a file read from its start, in pages (doubles while reads
#: stay sequential, up to the dataset's ``readahead``)
READAHEAD_START = 2


def readahead_window(prev: tuple[int, int] | None, rng: range, limit: int) -> int:
    """Pages to fetch ahead of a read of pages *rng*, as the kernel's readahead does.

    *prev* is (stop, window) of the file's previous read that reached the loader, or
    None. A read that continues it (starts at or past its end, within what was read
    ahead) is sequential and doubles the window up to *limit*; a first read from page 0
    starts small; any other read (a footer, a column chunk, a random range) fetches only
    the pages it touches, so random access never pulls in a whole window it won't read.
    """
    if limit <= 0 or not rng:
        return 0
    if prev is not None:
        stop, window = prev
        if stop <= rng.start <= stop + window:
            return min(limit, max(READAHEAD_START, 2 * window, len(rng)))
        return 0
    return min(limit, max(READAHEAD_START, len(rng))) if rng.start == 0 else 0

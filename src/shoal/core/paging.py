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

"""PatternCache, the block cache of opened shoal:// files: readahead while a file is
read front to back, exact fetches after a seek, and the bytes always right."""

from __future__ import annotations

import random

import fsspec.caching
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.readahead import MIN_AHEAD, PatternCache

KiB = 1 << 10
MiB = 1 << 20
DATA = random.Random(3).randbytes(40 * MiB)


class Source:
    def __init__(self, data: bytes = DATA) -> None:
        self.data = data
        self.calls: list[tuple[int, int]] = []

    def __call__(self, start: int, end: int) -> bytes:
        self.calls.append((start, end))
        return self.data[start:end]


def test_registered_with_fsspec() -> None:
    assert fsspec.caching.caches["shoal"] is PatternCache


def test_sequential_reads_read_ahead_with_a_growing_window() -> None:
    src = Source()
    c = PatternCache(4 * MiB, src, len(DATA))
    pos = 0
    for _ in range(400):  # 10 KiB reads, as tarfile streams a shard
        assert c._fetch(pos, pos + 10 * KiB) == DATA[pos : pos + 10 * KiB]
        pos += 10 * KiB
    windows = [e - s for s, e in src.calls]
    assert windows[0] == 10 * KiB + MIN_AHEAD
    assert windows == sorted(windows) and max(windows) <= 4 * MiB + 10 * KiB
    assert len(src.calls) < 10  # 4 MB in a handful of requests, not 400


def test_a_seek_fetches_exactly_what_is_asked() -> None:
    """Footer, then column chunks: no block past any of them (readahead's 4 MiB)."""
    src = Source()
    c = PatternCache(4 * MiB, src, len(DATA))
    size = len(DATA)
    ranges = [(size - 64 * KiB, size), (1 * MiB, 1 * MiB + 300 * KiB), (20 * MiB, 21 * MiB)]
    for s, e in ranges:
        assert c._fetch(s, e) == DATA[s:e]
    assert src.calls == ranges
    assert c.total_requested_bytes == sum(e - s for s, e in ranges)


def test_block_size_zero_never_reads_ahead() -> None:
    src = Source()
    c = PatternCache(0, src, len(DATA))
    for pos in range(0, 100 * KiB, 10 * KiB):
        c._fetch(pos, pos + 10 * KiB)
    assert c.total_requested_bytes == 100 * KiB


def test_rereading_the_buffer_is_a_hit() -> None:
    src = Source()
    c = PatternCache(4 * MiB, src, len(DATA))
    c._fetch(0, 100)
    n = len(src.calls)
    assert c._fetch(10, 50) == DATA[10:50]
    assert len(src.calls) == n and c.hit_count == 1


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2 * MiB),
    st.lists(st.tuples(st.integers(-10, 3 * MiB), st.integers(0, 600 * KiB)), max_size=30),
)
def test_any_read_sequence_returns_the_right_bytes(
    block: int, reads: list[tuple[int, int]]
) -> None:
    data = DATA[: 2 * MiB + 17]
    c = PatternCache(block, Source(data), len(data))
    for start, n in reads:
        start = max(0, start)
        assert c._fetch(start, start + n) == data[start : start + n]
        assert len(c.cache) <= max(block, 0) + n + 600 * KiB  # bounded memory

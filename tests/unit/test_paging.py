from shoal.core.paging import is_small, page_count, page_len, pages_for_range

PS = 1 << 20


def test_page_count_and_len() -> None:
    assert page_count(0, PS) == 1
    assert page_count(PS, PS) == 1
    assert page_count(PS + 1, PS) == 2
    assert page_len(PS + 1, PS, 1) == 1
    assert page_len(PS + 1, PS, 2) == 0


def test_pages_for_range() -> None:
    size = 3 * PS + 10
    assert pages_for_range(size, PS, 0, -1) == range(0, 4)
    assert pages_for_range(size, PS, PS - 1, 2) == range(0, 2)
    assert pages_for_range(size, PS, PS, PS) == range(1, 2)
    assert pages_for_range(size, PS, size, 10) == range(0, 0)
    assert pages_for_range(size, PS, 3 * PS + 5, 100) == range(3, 4)
    assert pages_for_range(0, PS, 0, -1) == range(0, 1)


def test_small() -> None:
    assert is_small(PS, PS) and not is_small(PS + 1, PS)


def test_readahead_ramps_on_sequential_reads_and_stays_off_for_random_ones() -> None:
    from shoal.core.paging import READAHEAD_START, readahead_window

    limit = 16
    # a read from the start begins small and doubles while reads continue
    prev: tuple[int, int] | None = None
    windows = []
    start = 0
    for _ in range(6):
        rng = range(start, start + 1)
        w = readahead_window(prev, rng, limit)
        windows.append(w)
        prev = (rng.stop, w)
        start = rng.stop + w  # the reader consumed the read-ahead pages from the cache
    assert windows == [READAHEAD_START, 4, 8, 16, 16, 16]
    # a first read elsewhere (a parquet footer) and a jump (a column chunk) fetch nothing more
    assert readahead_window(None, range(40, 41), limit) == 0
    assert readahead_window((41, 0), range(0, 1), limit) == 0
    assert readahead_window((8, 4), range(20, 21), limit) == 0
    # a read inside the window read ahead is still sequential
    assert readahead_window((8, 4), range(10, 11), limit) == 8
    # readahead off, or an empty range
    assert readahead_window(None, range(0, 1), 0) == 0
    assert readahead_window(None, range(0, 0), limit) == 0

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

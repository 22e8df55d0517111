from collections import Counter

from shoal.core.ring import Ring


def keys(n: int) -> list[str]:
    return [f"ds/train/{i:06d}.jpg" for i in range(n)]


def test_owners_are_distinct_and_stable() -> None:
    ring = Ring.build(1, ["a", "b", "c"])
    for k in keys(200):
        o = ring.owners(k, 3)
        assert len(o) == 3 and len(set(o)) == 3
        assert o == Ring.build(7, ["c", "a", "b"]).owners(k, 3)


def test_balance_within_reason() -> None:
    ring = Ring.build(1, [f"w{i}" for i in range(4)])
    counts = Counter(ring.owner(k) for k in keys(20000))
    assert min(counts.values()) > 20000 / 4 * 0.7


def test_adding_one_worker_moves_about_one_nth() -> None:
    before = Ring.build(1, [f"w{i}" for i in range(4)])
    after = Ring.build(2, [f"w{i}" for i in range(5)])
    ks = keys(20000)
    moved = sum(before.owner(k) != after.owner(k) for k in ks)
    assert 0.1 < moved / len(ks) < 0.3  # ideal 1/5
    # every moved key moved to the new worker
    assert all(after.owner(k) == "w4" for k in ks if before.owner(k) != after.owner(k))


def test_removing_a_worker_makes_the_next_owner_first() -> None:
    full = Ring.build(1, ["a", "b", "c"])
    for k in keys(300):
        first, second = full.owners(k, 2)
        rest = Ring.build(2, [m for m in ["a", "b", "c"] if m != first])
        assert rest.owner(k) == second


def test_empty_and_small_rings() -> None:
    assert Ring.build(0, []).owners("x", 2) == []
    assert Ring.build(0, ["a"]).owners("x", 3) == ["a"]

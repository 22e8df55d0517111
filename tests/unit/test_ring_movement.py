"""Adding one worker to N moves about 1/N of the keys (issue 13 item 4): measured over
100k keys for N = 3..10, and every key that moves goes to the new worker; taking one
away makes each of its keys' next owner the first, which is where a drain hands them."""

from __future__ import annotations

import pytest

from shoal.core.ring import Ring, moved_fraction, previous_owners

KEYS = [f"imagenet/train/n{i // 1000:05d}/{i:07d}.JPEG" for i in range(100_000)]


@pytest.mark.parametrize("n", range(3, 11))
def test_adding_a_worker_to_n_moves_about_one_nth_of_the_keys(n: int) -> None:
    before = Ring.build(1, [f"w-{i:02d}" for i in range(n)])
    after = Ring.build(2, [f"w-{i:02d}" for i in range(n + 1)])
    frac = moved_fraction(before, after, KEYS)
    assert 0.5 / n <= frac <= 1.5 / n + 0.05, f"N={n}: {frac:.4f} of the keys moved"
    new = f"w-{n:02d}"
    assert all(after.owner(k) == new for k in KEYS[:5000] if before.owner(k) != after.owner(k))


def test_removing_a_worker_moves_only_its_keys_to_their_next_owner() -> None:
    before = Ring.build(1, [f"w-{i}" for i in range(5)])
    after = Ring.build(2, [f"w-{i}" for i in range(5) if i != 2])
    for k in KEYS[:5000]:
        first, second = before.owners(k, 2)
        assert after.owner(k) == (second if first == "w-2" else first)
    assert 0.1 < moved_fraction(before, after, KEYS) < 0.3


def test_previous_owners_names_where_a_moved_key_was_cached() -> None:
    old = Ring.build(1, ["a", "b", "c"])
    new = Ring.build(2, ["a", "b", "c", "d"])
    moved = [k for k in KEYS[:2000] if old.owner(k) != new.owner(k)]
    kept = [k for k in KEYS[:2000] if old.owner(k) == new.owner(k)]
    assert moved and kept
    for k in moved:
        assert previous_owners(k, 1, new, [old], "d") == [old.owner(k)]
    for k in kept:  # nothing moved: nobody to ask (the owner is the asker itself)
        assert previous_owners(k, 1, new, [old], str(new.owner(k))) == []
    # the newest history first, at most ``limit`` peers, never the asker
    older = Ring.build(0, ["e"])
    k = moved[0]
    assert previous_owners(k, 1, new, [old, older], "d") == [old.owner(k), "e"]
    assert previous_owners(k, 1, new, [old, older], "d", limit=1) == [old.owner(k)]

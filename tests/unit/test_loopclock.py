"""The master's membership clock leaves its own loop's stalls out (shoal.master.loopclock)."""

from __future__ import annotations

import pytest

from shoal.master.loopclock import LoopClock


class Fake:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_runs_with_the_base_clock_while_the_loop_is_alive() -> None:
    base = Fake()
    c = LoopClock(1.0, base)
    start = c()
    for _ in range(10):
        base.t += 0.5
        assert c.alive() == 0.0
    assert c() - start == pytest.approx(5.0)


def test_stands_still_past_grace_and_leaves_the_stall_out() -> None:
    base = Fake()
    c = LoopClock(1.0, base)
    start = c()
    base.t += 30.0  # the loop stalled
    assert c() - start == pytest.approx(1.0)  # at most grace seconds counted
    assert c.alive() == pytest.approx(29.0)
    assert c() - start == pytest.approx(1.0)  # continuous across the fold
    base.t += 0.5
    assert c() - start == pytest.approx(1.5)


def test_never_goes_backwards() -> None:
    base = Fake()
    c = LoopClock(0.5, base)
    last = c()
    for step in (0.1, 2.0, 0.3, 5.0, 0.0, 0.4):
        base.t += step
        now = c()
        assert now >= last
        last = now
        c.alive()
        assert c() >= last


def test_grace_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LoopClock(0.0)

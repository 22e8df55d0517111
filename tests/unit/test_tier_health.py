"""The tier health state machine (plain calls, injected clock), and a disk tier whose
disk fails: skipped with misses and refused puts, one log line, then probed back."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from shoal.config import TierSpec
from shoal.store.disk import DiskTier
from shoal.store.health import DOWN, NORMAL, PROBING, UNSTABLE, TierHealth
from shoal.testing.store_conformance import blob, fkey, put_file


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def machine(clock: Clock) -> TierHealth:
    return TierHealth(
        errors_to_down=3, window=10, successes_to_normal=2, down_for=30, down_max=100, clock=clock
    )


def test_errors_make_it_unstable_then_down_and_successes_bring_it_back() -> None:
    clock = Clock()
    h = machine(clock)
    assert h.usable() == (True, None) and h.state == NORMAL
    assert h.error() == UNSTABLE
    assert h.success() is None and h.state == UNSTABLE
    assert h.success() == NORMAL  # two in a row
    # errors spread wider than the window never take it down
    for _ in range(5):
        h.error()
        clock.now += 6
    assert h.state == UNSTABLE
    assert h.error() is None and h.error() == DOWN


def test_down_is_skipped_then_probed_with_a_doubling_backoff() -> None:
    clock = Clock()
    h = machine(clock)
    for _ in range(3):
        h.error()
    assert h.state == DOWN
    assert h.usable() == (False, None) and h.skipped == 1
    clock.now += 29.9
    assert h.usable() == (False, None)
    clock.now += 0.1
    assert h.usable() == (True, PROBING)
    assert h.error() == DOWN and h.backoff == 60  # the probe failed: twice as long
    clock.now += 59
    assert h.usable()[0] is False
    clock.now += 1
    assert h.usable() == (True, PROBING)
    assert h.error() == DOWN and h.backoff == 100  # capped at down_max
    clock.now += 100
    assert h.usable() == (True, PROBING)
    assert h.success() == NORMAL and h.backoff == 30  # reset
    assert h.error() == UNSTABLE


def test_a_failing_disk_is_skipped_with_misses_and_one_line_then_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    t = DiskTier(TierSpec("ssd", str(tmp_path / "ssd"), 64 << 20))
    clock = Clock()
    t._health = TierHealth(clock=clock)
    try:
        for i in range(40):
            assert put_file(t, fkey(f"f{i}"), blob(i, 1000))

        def eio(*args: object) -> int:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "pread", eio)
        monkeypatch.setattr(os, "pwrite", eio)
        with caplog.at_level(logging.WARNING, logger="shoal.store"):
            for i in range(40):  # never an exception: misses and refused puts
                assert t.get(fkey(f"f{i}").page(0)) is None
                assert not put_file(t, fkey(f"n{i}"), blob(i, 1000))
        assert t.health == DOWN
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) <= 5, lines
        assert any("keeps failing" in m for m in lines)
        assert "down" in t.refusal()
        monkeypatch.undo()
        assert not put_file(t, fkey("later"), blob(1, 1000))  # still down: skipped
        clock.now += 30
        assert put_file(t, fkey("later"), blob(1, 1000))  # the probe works
        assert t.health == NORMAL and t.get(fkey("later").page(0)) == blob(1, 1000)
    finally:
        t.close()

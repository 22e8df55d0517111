"""Cron expressions of schedules: 5 fields or 6 (seconds last), never 7, and a clear
error for one that never matches a date."""

from __future__ import annotations

import datetime as dt

import pytest

from shoal.core import cron
from shoal.errors import InvalidArgument

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize(
    ("expr", "after"),
    [
        ("0 3 * * *", 15 * 3600),  # 12:00 -> 03:00 the next day
        ("*/5 * * * *", 300),
        ("* * * * * 30", 30),  # the 6th field is seconds
        ("@hourly", 3600),
    ],
)
def test_next_run(expr: str, after: float) -> None:
    cron.check(expr)
    assert cron.next_run(expr, NOW) - NOW == pytest.approx(after)


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("* * * * * * *", ("got 7", "6th field is seconds")),
        ("* * * *", ("got 4",)),
        ("bad", ("5 fields",)),
        ("", ("empty",)),
        ("61 * * * *", ("out of range",)),
        ("*/0 * * * *", ("out of range",)),
        ("0 0 31 2 *", ("never matches",)),
        ("0 0 30 2 *", ("never matches",)),
        ("0 0\x00 * * *", ("not a cron",)),
    ],
)
def test_refused(expr: str, words: tuple[str, ...]) -> None:
    with pytest.raises(InvalidArgument) as e:
        cron.next_run(expr, NOW)
    msg = e.value.message
    assert "\n" not in msg and "e.g. '0 3 * * *'" in msg
    for w in words:
        assert w in msg, msg
    assert "five fields" not in msg  # the old message, wrong once a 6th field is accepted

"""Cron expressions of job schedules: validation and the next run, no I/O.

Accepted: five fields (minute hour day-of-month month day-of-week), or six where the
sixth is seconds (croniter's convention, e.g. ``'0 3 * * * 30'``), or a macro such as
``@daily``. croniter itself also takes a seventh (year) field; a schedule never needs
one, and a mistaken seventh field made ``'* * * * * * *'`` run every second, so it is
refused here.
"""

from __future__ import annotations

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from shoal.errors import InvalidArgument

_MACROS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
_EXAMPLE = "e.g. '0 3 * * *' (daily at 03:00); a 6th field is seconds"


def _bad(expr: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"invalid cron expression {expr!r}: {why}; {_EXAMPLE}")


def check(expr: str) -> None:
    """Raise InvalidArgument unless ``expr`` is a schedule shoal runs."""
    if not isinstance(expr, str) or not expr.strip():
        raise _bad(str(expr), "empty")
    if "\x00" in expr or len(expr) > 200:
        raise _bad(expr[:40], "not a cron expression")
    fields = expr.split()
    if len(fields) == 1 and fields[0].lower() in _MACROS:
        return
    if len(fields) not in (5, 6):
        raise _bad(
            expr,
            f"expected 5 fields (minute hour day month weekday) or 6 (then seconds), "
            f"got {len(fields)}",
        )
    try:
        ok = croniter.is_valid(expr)
    except (CroniterError, ValueError, TypeError):
        ok = False
    if not ok:
        raise _bad(expr, "a field is out of range or malformed")


def next_run(expr: str, now: float) -> float:
    """The first time after ``now`` that ``expr`` matches (epoch seconds).

    Raises InvalidArgument for a malformed expression and for one that never matches
    a real date (``'0 0 31 2 *'``: there is no 31 February).
    """
    check(expr)
    try:
        return float(croniter(expr, now).get_next(float))
    except CroniterBadDateError:
        raise _bad(expr, "it never matches a date (such as 31 February)") from None
    except (CroniterBadCronError, CroniterError, ValueError, TypeError, OverflowError) as exc:
        raise _bad(expr, str(exc) or type(exc).__name__) from None

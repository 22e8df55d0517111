"""The CLI and API bad-input tables of issue 10 item 17, counted here: the tables and
their checks are tests/integration/test_cli_bad_input.py's (imported, not copied); this
module runs them again with figures, one row per table (each case: its exit status or
HTTP 400, one clear line, the master's datasets, jobs and schedules unchanged)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from relhelpers import Figures, integration_module

pytestmark = pytest.mark.integration

bad = integration_module("test_cli_bad_input")
world = bad.world  # the module's fixture: a dataset over a file:// source and a bucket


def _run(check: Callable[[Any], None], w: Any) -> list[str]:
    """The table's failures (its check lists one line per failed case)."""
    try:
        check(w)
    except AssertionError as exc:
        lines = str(exc).splitlines()
        return [ln for ln in lines if ":" in ln and not ln.startswith("assert")] or lines[:1]
    return []


@pytest.mark.timeout(240)
def test_cli_bad_input_table_counted(world: Any, figures: Figures) -> None:
    cases = bad._cases(world)
    failed = _run(bad.test_cli_bad_input_table, world)
    figures.record(
        "bad CLI invocations (tests/integration/test_cli_bad_input.py)",
        len(cases),
        "the expected exit status and one clear error line; the master's state unchanged",
        len(failed),
    )
    assert not failed, failed


@pytest.mark.timeout(120)
def test_api_bad_input_table_counted(world: Any, figures: Figures) -> None:
    failed = _run(bad.test_api_bad_input_table, world)
    figures.record(
        "bad master API requests (tests/integration/test_cli_bad_input.py)",
        len(bad._API),
        "400 with a one-line JSON error naming the problem; the master's state unchanged; "
        "answers stay strict JSON",
        len(failed),
    )
    assert not failed, failed

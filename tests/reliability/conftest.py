"""Fixtures of the standing reliability suite (issue 10); the helpers they use are in
relhelpers.py. Registers the ``slow`` marker: the longer probes, which ``make test``
and CI still run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from relhelpers import Figures, Readers


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: a longer reliability probe (still run by make test and CI)"
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    if rep.when == "call":
        item.stash[_outcome] = "xfailed" if hasattr(rep, "wasxfail") else rep.outcome
        item.stash[_reason] = getattr(rep, "wasxfail", "")
    return rep


_outcome = pytest.StashKey[str]()
_reason = pytest.StashKey[str]()


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    f = Figures(request.node.nodeid.split("::", 1)[-1], module=request.node.path.stem)
    yield f
    f.write(request.node.stash.get(_outcome, "error"), request.node.stash.get(_reason, ""))


@pytest.fixture
def readers(tmp_path: Path) -> Iterator[Readers]:
    r = Readers(tmp_path)
    yield r
    r.kill()

"""The client logs failovers aggregated: one line per worker per interval with a count,
not one per read (issue 10 item 18: 1,524 WARNING lines in one probe)."""

from __future__ import annotations

import logging

import pytest

from shoal.client.aio import AsyncClient
from shoal.client.cache import WorkerAddr
from shoal.client.routing import FAILOVER_LOG_EVERY
from shoal.config import ClientSettings
from shoal.errors import Unavailable


def test_failovers_are_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr("shoal.client.routing.time.monotonic", lambda: now[0])
    c = AsyncClient(ClientSettings(master="http://127.0.0.1:9"))
    monkeypatch.setattr(c.router, "refresh_soon", lambda: None)
    a = WorkerAddr("w-a", "127.0.0.1", 1, "", "n")
    b = WorkerAddr("w-b", "127.0.0.1", 2, "", "n")
    with caplog.at_level(logging.WARNING, logger="shoal.client"):
        for _ in range(500):
            c.router.mark_suspect(a, Unavailable("boom"))
            now[0] += 0.001
        c.router.mark_suspect(b, Unavailable("other"))
        now[0] += FAILOVER_LOG_EVERY
        c.router.mark_suspect(a, Unavailable("late"))
    lines = [r.getMessage() for r in caplog.records]
    assert c.cache.counters.failovers == 502
    assert len(lines) == 3, lines
    assert "w-a" in lines[0] and "w-b" in lines[1]
    assert "late" in lines[2] and "500 times" in lines[2], lines[2]

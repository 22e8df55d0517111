"""Waiting for the master's report to say something: workers send their counters with
their heartbeats, so what a test just did reaches ``report()`` a heartbeat later.

Both helpers poll until ``ok`` holds or ``timeout`` passes and return the last answer
either way, so the test's own assertion shows what the report said::

    d = wait_dataset(cluster, "ds", lambda d: d["hits"] >= 10)
    assert d["hits"] == 10, d
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from shoal.testing.cluster import TestCluster

Report = dict[str, Any]


def wait_report(
    cluster: TestCluster,
    ok: Callable[[Report], bool] = lambda r: True,
    timeout: float = 10.0,
    interval: float = 0.1,
) -> Report:
    """The cluster's report once ``ok(report)`` (or the last one at the deadline)."""
    deadline = time.monotonic() + timeout
    with cluster.client() as c:
        while True:
            r = c.report()
            if ok(r) or time.monotonic() > deadline:
                return r
            time.sleep(interval)


def dataset_of(report: Report, name: str) -> Report | None:
    return next((d for d in report["datasets"] if d["name"] == name), None)


def wait_dataset(
    cluster: TestCluster,
    name: str,
    ok: Callable[[Report], bool] = lambda d: True,
    timeout: float = 10.0,
    interval: float = 0.1,
) -> Report:
    """Dataset ``name``'s part of the report once ``ok(part)`` (or the last one at the
    deadline; a dataset the report does not list yet is waited for too)."""

    def good(r: Report) -> bool:
        d = dataset_of(r, name)
        return d is not None and ok(d)

    d = dataset_of(wait_report(cluster, good, timeout, interval), name)
    assert d is not None, f"dataset {name!r} is not in the report after {timeout} s"
    return d

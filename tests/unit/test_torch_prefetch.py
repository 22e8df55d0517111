"""The order-aware Prefetcher with a fake client: windows, jumps, memory bound, fork
and pickling. No sockets; the fake client answers cat_many from a dict."""

from __future__ import annotations

import os
import pickle
import threading
from typing import Any

import pytest

from shoal.errors import NotFound, ShoalError
from shoal.prefetch import Prefetcher

FILES = {f"/ds/m/{i:03d}": bytes([i % 256]) * (i + 1) for i in range(100)}


class FakeClient:
    def __init__(self) -> None:
        self.requests: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()

    def cat_many(self, paths: list[str]) -> dict[str, bytes | ShoalError]:
        self.gate.wait(10)
        self.requests.append(list(paths))
        return {p: FILES[p] if p in FILES else NotFound(p) for p in paths}

    def __reduce__(self) -> Any:
        return FakeClient, ()


def test_in_order_consumer_gets_everything_from_the_window() -> None:
    c = FakeClient()
    pf = Prefetcher(c, depth=16, batch=8)  # type: ignore[arg-type]
    order = list(FILES)
    pf.start(order)
    assert [pf.get(i) for i in range(len(order))] == [FILES[p] for p in order]
    s = pf.stats
    assert s.hits + s.waited == 100 and s.misses == 0 and s.fetched == 100
    assert all(len(r) <= 8 for r in c.requests) and sum(map(len, c.requests)) == 100
    pf.close()


def test_jumps_and_unknown_positions() -> None:
    c = FakeClient()
    pf = Prefetcher(c, depth=8, batch=4)  # type: ignore[arg-type]
    order = [*list(FILES)[:50], "/ds/m/missing"]
    pf.start(order)
    assert pf.get(0) == FILES[order[0]]
    assert pf.get(30) == FILES[order[30]]  # jump ahead: fetching restarts there
    assert pf.get(5) == FILES[order[5]]  # jump back
    assert pf.get(50) is None  # failed fetch: the caller reads it and sees the error
    assert pf.get(999) is None
    assert pf.stats.misses == 2
    pf.start(order[:3])  # a new epoch
    assert [pf.get(i) for i in range(3)] == [FILES[p] for p in order[:3]]
    pf.close()


def test_memory_bound_stops_reading_ahead() -> None:
    c = FakeClient()
    pf = Prefetcher(c, depth=64, batch=4, max_bytes=10)  # type: ignore[arg-type]
    order = list(FILES)[50:]  # files of 51+ bytes: one batch passes the bound
    pf.start(order)
    assert pf.get(0) == FILES[order[0]]
    # after the first batch the window stays full until the consumer moves on
    assert sum(map(len, c.requests)) <= 8
    assert [pf.get(i) for i in range(1, len(order))] == [FILES[p] for p in order[1:]]
    pf.close()


def test_pickles_to_settings_and_restarts_after_fork() -> None:
    c = FakeClient()
    pf = Prefetcher(c, depth=8, batch=4)  # type: ignore[arg-type]
    pf.start(list(FILES))
    assert pf.get(0) is not None
    clone = pickle.loads(pickle.dumps(pf))
    assert clone.depth == 8 and clone.stats.fetched == 0
    clone.start(list(FILES)[:4])
    assert clone.get(3) == FILES[list(FILES)[3]]
    clone.close()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread is gone, a new one starts
        ok = pf.get(1) is None and pf.stats.misses == 1  # no order in the child yet
        pf.start(list(FILES))
        ok = ok and [pf.get(i) for i in range(10)] == [FILES[p] for p in list(FILES)[:10]]
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    assert pf.get(1) == FILES[list(FILES)[1]]  # the parent goes on
    pf.close()


def test_invalid_settings() -> None:
    with pytest.raises(ShoalError):
        Prefetcher(FakeClient(), depth=0)  # type: ignore[arg-type]

"""The mount's kept listings (shoal.fuse.ahead): lookups are answered from a listing only
within the staleness bound, at the generation it was taken at, and never from a listing
that was in flight across a sync."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shoal.core.types import FileInfo
from shoal.fuse import ahead as ahead_mod
from shoal.fuse.ahead import Ahead
from shoal.fuse.nodes import Stats

DIR = "/ds/data/d0"


class FakeClient:
    def __init__(self) -> None:
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def ls(self, path: str) -> list[FileInfo]:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        return [FileInfo(f"{path}/f{i}", i + 1, f"v{i}", 1.0) for i in range(3)]


def named(path: str, e: FileInfo) -> FileInfo:
    return FileInfo(e.path.rsplit("/", 1)[1], e.size, e.version, e.mtime, e.is_dir)


def make(gen: list[int]) -> tuple[Ahead, FakeClient]:
    client = FakeClient()
    a = Ahead(client, Stats(), named, lambda path: gen[0])  # type: ignore[arg-type]
    return a, client


async def lookups(a: Ahead, n: int, ttl: float = 60.0) -> list[bool]:
    return [await a.wait_listing(DIR, ttl) for _ in range(n)]


def test_listing_answers_until_generation_moves_then_relists_once() -> None:
    async def go() -> None:
        gen = [1]
        a, client = make(gen)
        assert await lookups(a, 2) == [False, True]  # the second cold lookup lists
        assert client.calls == 1
        e = a.entry(DIR, "f1", 60.0)
        assert e is not None and e.size == 2
        assert a.entry(DIR, "nope", 60.0) is None  # asked for, not made up
        gen[0] = 2  # a sync elsewhere: the entries are of an old generation
        assert a.entry(DIR, "f1", 60.0) is None
        await lookups(a, 3)
        assert client.calls == 2  # listed again once, not per lookup
        assert a.entry(DIR, "f1", 60.0) is not None

    asyncio.run(go())


def test_listing_older_than_the_bound_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(ahead_mod.time, "monotonic", lambda: now[0])

    async def go() -> None:
        a, _ = make([1])
        await lookups(a, 2, ttl=5.0)
        assert a.entry(DIR, "f0", 5.0) is not None
        now[0] += 6.0
        assert a.entry(DIR, "f0", 5.0) is None

    asyncio.run(go())


def test_listing_in_flight_across_a_sync_is_not_kept() -> None:
    async def go() -> None:
        a, client = make([1])
        client.gate = asyncio.Event()
        await a.wait_listing(DIR, 60.0)
        task: Any = asyncio.ensure_future(a.wait_listing(DIR, 60.0))
        await client.entered.wait()  # the listing started, held at the gate
        assert client.calls == 1
        a.forget_dataset("ds")
        client.gate.set()
        await task
        assert a.entry(DIR, "f0", 60.0) is None

    asyncio.run(go())

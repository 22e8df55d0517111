"""Eviction policies are pure: plain calls in, victims out."""

from __future__ import annotations

import pytest

from shoal.errors import InvalidArgument
from shoal.store.eviction import FIFO, LFU, LRU, EvictionPolicy, UnitStats, make_policy


def drain(policy: EvictionPolicy[str]) -> list[str]:
    out = []
    while (victim := policy.pop_victim()) is not None:
        out.append(victim)
    return out


def test_lru_evicts_least_recently_used() -> None:
    p: LRU[str] = LRU()
    for k in "abcd":
        p.add(k)
    p.touch("a")
    p.touch("c")
    assert drain(p) == ["b", "d", "a", "c"]


def test_fifo_ignores_reads() -> None:
    p: FIFO[str] = FIFO()
    for k in "abc":
        p.add(k)
    p.touch("a")
    assert drain(p) == ["a", "b", "c"]


def test_lfu_evicts_least_frequent_then_least_recent() -> None:
    p: LFU[str] = LFU()
    for k in "abcd":
        p.add(k)
    for k in "aabbbd":
        p.touch(k)
    # counts: a=3 b=4 c=1 d=2
    assert drain(p) == ["c", "d", "a", "b"]


def test_lfu_ties_break_by_recency() -> None:
    p: LFU[str] = LFU()
    for k in "abc":
        p.add(k)
    for k in "cba":
        p.touch(k)
    assert drain(p) == ["c", "b", "a"]


@pytest.mark.parametrize("name", ["lru", "lfu", "fifo"])
def test_common_contract(name: str) -> None:
    p: EvictionPolicy[str] = make_policy(name)
    assert p.name == name
    assert p.pop_victim() is None
    p.add("a")
    p.add("a")  # known: no-op
    p.add("b")
    assert len(p) == 2 and "a" in p and "z" not in p
    p.touch("z")  # unknown: ignored
    p.remove("z")
    p.remove("a")
    assert "a" not in p and len(p) == 1
    assert p.pop_victim(skip={"b"}) is None
    assert p.pop_victim() == "b"
    assert len(p) == 0


@pytest.mark.parametrize("name", ["lru", "lfu", "fifo"])
def test_skip_leaves_the_order_alone(name: str) -> None:
    p: EvictionPolicy[str] = make_policy(name)
    for k in "abc":
        p.add(k)
    assert p.pop_victim(skip={"a"}) == "b"
    assert drain(p) == ["a", "c"]


def test_load_orders_by_stats() -> None:
    units = [
        ("new", UnitStats(last_access=30, access_count=1, inserted_at=3)),
        ("old", UnitStats(last_access=10, access_count=9, inserted_at=2)),
        ("mid", UnitStats(last_access=20, access_count=5, inserted_at=1)),
    ]
    lru: LRU[str] = LRU()
    lru.load(units)
    assert drain(lru) == ["old", "mid", "new"]
    fifo: FIFO[str] = FIFO()
    fifo.load(units)
    assert drain(fifo) == ["mid", "old", "new"]
    lfu: LFU[str] = LFU()
    lfu.load(units)
    assert drain(lfu) == ["new", "mid", "old"]


def test_unknown_policy_is_a_user_error() -> None:
    with pytest.raises(InvalidArgument, match="lru"):
        make_policy("random")


def test_per_dataset_policies_and_the_idle_dataset_gives_way() -> None:
    from dataclasses import dataclass

    from shoal.store.eviction import PerDataset

    @dataclass(frozen=True)
    class Key:
        dataset: str
        name: str

    p = PerDataset("lru")
    p.set_kind("fifo-ds", "fifo")
    a1, a2, b1, b2 = (
        Key("fifo-ds", "a1"),
        Key("fifo-ds", "a2"),
        Key("lru-ds", "b1"),
        Key("lru-ds", "b2"),
    )
    for k in (a1, a2, b1, b2):
        p.add(k)
    p.touch(a1)  # fifo ignores reads of a1 within its dataset...
    p.touch(b1)  # ...and lru-ds is now the most recently used dataset
    assert len(p) == 4 and a1 in p
    assert p.pop_victim() == a1  # fifo-ds was used longest ago; fifo order inside it
    p.touch(a2)
    assert p.pop_victim() == b2  # lru-ds is idle now: its least recently used first
    p.set_kind("lru-ds", "lfu")  # a policy change keeps the units
    assert set(p) == {a2, b1}

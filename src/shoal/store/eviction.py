"""Eviction policies by name: which cached unit goes first when a tier is over quota.

Pure bookkeeping, no I/O and no clock: the store tells a policy which units exist
(``add``), which were used (``touch``) and which left (``remove``), and asks for the next
victim (``pop_victim``). A unit is whatever the store evicts as a whole (for the disk
tier: a small file, or a whole large-file version). Pinned units are simply never added.

Every operation is O(1) except LFU's victim choice, which is O(number of distinct
access counts).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Container, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shoal.errors import InvalidArgument

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class UnitStats:
    """What a policy may know about a unit when it is (re)loaded, e.g. after a restart."""

    last_access: float = 0.0
    access_count: int = 1
    inserted_at: float = 0.0


class EvictionPolicy(ABC, Generic[K]):
    """Orders units for eviction."""

    name: str = ""

    @abstractmethod
    def add(self, key: K) -> None:
        """A new unit, just inserted and used once (no-op if already known)."""

    @abstractmethod
    def touch(self, key: K) -> None:
        """The unit was read (ignored for unknown keys)."""

    def touch_times(self, key: K, times: int) -> None:
        """``times`` reads of the unit at once (the pages of a file a client read):
        as ``touch`` that many times."""
        for _ in range(times):
            self.touch(key)

    @abstractmethod
    def remove(self, key: K) -> None:
        """The unit left the tier or was pinned (ignored for unknown keys)."""

    @abstractmethod
    def pop_victim(self, skip: Container[K] = ()) -> K | None:
        """Remove and return the unit to evict next, passing over ``skip``; None if empty."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

    @abstractmethod
    def __iter__(self) -> Iterator[K]:
        """The units, first victim first."""

    @abstractmethod
    def _sort_key(self, stats: UnitStats) -> tuple[float, ...]:
        """Order in which ``load`` adds units: first added is evicted first."""

    def load(self, units: Iterable[tuple[K, UnitStats]]) -> None:
        """Add many units at once in the order their stats imply (used on restart)."""
        for key, stats in sorted(units, key=lambda u: self._sort_key(u[1])):
            self._load_one(key, stats)

    def _load_one(self, key: K, stats: UnitStats) -> None:
        self.add(key)


class _OrderedPolicy(EvictionPolicy[K]):
    """Victims in the order of an OrderedDict (front first)."""

    def __init__(self) -> None:
        self._order: OrderedDict[K, None] = OrderedDict()

    def add(self, key: K) -> None:
        if key not in self._order:
            self._order[key] = None

    def remove(self, key: K) -> None:
        self._order.pop(key, None)

    def pop_victim(self, skip: Container[K] = ()) -> K | None:
        for key in self._order:
            if key not in skip:
                del self._order[key]
                return key
        return None

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._order))


class LRU(_OrderedPolicy[K]):
    """Least recently used first."""

    name = "lru"

    def touch(self, key: K) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def touch_times(self, key: K, times: int) -> None:
        if times > 0:
            self.touch(key)  # the last read is all recency knows

    def _sort_key(self, stats: UnitStats) -> tuple[float, ...]:
        return (stats.last_access, stats.inserted_at)


class FIFO(_OrderedPolicy[K]):
    """First inserted first, whatever the reads."""

    name = "fifo"

    def touch(self, key: K) -> None:
        pass

    def touch_times(self, key: K, times: int) -> None:
        pass

    def _sort_key(self, stats: UnitStats) -> tuple[float, ...]:
        return (stats.inserted_at,)


class LFU(EvictionPolicy[K]):
    """Least frequently used first; ties broken least recently used first.

    Units sit in buckets by access count; each bucket is in recency order.
    """

    name = "lfu"

    def __init__(self) -> None:
        self._count: dict[K, int] = {}
        self._buckets: dict[int, OrderedDict[K, None]] = {}

    def _put(self, key: K, count: int) -> None:
        self._count[key] = count
        bucket = self._buckets.get(count)
        if bucket is None:
            bucket = self._buckets[count] = OrderedDict()
        bucket[key] = None

    def _take(self, key: K) -> int | None:
        count = self._count.pop(key, None)
        if count is not None:
            bucket = self._buckets[count]
            del bucket[key]
            if not bucket:
                del self._buckets[count]
        return count

    def add(self, key: K) -> None:
        if key not in self._count:
            self._put(key, 1)

    def touch(self, key: K) -> None:
        count = self._take(key)
        if count is not None:
            self._put(key, count + 1)

    def touch_times(self, key: K, times: int) -> None:
        if times > 0:
            count = self._take(key)
            if count is not None:
                self._put(key, count + times)

    def remove(self, key: K) -> None:
        self._take(key)

    def pop_victim(self, skip: Container[K] = ()) -> K | None:
        for count in sorted(self._buckets):
            for key in self._buckets[count]:
                if key not in skip:
                    self._take(key)
                    return key
        return None

    def __len__(self) -> int:
        return len(self._count)

    def __contains__(self, key: object) -> bool:
        return key in self._count

    def __iter__(self) -> Iterator[K]:
        return iter([k for c in sorted(self._buckets) for k in self._buckets[c]])

    def _sort_key(self, stats: UnitStats) -> tuple[float, ...]:
        return (stats.last_access, stats.inserted_at)

    def _load_one(self, key: K, stats: UnitStats) -> None:
        self._take(key)
        self._put(key, max(1, stats.access_count))


POLICIES: dict[str, type[EvictionPolicy[Any]]] = {"lru": LRU, "lfu": LFU, "fifo": FIFO}


def make_policy(name: str) -> EvictionPolicy[K]:
    """A fresh policy by its name: lru, lfu or fifo."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise InvalidArgument(
            f"unknown eviction policy {name!r}: use {', '.join(POLICIES)}"
        ) from None
    policy: EvictionPolicy[K] = cls()
    return policy


class PerDataset(EvictionPolicy[Any]):
    """Each dataset's units ordered by the dataset's own policy (lru, lfu or fifo).

    The victim comes from the dataset whose units were used least recently (an idle
    dataset gives way before one a job is reading), and within it the dataset's policy
    picks. Units are FileKey-like: anything with a ``dataset`` attribute.
    """

    name = "per-dataset"

    def __init__(self, default: str = "lru") -> None:
        make_policy(default)  # validate
        self.default = default
        self._subs: dict[str, EvictionPolicy[Any]] = {}
        self._last: dict[str, int] = {}
        self._tick = 0

    def set_kind(self, dataset: str, kind: str) -> None:
        """Use ``kind`` for a dataset from now on (its units keep their current order)."""
        old = self._subs.get(dataset)
        if old is not None and old.name == kind:
            return
        new: EvictionPolicy[Any] = make_policy(kind)
        for key in old or ():
            new.add(key)
        self._subs[dataset] = new

    def _sub(self, dataset: str) -> EvictionPolicy[Any]:
        sub = self._subs.get(dataset)
        if sub is None:
            sub = self._subs[dataset] = make_policy(self.default)
        return sub

    def _used(self, dataset: str) -> None:
        self._tick += 1
        self._last[dataset] = self._tick

    def add(self, key: Any) -> None:
        self._sub(key.dataset).add(key)
        self._used(key.dataset)

    def touch(self, key: Any) -> None:
        sub = self._subs.get(key.dataset)
        if sub is not None:
            sub.touch(key)
            self._used(key.dataset)

    def touch_times(self, key: Any, times: int) -> None:
        sub = self._subs.get(key.dataset)
        if sub is not None and times > 0:
            sub.touch_times(key, times)
            self._used(key.dataset)

    def remove(self, key: Any) -> None:
        sub = self._subs.get(key.dataset)
        if sub is not None:
            sub.remove(key)

    def pop_victim(self, skip: Container[Any] = ()) -> Any | None:
        for ds in sorted(self._subs, key=lambda d: self._last.get(d, 0)):
            victim = self._subs[ds].pop_victim(skip)
            if victim is not None:
                return victim
        return None

    def __len__(self) -> int:
        return sum(len(s) for s in self._subs.values())

    def __contains__(self, key: object) -> bool:
        sub = self._subs.get(getattr(key, "dataset", ""))
        return sub is not None and key in sub

    def __iter__(self) -> Iterator[Any]:
        return iter([k for s in self._subs.values() for k in s])

    def _sort_key(self, stats: UnitStats) -> tuple[float, ...]:
        return (stats.last_access, stats.inserted_at)

    def load(self, units: Iterable[tuple[Any, UnitStats]]) -> None:
        by_ds: dict[str, list[tuple[Any, UnitStats]]] = {}
        for key, stats in units:
            by_ds.setdefault(key.dataset, []).append((key, stats))
        # datasets used longest ago first, so they are the first to give way
        order = sorted(by_ds, key=lambda d: max(s.last_access for _, s in by_ds[d]))
        for ds in order:
            self._sub(ds).load(by_ds[ds])
            self._used(ds)

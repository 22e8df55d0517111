"""Demotion: where the pages a tier evicts go, decided by the composite that stacks it.

A tier does not know what lies below it. It reports each file version it evicts to its
``on_evict`` sink (see :class:`~shoal.store.base.Tier`) with the pages read lazily;
:class:`Demotion`, the sink a :class:`~shoal.store.tiered.TieredStore` gives each of its
tiers but the last, puts them into a tier below that the file's dataset allows, and
stops at the first page it refuses (the rest of the file is dropped with it: a partial
copy of a small file cannot exist, and a large file's present pages stay useful).

A small file goes to the first such tier. A large file version moves as a unit to one
tier, so that it stays whole there (one data file that a local reader, FUSE passthrough
or sendfile can take at once): the tier below that already holds some of its pages,
else the first where it fits within its share (:func:`fit`), else the first it fits at
all, else the first allowed. The tiered composite places new large files by the same
rule (:func:`placement`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TypeVar

from shoal.core.types import FileKey
from shoal.store.base import CacheStore, EvictedPages, PageStore

S = TypeVar("S", bound=PageStore)

#: a large file takes a tier only where it fills at most this share of the tier's room:
#: a bigger one would evict most of what the tier holds each time it is read through
SHARE = 0.5

WITHIN_SHARE, FITS, TOO_LARGE = 0, 1, 2


def fit(store: PageStore, size: int) -> int:
    """How a large file of ``size`` bytes fits a store whole: WITHIN_SHARE of its room
    (or its room is not known), FITS its room, or TOO_LARGE."""
    room = store.file_room()
    if room is None or size <= room * SHARE:
        return WITHIN_SHARE
    return FITS if size <= room else TOO_LARGE


def placement(stores: Sequence[S], size: int) -> list[S]:
    """The stores in the order a large file of ``size`` bytes tries them: best fit
    first, fastest first within a fit."""
    return sorted(stores, key=lambda s: fit(s, size))


def _any_tier(dataset: str) -> tuple[str, ...]:
    return ()


class Demotion:
    """An :data:`~shoal.store.base.EvictionSink` over the tiers ``below`` (fastest first).

    ``allowed(dataset)`` gives the tiers a dataset allows (empty = any), as the composite
    last saw them in a put.
    """

    __slots__ = ("_allowed", "below")

    def __init__(
        self,
        below: Sequence[CacheStore],
        allowed: Callable[[str], tuple[str, ...]] = _any_tier,
    ) -> None:
        self.below = tuple(below)
        self._allowed = allowed

    @property
    def next(self) -> PageStore | None:
        """The tier right below (where pages go unless the dataset excludes it)."""
        return self.below[0] if self.below else None

    def _candidates(self, dataset: str) -> list[CacheStore]:
        tiers = self._allowed(dataset)
        return [t for t in self.below if not tiers or t.name in tiers]

    def target(self, dataset: str) -> CacheStore | None:
        """The first tier below that the dataset allows; None = drop."""
        return next(iter(self._candidates(dataset)), None)

    def target_whole(self, file: FileKey, size: int) -> CacheStore | None:
        """Where a large file version of ``size`` bytes goes whole (see the module
        docstring); None = drop."""
        below = self._candidates(file.dataset)
        holder = next((t for t in below if t.has_file(file)), None) if below else None
        return holder if holder is not None else next(iter(placement(below, size)), None)

    def __call__(self, file: FileKey, pages: EvictedPages) -> None:
        if self.target(file.dataset) is None:
            return  # dropped: read nothing
        first = next(pages, None)
        if first is None:
            return
        meta = first[2]
        large = meta.file_size > meta.page_size
        to = self.target_whole(file, meta.file_size) if large else self.target(file.dataset)
        if to is None:
            return
        for key, data, meta in itertools.chain((first,), pages):
            if not to.put(key, data, meta):
                return

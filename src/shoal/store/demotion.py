"""Demotion: where the pages a tier evicts go, decided by the composite that stacks it.

A tier does not know what lies below it. It reports each file version it evicts to its
``on_evict`` sink (see :class:`~shoal.store.base.Tier`) with the pages read lazily;
:class:`Demotion`, the sink a :class:`~shoal.store.tiered.TieredStore` gives each of its
tiers but the last, puts them into the first tier below that the file's dataset allows,
and stops at the first page it refuses (the rest of the file is dropped with it: a
partial copy of a small file cannot exist, and a large file's present pages stay useful).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shoal.core.types import FileKey
from shoal.store.base import EvictedPages, PageStore


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
        below: Sequence[PageStore],
        allowed: Callable[[str], tuple[str, ...]] = _any_tier,
    ) -> None:
        self.below = tuple(below)
        self._allowed = allowed

    @property
    def next(self) -> PageStore | None:
        """The tier right below (where pages go unless the dataset excludes it)."""
        return self.below[0] if self.below else None

    def target(self, dataset: str) -> PageStore | None:
        """The first tier below that the dataset allows; None = drop."""
        tiers = self._allowed(dataset)
        return next((t for t in self.below if not tiers or t.name in tiers), None)

    def __call__(self, file: FileKey, pages: EvictedPages) -> None:
        to = self.target(file.dataset)
        if to is None:
            return
        for key, data, meta in pages:
            if not to.put(key, data, meta):
                return

"""TieredStore: several tiers (MEM, SSD, HDD) behind one PageStore, fastest first.

Owns the placement between tiers: reads look top-down; a small file goes to the highest
tier that accepts it. A large file version lives whole in one tier, so that a complete
one is a single data file (what ``locate_file``, a local reader's descriptor, FUSE
passthrough and sendfile need): its first page goes to the fastest tier where it fits
within the tier's share (:func:`~shoal.store.demotion.placement`: a file larger than
half a tier's room skips it), its later pages to the tier holding it. If that tier
refuses one (after evicting what it could: pinned data, a filesystem others fill), the
version moves whole to a tier below that can hold it; only a file that no tier takes
whole is stored across tiers (logged). It owns demotion too: each tier but the last gets
a :class:`~shoal.store.demotion.Demotion` as its ``on_evict`` sink, so that a file
version a tier evicts goes into a tier below it that the file's dataset allows (as the
composite last saw it in a put; any tier if it has not seen one), a large one whole into
one tier, instead of being dropped. A page read from a lower tier is not promoted.

A tier that is down (:mod:`~shoal.store.health`) answers misses and refuses puts
without touching its disk, so reads fall through to the tiers below and puts go to
the next tier that accepts them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from shoal.config import TierSpec
from shoal.core.types import TIERS, FileKey, PageKey
from shoal.errors import InvalidArgument
from shoal.store.base import CacheStore, DatasetUsage, Location, PutMeta, Tier, Usage
from shoal.store.demotion import TOO_LARGE, Demotion, fit, placement
from shoal.store.disk import DiskTier
from shoal.store.space import Aggregated

log = logging.getLogger("shoal.store.tiered")

T = TypeVar("T")


class TieredStore(CacheStore):
    """Tiers in order, fastest first; ``demote`` hands each tier's evicted pages down
    (a tier whose ``on_evict`` is already set keeps it)."""

    name = "tiered"

    def __init__(self, tiers: list[Tier], *, demote: bool = True) -> None:
        if not tiers:
            raise InvalidArgument("a tiered store needs at least one tier")
        self.tiers = list(tiers)
        self._refusal = ""
        #: the tiers each dataset allows, as its last put said (for demotion)
        self._allowed: dict[str, tuple[str, ...]] = {}
        #: bytes dropped per tier and reason other than a watermark eviction (which each
        #: tier counts itself): "ttl" by :meth:`expire`, "free" by :meth:`delete` (for
        #: metrics)
        self.dropped: dict[tuple[str, str], int] = {}
        self._warnings = Aggregated(log)
        if demote:
            for i, upper in enumerate(self.tiers[:-1]):
                if upper.on_evict is None:
                    upper.on_evict = Demotion(self.tiers[i + 1 :], self._allowed_tiers)

    @classmethod
    def from_specs(cls, specs: list[TierSpec], *, demote: bool = True) -> TieredStore:
        """Open a DiskTier per spec, ordered mem, ssd, hdd (stable within a kind)."""
        ordered = sorted(specs, key=lambda s: TIERS.index(s.name))
        opened: list[Tier] = []
        try:
            for spec in ordered:
                opened.append(DiskTier(spec))
        except BaseException:
            for tier in opened:
                tier.close()
            raise
        return cls(opened, demote=demote)

    def _allowed_tiers(self, dataset: str) -> tuple[str, ...]:
        return self._allowed.get(dataset, ())

    def _first(self, ask: Callable[[Tier], T | None]) -> T | None:
        """The first tier's answer that is not None, fastest tier first."""
        for tier in self.tiers:
            got = ask(tier)
            if got is not None:
                return got
        return None

    def _total(self, ask: Callable[[Tier], int | None]) -> int | None:
        """The sum over the tiers, or None if any tier cannot say."""
        counts = [ask(tier) for tier in self.tiers]
        return None if None in counts else sum(c for c in counts if c is not None)

    def get(self, key: PageKey) -> bytes | None:
        return self._first(lambda t: t.get(key))

    # the hot lookups loop themselves (no lambda, no generator: a call per tier)
    def locate(self, key: PageKey) -> Location | None:
        for tier in self.tiers:
            loc = tier.locate(key)
            if loc is not None:
                return loc
        return None

    def peek(self, key: PageKey) -> Location | None:
        for tier in self.tiers:
            loc = tier.peek(key)
            if loc is not None:
                return loc
        return None

    def touch(self, key: PageKey) -> bool:
        return any(tier.touch(key) for tier in self.tiers)

    def touch_pages(self, file: FileKey, start: int, stop: int) -> int:
        """Each page in the tier that holds it (a file split across tiers goes on in
        the next one), up to the first page no tier holds."""
        at = start
        while at < stop:
            for tier in self.tiers:
                n = tier.touch_pages(file, at, stop)
                if n:
                    at += n
                    break
            else:
                break
        return at - start

    def locate_file(self, file: FileKey) -> Location | None:
        return self._first(lambda t: t.locate_file(file))

    def locate_run(self, file: FileKey) -> tuple[Location, list[int]] | None:
        return self._first(lambda t: t.locate_run(file))

    def put(self, key: PageKey, data: bytes | memoryview, meta: PutMeta) -> bool:
        if meta.tiers or key.file.dataset in self._allowed:
            self._allowed[key.file.dataset] = meta.tiers
        if self.contains(key):
            return True
        allowed = [t for t in self.tiers if not meta.tiers or t.name in meta.tiers]
        if meta.file_size > meta.page_size:
            if self._put_large(key, data, meta, allowed):
                return True
        elif any(tier.put(key, data, meta) for tier in allowed):
            return True
        self._refusal = (
            "; ".join(f"{t.name}: {t.refusal() or 'refused'}" for t in allowed)
            or f"no tier allowed (the dataset allows {', '.join(meta.tiers)})"
        )
        return False

    def _put_large(
        self, key: PageKey, data: bytes | memoryview, meta: PutMeta, allowed: list[Tier]
    ) -> bool:
        """A page of a large file, into the one tier that holds (or is to hold) the
        whole version: the tier holding some of it already, else the best fit
        (:func:`~shoal.store.demotion.placement`). Kept whole, it is one data file that a
        local reader, FUSE passthrough or sendfile takes at once."""
        file, size = key.file, meta.file_size
        holder = next((t for t in allowed if t.has_file(file)), None)
        if holder is None:
            return any(t.put(key, data, meta) for t in placement(allowed, size))
        if holder.put(key, data, meta):
            return True
        # the holder evicted what it could and still refused (pinned data, a filesystem
        # that others fill): move the version whole to a tier below that can hold it
        # (the holder's demotion picks it by the same rule) rather than split it
        tried = [holder]
        i = self.tiers.index(holder)
        below = [t for t in allowed if self.tiers.index(t) > i]
        if any(t.has_file(file) or fit(t, size) != TOO_LARGE for t in below):
            holder.evict(file)
            moved = next((t for t in below if t.has_file(file)), None)
            if moved is not None:
                if moved.put(key, data, meta):
                    return True
                tried.append(moved)
        for t in placement(allowed, size):
            if t not in tried and t.put(key, data, meta):
                if any(o is not t and o.has_file(file) for o in allowed):
                    self._warnings.note(
                        "split",
                        "%d pages of large files stored in another tier than the rest of "
                        "their file in the last %.0fs (no tier took it whole; last: %s)",
                        f"{key} in {t.name}, {size} bytes",
                    )
                return True
        return False

    def put_many(self, pages: Sequence[tuple[PageKey, bytes | memoryview, PutMeta]]) -> list[bool]:
        """As :meth:`put` one by one; the small files of a dataset go to each allowed
        tier as one run (see :meth:`DiskTier.put_many`), what it refused to the next."""
        out = [False] * len(pages)
        runs: dict[tuple[str, ...], list[int]] = {}
        for j, (key, data, meta) in enumerate(pages):
            if meta.file_size > meta.page_size:
                out[j] = self.put(key, data, meta)
                continue
            if meta.tiers or key.file.dataset in self._allowed:
                self._allowed[key.file.dataset] = meta.tiers
            if self.contains(key):
                out[j] = True
            else:
                runs.setdefault(meta.tiers, []).append(j)
        for tiers, left in runs.items():
            allowed = [t for t in self.tiers if not tiers or t.name in tiers]
            for tier in allowed:
                got = tier.put_many([pages[j] for j in left])
                for j, ok in zip(left, got, strict=True):
                    out[j] = ok
                left = [j for j, ok in zip(left, got, strict=True) if not ok]
                if not left:
                    break
            if left:
                self._refusal = (
                    "; ".join(f"{t.name}: {t.refusal() or 'refused'}" for t in allowed)
                    or f"no tier allowed (the dataset allows {', '.join(tiers)})"
                )
        return out

    def refusal(self) -> str:
        return self._refusal

    def reclaim(self, budget: int) -> bool:
        """One slice of each tier's reclaim walk, fastest tier first."""
        more = False
        for tier in self.tiers:
            more = tier.reclaim(budget) or more
        return more

    def contains(self, key: PageKey) -> bool:
        for tier in self.tiers:  # noqa: SIM110 - any() over a generator costs more, per page
            if tier.contains(key):
                return True
        return False

    def has_file(self, file: FileKey) -> bool:
        return any(tier.has_file(file) for tier in self.tiers)

    def files(self, dataset: str, prefix: str = "") -> list[FileKey]:
        return sorted(
            {fk for tier in self.tiers for fk in tier.files(dataset, prefix)},
            key=lambda f: (f.path, f.version),
        )

    def changes(self) -> int | None:
        return self._total(lambda t: t.changes())

    def file_count(self, dataset: str) -> int | None:
        return self._total(lambda t: t.file_count(dataset))

    def files_in_dir(self, dataset: str, directory: str) -> list[FileKey]:
        return sorted(
            {fk for t in self.tiers for fk in t.files_in_dir(dataset, directory)},
            key=lambda f: (f.path, f.version),
        )

    def versions(self, dataset: str, path: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for tier in self.tiers:
            out.update(tier.versions(dataset, path))
        return out

    def delete(self, file: FileKey | None = None, *, dataset: str | None = None) -> int:
        return self._count("free", lambda tier: tier.delete(file, dataset=dataset))

    def drop_corrupt(self, key: PageKey) -> None:
        for tier in self.tiers:
            if tier.contains(key):
                tier.drop_corrupt(key)
                return

    def expire(self, now: float) -> int:
        return self._count("ttl", lambda tier: tier.expire(now))

    def _count(self, reason: str, drop: Callable[[Tier], int]) -> int:
        total = 0
        for tier in self.tiers:
            freed = drop(tier)
            if freed:
                key = (tier.name, reason)
                self.dropped[key] = self.dropped.get(key, 0) + freed
                total += freed
        return total

    def tier_usage(self) -> list[tuple[str, Usage]]:
        """Each tier's own usage, fastest first."""
        return [(tier.name, tier.usage()) for tier in self.tiers]

    def usage(self) -> Usage:
        total = Usage()
        for _, u in self.tier_usage():
            total.capacity += u.capacity
            total.used += u.used
            total.pages += u.pages
            total.files += u.files
            total.evicted_bytes += u.evicted_bytes
            total.corrupt_pages += u.corrupt_pages
            for ds, du in u.by_dataset.items():
                agg = total.by_dataset.setdefault(ds, DatasetUsage())
                agg.files += du.files
                agg.bytes += du.bytes
        return total

    def flush(self) -> None:
        for tier in self.tiers:
            tier.flush()

    def close(self) -> None:
        errors: list[BaseException] = []
        for tier in self.tiers:
            try:
                tier.close()
            except Exception as exc:  # close the others anyway
                log.warning("closing tier %s failed: %s", tier.name, exc)
                errors.append(exc)
        if errors:
            raise errors[0]

    def __repr__(self) -> str:
        return f"TieredStore({', '.join(repr(t) for t in self.tiers)})"

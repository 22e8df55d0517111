"""Consistent-hash placement of file paths over live workers, with virtual nodes.

Adding or removing one of N workers moves about 1/N of the keys (tests/unit/
test_ring_movement.py measures it). ``owners(key, k)``
walks the ring clockwise from the key's hash and returns the first k distinct workers:
``replicas=k`` keeps copies on exactly those, and a client fails over along the same
order.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import xxhash

DEFAULT_VNODES = 128


def _h(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode())


@dataclass(frozen=True)
class Ring:
    epoch: int
    members: tuple[str, ...]
    vnodes: int = DEFAULT_VNODES

    def __post_init__(self) -> None:
        points: list[tuple[int, str]] = []
        for m in sorted(set(self.members)):
            for v in range(self.vnodes):
                points.append((_h(f"{m}#{v}"), m))
        points.sort()
        object.__setattr__(self, "_hashes", [p[0] for p in points])
        object.__setattr__(self, "_owners", [p[1] for p in points])

    @classmethod
    def build(cls, epoch: int, members: Iterable[str], vnodes: int = DEFAULT_VNODES) -> Ring:
        return cls(epoch, tuple(sorted(set(members))), vnodes)

    def owners(self, key: str, k: int = 1) -> list[str]:
        """The first k distinct workers clockwise from ``key``; fewer if the ring is small."""
        hashes: list[int] = self._hashes  # type: ignore[attr-defined]
        owners: Sequence[str] = self._owners  # type: ignore[attr-defined]
        if not hashes:
            return []
        want = min(k, len(self.members))
        i = bisect.bisect_left(hashes, _h(key))
        out: list[str] = []
        n = len(hashes)
        for j in range(n):
            m = owners[(i + j) % n]
            if m not in out:
                out.append(m)
                if len(out) == want:
                    break
        return out

    def owner(self, key: str) -> str | None:
        o = self.owners(key, 1)
        return o[0] if o else None


def moved_fraction(before: Ring, after: Ring, keys: Sequence[str]) -> float:
    """The share of ``keys`` whose first owner differs between two rings (0..1)."""
    if not keys:
        return 0.0
    return sum(before.owner(k) != after.owner(k) for k in keys) / len(keys)


def previous_owners(
    key: str,
    k: int,
    current: Ring,
    history: Sequence[Ring],
    me: str,
    limit: int = 2,
) -> list[str]:
    """Workers that owned ``key`` in earlier rings (``history``, newest first) and may
    still cache it, in the order to ask them: never ``me`` and never an owner the
    current ring names (those are asked as owners, not as previous ones); at most
    ``limit``. A key that did not move has none."""
    now = set(current.owners(key, k))
    out: list[str] = []
    for ring in history:
        for m in ring.owners(key, k):
            if m != me and m not in now and m not in out:
                out.append(m)
                if len(out) >= limit:
                    return out
    return out

"""Per-dataset read counters of one worker, reported to the master in heartbeats.

Sources: ``local`` bytes served from cache to a client on this host (Unix socket or
short circuit), ``remote`` bytes served from cache over TCP, ``ufs`` bytes fetched from
under storage to serve a read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class DatasetCounters:
    hits: int = 0
    misses: int = 0
    bytes_by_source: dict[str, int] = field(
        default_factory=lambda: {"local": 0, "remote": 0, "ufs": 0}
    )


class Stats:
    def __init__(self) -> None:
        self.datasets: dict[str, DatasetCounters] = {}
        #: DROPs of a page whose bytes the worker found good (ignored: anyone can send one)
        self.refused_drops = 0

    def _ds(self, name: str) -> DatasetCounters:
        c = self.datasets.get(name)
        if c is None:
            c = self.datasets[name] = DatasetCounters()
        return c

    def served(self, dataset: str, cached_bytes: int, ufs_bytes: int, local: bool) -> None:
        c = self._ds(dataset)
        if ufs_bytes:
            c.misses += 1
            c.bytes_by_source["ufs"] += ufs_bytes
        else:
            c.hits += 1
        if cached_bytes:
            c.bytes_by_source["local" if local else "remote"] += cached_bytes

    def touched(self, dataset: str, files: int, nbytes: int) -> None:
        """Hits a local client served itself from a handed-over descriptor."""
        c = self._ds(dataset)
        c.hits += files
        c.bytes_by_source["local"] += nbytes

    def forget(self, dataset: str) -> None:
        self.datasets.pop(dataset, None)

    def to_dict(self) -> dict[str, Any]:
        return {
            name: {"hits": c.hits, "misses": c.misses, "bytes_by_source": dict(c.bytes_by_source)}
            for name, c in self.datasets.items()
        }

"""Page store: memory/SSD/HDD tiers behind one interface, and their composite.

``base`` is the contract: :class:`PageStore` (the page operations) plus the
:class:`Listings`, :class:`Handover` and :class:`Maintenance` protocols, all four in
:class:`CacheStore`, and :class:`Tier` (a cache store with a demotion hook);
:class:`DiskTier` implements a tier over one directory (SSD, HDD, or /dev/shm for MEM);
:class:`TieredStore` stacks tiers and owns demotion between them.
"""

from shoal.store.base import (
    CacheStore,
    DatasetUsage,
    Handover,
    Listings,
    Location,
    Maintenance,
    PageStore,
    PutMeta,
    Tier,
    Usage,
)
from shoal.store.disk import DiskTier
from shoal.store.tiered import TieredStore

__all__ = [
    "CacheStore",
    "DatasetUsage",
    "DiskTier",
    "Handover",
    "Listings",
    "Location",
    "Maintenance",
    "PageStore",
    "PutMeta",
    "Tier",
    "TieredStore",
    "Usage",
]

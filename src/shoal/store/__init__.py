"""Page store: memory/SSD/HDD tiers behind one interface, and their composite.

``base`` is the contract (:class:`PageStore`); :class:`DiskTier` implements it over one
directory (SSD, HDD, or /dev/shm for MEM); :class:`TieredStore` stacks tiers.
"""

from shoal.store.base import DatasetUsage, Location, PageStore, PutMeta, Usage
from shoal.store.disk import DiskTier
from shoal.store.tiered import TieredStore

__all__ = ["DatasetUsage", "DiskTier", "Location", "PageStore", "PutMeta", "TieredStore", "Usage"]

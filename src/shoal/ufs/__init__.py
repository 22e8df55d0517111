"""Under storage: a narrow async interface over fsspec implementations.

``open_store(mount)`` returns an :class:`UnderStore` for a mount's URI; drivers register
by scheme in :mod:`shoal.ufs.registry`. Backend errors are translated here, once
(:mod:`shoal.ufs.errors`).
"""

from shoal.ufs.base import UnderStore
from shoal.ufs.errors import RetryPolicy
from shoal.ufs.registry import open_store, register

__all__ = ["RetryPolicy", "UnderStore", "open_store", "register"]

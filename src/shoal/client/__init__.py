"""The shoal client library: AsyncClient (the implementation) and Client (sync façade).

Routes reads over the ring with no master round trip, caches metadata within each
dataset's staleness bound, reads local workers' cached pages through handed-over
descriptors, fails over to the next owner and, last, falls back to under storage.
"""

from shoal.client.aio import AsyncClient
from shoal.client.sync import Client

__all__ = ["AsyncClient", "Client"]

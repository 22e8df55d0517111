"""The shoal client library: AsyncClient (the implementation) and Client (sync façade).

Routes reads over the ring with no master round trip, caches metadata within each
dataset's staleness bound, reads local workers' cached pages through handed-over
descriptors, fails over to the next owner and, last, falls back to under storage.

The fast path, for front-ends (FUSE, fsspec, gateways, anything new): call
``read_fast(path, offset, length)`` first, on any thread -- ``Client.read_fast`` or
``AsyncClient.read_fast``, or :func:`shoal.client.local.read_path` for a front-end that
holds only a :class:`~shoal.client.cache.ClientCache`. It returns the bytes when the
file's metadata and its pages' locations on a local worker are already known (a
``pread`` and a checksum, no round trip, hits counted and reported later), else None:
then ``read`` (or ``await read``) it, which fetches the locations so that the next
``read_fast`` hits. To serve a whole cached file without copying it (``sendfile``, FUSE
passthrough, ``mmap``), ``open_local(path)`` hands over a descriptor of the local
worker's data file, and ``note_local_read(path, nbytes)`` counts what was served from it.

Modules: ``aio`` (AsyncClient: the facade that builds and owns the parts below, the
reads that tie them together and the counted fallback to under storage), ``control``
(ControlPlane: the master's API), ``routing`` (Router: definitions, ring, owners,
suspects, pools, failover; over the control plane), ``hits`` (HitBook: hit reports;
over the router), ``shortcircuit`` (ShortCircuit: LOCATE, LOCATE_DIR, ``read_fast``;
over the router and hit book), ``meta`` (``stat``, ``ls``), ``local`` (the located
reads themselves), ``batch`` (``cat_many``), ``conn`` (connections and pools),
``cache`` (state that outlives a loop), ``sync``, ``direct`` (the sync client's
reads of local pages before it has a loop) and ``handover`` (installing what local
workers hand over, for both). Each part gets what it uses in its
constructor; none fills in hooks of another.
"""

from typing import TYPE_CHECKING, Any

from shoal.client.sync import Client

if TYPE_CHECKING:
    from shoal.client.aio import AsyncClient

__all__ = ["AsyncClient", "Client"]


def __getattr__(name: str) -> Any:
    """AsyncClient on first use: importing it imports asyncio and the async parts,
    which a sync reader of locally cached files never needs (shoal.client.direct)."""
    if name == "AsyncClient":
        from shoal.client.aio import AsyncClient

        return AsyncClient
    raise AttributeError(f"module 'shoal.client' has no attribute {name!r}")

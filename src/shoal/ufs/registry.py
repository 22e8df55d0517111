"""Which driver serves which URI scheme: ``open_store(mount)`` and ``register``.

Built in: ``file://`` (and bare absolute paths), ``s3://`` (and ``s3a://``),
``webhdfs://``; any other protocol fsspec knows goes through the generic driver.
Drivers are imported when first used, so a missing optional dependency is an
InvalidArgument for that scheme only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shoal.core.types import Mount
from shoal.errors import InvalidArgument
from shoal.ufs.base import UnderStore
from shoal.ufs.paths import redact_uri

log = logging.getLogger("shoal.ufs.registry")

#: a driver: mount -> store; raises InvalidArgument for a bad URI or options
Factory = Callable[[Mount], UnderStore]

_FACTORIES: dict[str, Factory] = {}


def register(scheme: str, factory: Factory) -> None:
    """Serve ``scheme://`` URIs with ``factory`` (replacing any earlier driver)."""
    _FACTORIES[scheme.lower()] = factory


def _file(mount: Mount) -> UnderStore:
    from shoal.ufs.local import open_local

    return open_local(mount.uri, mount.options)


def _s3(mount: Mount) -> UnderStore:
    try:
        from shoal.ufs.s3 import open_s3
    except ImportError:
        raise InvalidArgument("s3:// needs the s3 extra: pip install 'shoal[s3]'") from None
    return open_s3(mount.uri, mount.options)


def _webhdfs(mount: Mount) -> UnderStore:
    try:
        from shoal.ufs.webhdfs import open_webhdfs
    except ImportError:
        raise InvalidArgument("webhdfs:// needs the requests package") from None
    return open_webhdfs(mount.uri, mount.options)


def _generic(mount: Mount) -> UnderStore:
    from shoal.ufs.fsspec_driver import open_generic

    return open_generic(mount.uri, mount.options)


register("file", _file)
register("s3", _s3)
register("s3a", _s3)
register("webhdfs", _webhdfs)


def scheme_of(uri: str) -> str:
    if uri.startswith("/"):
        return "file"
    scheme, sep, _ = uri.partition("://")
    if not sep or not scheme:
        raise InvalidArgument(f"malformed URI {redact_uri(uri)!r}: expected scheme://location")
    return scheme.lower()


def open_store(mount: Mount) -> UnderStore:
    """The UnderStore for a mount. Nothing is contacted yet: connections open on first use."""
    scheme = scheme_of(mount.uri)
    factory = _FACTORIES.get(scheme, _generic)
    store = factory(mount)
    log.debug("mount %s -> %s", mount.name, store.describe())
    return store

"""webdataset over shoal: ``import shoal.webdataset`` lets ``wds.WebDataset`` open
``shoal://`` and chained ``shoal::s3://`` shard URLs.

webdataset opens a shard through its ``gopen_schemes`` table, keyed by URL scheme, and
had no entry for shoal; importing this module adds one that opens the URL through
fsspec (so both URL forms and every storage option work), with sequential readahead.
webdataset also splits a URL *string* on ``::`` (its separator for several shard
lists), which breaks a chained URL: :func:`shards` expands the braces itself and hands
webdataset a list, which it does not split::

    import webdataset as wds
    import shoal.webdataset as swds

    ds = wds.WebDataset(swds.shards("shoal::s3://bucket/shards/train-{0000..0099}.tar"))
"""

from __future__ import annotations

import importlib
from typing import IO, Any

import fsspec

#: a shard is read front to back: fetch this much ahead
SHARD_BLOCK = 8 << 20
#: storage options for every shard opened here (e.g. {"master": ...}); set before use
storage_options: dict[str, Any] = {}


def gopen_shoal(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[bytes]:
    """webdataset's opener for ``shoal:`` URLs (plain and chained)."""
    if mode != "rb":
        raise PermissionError(f"shoal is a read-only cache: cannot open {url} for writing")
    opts: dict[str, Any] = {"block_size": SHARD_BLOCK, "cache_type": "readahead"}
    opts.update(storage_options)
    opts.update(kw)
    f: IO[bytes] = fsspec.open(url, "rb", **opts).open()
    return f


def shards(url: str) -> list[str]:
    """Shard URLs from a brace pattern, as a list webdataset will not split on ``::``."""
    import braceexpand  # a dependency of webdataset

    return list(braceexpand.braceexpand(url))


def register() -> None:
    """Add the ``shoal`` scheme to webdataset's opener table (idempotent)."""
    # the module, not the function of the same name that webdataset re-exports
    gopen = importlib.import_module("webdataset.gopen")
    gopen.gopen_schemes["shoal"] = gopen_shoal


register()

"""Storage options of ``shoal://``: shoal's own, fsspec's standard ones, and the keys
frameworks pass to every filesystem.

Hugging Face datasets, webdataset builders and ``fsspec.open(url, block_size=...)``
hand a filesystem options meant for others (``hf``, ``client_kwargs``, ...) or for
fsspec itself; fsspec's built-in filesystems take and ignore what they don't use, so
shoal does too. What it must not do is swallow a typo of its own option silently: a
key within a few letters of one of shoal's or fsspec's names is refused, naming it.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Mapping
from typing import Any

from shoal.config import ClientSettings
from shoal.errors import InvalidArgument

log = logging.getLogger("shoal.fsspec")

#: fsspec's standard storage options, honoured (the listing ones by AbstractFileSystem;
#: skip_instance_cache by fsspec's instance cache, before the constructor sees it)
STANDARD = frozenset(
    {"block_size", "cache_type", "cache_options", "use_listings_cache"}
    | {"listings_expiry_time", "max_paths", "skip_instance_cache"}
)
#: what to do with a chained URL no dataset mounts
UNMOUNTED = ("read", "raise")
#: ClientSettings fields that may be given as options (master has its own argument)
CLIENT_FIELDS = frozenset(f.name for f in dataclasses.fields(ClientSettings)) - {"master"}
OURS = CLIENT_FIELDS | {"master", "client_options", "unmounted"}


def check_known(opts: Mapping[str, Any], known: frozenset[str], what: str) -> None:
    unknown = sorted(set(opts) - known)
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(known), 1)
        hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(sorted(known))}"
        raise InvalidArgument(f"unknown {what} {unknown[0]!r}; {hint}")


def client_options(
    client_opts: Mapping[str, Any] | None, storage_options: dict[str, Any]
) -> dict[str, Any]:
    """ClientSettings fields from ``client_options`` and from the top level (a chained
    URL's ``shoal={...}``), taken out of ``storage_options``; near misses refused."""
    opts = dict(client_opts or {})
    check_known(opts, CLIENT_FIELDS, "client option")
    for k in [k for k in storage_options if k in CLIENT_FIELDS]:
        opts[k] = storage_options.pop(k)
    foreign = sorted(set(storage_options) - STANDARD)
    names = sorted(OURS | STANDARD)
    for k in foreign:
        near = difflib.get_close_matches(k, names, 1, 0.85)
        if near:
            raise InvalidArgument(f"unknown shoal option {k!r}: did you mean {near[0]!r}?")
    if foreign:
        log.debug("ignoring storage options for other filesystems: %s", ", ".join(foreign))
    return opts


def check_block_size(block_size: Any) -> None:
    if block_size is not None and (
        isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 0
    ):
        raise InvalidArgument(f"block_size must be a non-negative integer, not {block_size!r}")


def check_unmounted(unmounted: str) -> None:
    if unmounted not in UNMOUNTED:
        raise InvalidArgument(f"unmounted must be one of {', '.join(UNMOUNTED)}, not {unmounted!r}")

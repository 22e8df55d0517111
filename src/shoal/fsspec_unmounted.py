"""Chained URLs that no dataset mounts (``shoal::s3://other-bucket/key``): read through
the underlying fsspec filesystem, uncached, logged once per bucket and counted.

Why not an implicit dataset made on first use: the workers fetch from under storage
with their own credentials, and the master never stores a user's. A bucket no dataset
mounts is one the workers may not be able to read at all, so the only reader that
surely can is the caller's own process, with its own ``target_options``
(``s3={...}`` beside ``shoal={...}``) and environment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from typing import Any

import fsspec

log = logging.getLogger("shoal.fsspec")


@dataclasses.dataclass
class UnmountedStats:
    """Reads of chained URLs no dataset mounts, served by the underlying filesystem."""

    reads: int = 0
    bytes: int = 0
    #: buckets (first path components) seen, each logged once
    prefixes: set[str] = dataclasses.field(default_factory=set)


class Underlying:
    """The underlying filesystem of one ShoalFileSystem, made on first use in each
    process, with the caller's target options."""

    def __init__(self, protocol: str, options: dict[str, Any]) -> None:
        self.protocol = protocol
        self.options = options
        self.stats = UnmountedStats()
        self._fs: tuple[int, Any] | None = None  # (pid, filesystem)

    def note(self, p: str) -> None:
        top = p.split("/", 1)[0]
        if top not in self.stats.prefixes:
            self.stats.prefixes.add(top)
            log.warning(
                "no shoal dataset mounts %s://%s: reading it directly, uncached (create a "
                "dataset over it to cache it)",
                self.protocol,
                top,
            )

    def path(self, p: str) -> str:
        """A path of shoal's naming (no protocol, no leading slash) in the target's."""
        return "/" + p if self.protocol in ("file", "local") else p

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A method of the filesystem, in a thread. It is made synchronous, on fsspec's
        own loop, so that it closes its own sessions at exit (an async s3fs bound to
        our loop would need closing by hand); the thread hop is noise on this path."""
        made = self._fs
        if made is None or made[0] != os.getpid():
            cls = fsspec.get_filesystem_class(self.protocol)
            opts = {**self.options, "skip_instance_cache": True}
            self._fs = made = (os.getpid(), cls(**opts))
        return await asyncio.to_thread(getattr(made[1], method), *args, **kwargs)

    async def read(self, p: str, start: int | None, end: int | None) -> bytes:
        data: bytes = await self.call("cat_file", self.path(p), start=start, end=end)
        self.stats.reads += 1
        self.stats.bytes += len(data)
        return data

    async def info(self, p: str) -> dict[str, Any]:
        return entry(await self.call("info", self.path(p)))

    async def ls(self, p: str) -> list[dict[str, Any]]:
        return [entry(e) for e in await self.call("ls", self.path(p), detail=True)]


def entry(e: dict[str, Any]) -> dict[str, Any]:
    """An entry of the underlying filesystem in shoal's naming."""
    name = str(e["name"]).split("://", 1)[-1].strip("/")
    return {**e, "name": name, "type": "directory" if e.get("type") == "directory" else "file"}

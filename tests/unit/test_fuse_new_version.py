"""A new version seen by revalidation is invalidated in the kernel before the reply
that carries its attributes goes out (kernel-open: no OPEN would do it), so a read
right after a LOOKUP never races the invalidation for the old pages."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from shoal.client.cache import ClientCache
from shoal.core.types import FileInfo
from shoal.fuse.ops import FileSystem


def test_a_new_version_holds_attribute_replies_until_invalidated() -> None:
    async def run() -> None:
        sent: list[bytes] = []
        gate = asyncio.Event()

        async def notify(msgs: list[bytes]) -> None:
            await gate.wait()  # the kernel takes its time
            sent.extend(msgs)

        fs = FileSystem(SimpleNamespace(cache=ClientCache()), kernel_open=True)  # type: ignore[arg-type]
        fs.notify = notify
        ds = fs._child(fs.nodes[1], "ds", None)
        mount = fs._child(ds, "m", None)
        fs._child(mount, "f", FileInfo("m/f", 4096, "v1", 1.0))
        assert not fs.invalidating  # a first version: nothing to invalidate
        fs._child(mount, "f", FileInfo("m/f", 4096, "v2", 1.0))  # same size and mtime
        assert fs.invalidating and not sent  # replies with attributes wait for it
        gate.set()
        await asyncio.wait(set(fs.invalidating))
        assert len(sent) == 1 and not fs.invalidating

    asyncio.run(run())

"""Keeping the kernel's caches true to the master: one background loop per mount.

Under ``staleness=never`` the kernel trusts entries, attributes and (keep_cache) the
page cache of a file for good, so after ``shoal sync`` nothing would ever ask the
daemon again. The loop long-polls the master's watch API; when the datasets
generation moves it refreshes the datasets (which drops the client's metadata of a
changed one), compares every inode the kernel holds in a changed dataset with the
current metadata, and for each file whose version changed or that vanished writes
FUSE_NOTIFY_INVAL_INODE (pages and attributes) and, for vanished names and the
negative entries handed out, FUSE_NOTIFY_INVAL_ENTRY; passthrough registrations of
an old version are dropped. Only then does it poll again with the new generation:
that poll is the acknowledgement a sync job waits for before it reports done, so a
read that starts after ``sync --wait`` returned never sees the old bytes.

Without the watch API (an older master) it polls the datasets every second instead:
the same invalidation, but not ordered before the sync's return.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid

from shoal.core.types import Dataset, FileInfo
from shoal.errors import NotFound, ShoalError, UserError
from shoal.fuse import protocol as p
from shoal.fuse.nodes import Node, kind
from shoal.fuse.ops import STAT_PARALLELISM, FileSystem

log = logging.getLogger("shoal.fuse.watch")

#: seconds one watch poll may wait; well below the master's 10 s watcher window, so
#: the mount always counts as a live watcher that a sync waits for
WATCH_TIMEOUT = 5.0
#: seconds between checks without the watch API, and after a failed round
POLL_INTERVAL = 1.0


async def revalidate(fs: FileSystem, ds: Dataset | None, name: str) -> int:
    """Compare the nodes of dataset ``name`` (``ds`` None: deleted) with its current
    metadata and invalidate what changed in the kernel; returns the nodes invalidated.
    Raises on failures other than "gone", so that the round is retried (and the sync
    not acknowledged)."""
    fs.ahead.forget_dataset(name)  # its directories are listed again when looked in
    nodes = [n for n in fs.nodes.values() if n.ds == name and n.key]
    sem = asyncio.Semaphore(STAT_PARALLELISM)

    async def current(n: Node) -> FileInfo | None:
        if ds is None:
            return None
        if "/" not in n.key:  # a mount: there as long as the dataset names it
            return FileInfo(n.key, 0, "", 0.0, True) if _has_mount(ds, n.key) else None
        async with sem:
            try:
                return fs.with_link(name, n.key, await fs.client.stat(n.path))
            except (NotFound, UserError):
                return None

    infos = await asyncio.gather(*(current(n) for n in nodes))
    msgs: list[bytes] = []
    changed = 0
    for n, info in zip(nodes, infos, strict=True):
        if fs.nodes.get(n.ino) is not n:
            continue  # forgotten by the kernel meanwhile
        parent_path, _, base = n.path.rpartition("/")
        parent = fs.by_path.get(parent_path or "/")
        if info is None or kind(info) != kind(n):
            # vanished, or changed type (file, directory, link): a new lookup, a new inode
            if parent is not None:
                msgs.append(
                    p.encode_inval_entry(parent.ino, base.encode("utf-8", "surrogateescape"))
                )
            msgs.append(p.encode_inval_inode(n.ino))
            _vanish(fs, n)
            changed += 1
        elif not n.is_dir and (
            info.version != n.version or info.size != n.size or info.link != n.link
        ):
            fs._apply(n, info)
            n.attr = fs._attr(n)
            msgs.append(p.encode_inval_inode(n.ino))
            changed += 1
    for key in [k for k, d in fs.negative.items() if d == name]:
        del fs.negative[key]
        msgs.append(p.encode_inval_entry(key[0], key[1].encode("utf-8", "surrogateescape")))
    if ds is None:
        top = fs.by_path.get("/" + name)
        if top is not None:
            msgs.append(p.encode_inval_entry(p.ROOT_ID, name.encode()))
            _vanish(fs, top)
    if msgs and fs.notify is not None:
        await fs.notify(msgs)
    if changed:
        log.info("dataset %s changed: invalidated %d of %d inodes", name, changed, len(nodes))
    return changed


def _has_mount(ds: Dataset, name: str) -> bool:
    return any(m.name == name for m in ds.mounts)


def _vanish(fs: FileSystem, n: Node) -> None:
    """Unlink a node from its name (the kernel may still hold its id until FORGET)."""
    if fs.by_path.get(n.path) is n:
        del fs.by_path[n.path]
    n.version, n.size, n.chunk = "", 0, b""
    if n.passthrough_opens == 0:
        fs._drop_backing(n)


class Watcher:
    """The mount's watch loop; :meth:`run` until cancelled."""

    def __init__(self, fs: FileSystem) -> None:
        self.fs = fs
        self.id = f"mount-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        #: dataset -> the generation its nodes were last compared at
        self.gens: dict[str, int] = {}
        self.rounds = 0

    async def check(self) -> None:
        """One round: refresh the datasets, revalidate those whose generation moved."""
        fs = self.fs
        current = {d.name: d for d in await fs.client.datasets()}
        known = {n.ds for n in fs.nodes.values() if n.ds} | set(self.gens)
        known |= set(fs.negative.values())
        for name in sorted(known):
            ds = current.get(name)
            if ds is not None and self.gens.get(name) == ds.generation:
                continue
            await revalidate(fs, ds, name)
            if ds is None:
                self.gens.pop(name, None)
            else:
                self.gens[name] = ds.generation
        for name, ds in current.items():
            self.gens.setdefault(name, ds.generation)
        self.rounds += 1

    async def run(self) -> None:
        client = self.fs.client
        watch = getattr(client, "watch", None)
        if watch is None:
            log.info("the client has no watch API: polling datasets every %.0f s", POLL_INTERVAL)
        since = -1
        failing = False
        while True:
            try:
                if watch is not None:
                    timeout = 0.0 if since < 0 else WATCH_TIMEOUT
                    gen = int(await watch(since, timeout, self.id))
                else:
                    if since >= 0:
                        await asyncio.sleep(POLL_INTERVAL)
                    gen = since + 1  # nothing to compare: check every round
                if gen != since:
                    await self.check()
                since = gen  # the next poll acknowledges this generation
                failing = False
            except asyncio.CancelledError:
                raise
            except (ShoalError, OSError) as exc:
                # the master is away or a stat failed: retry the round, not acknowledged
                (log.debug if failing else log.warning)("watching datasets: %s", exc)
                failing = True
                await asyncio.sleep(POLL_INTERVAL)

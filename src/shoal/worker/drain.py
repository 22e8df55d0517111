"""The worker's side of scale-out and scale-in: following the ring, and a drain.

:class:`Elastic` runs after every heartbeat. When the reply shows a new ring epoch it
fetches the ring (with the earlier rings and the draining workers) into the peer view
that misses consult (:mod:`shoal.worker.peers`). When the reply says ``draining``
(``shoal worker drain ID``, or this worker's own SIGTERM with a drain timeout), it
hands every cached file to its new owner, then reports ``drained`` in its heartbeat;
the master answers ``left`` and the worker stops.

A hand-over is a READ of the file, window by window, sent to the new owner, who misses
and pulls the pages from this worker (still serving, and the previous owner in the
ring history), checked against their checksums; the bytes that come back are dropped.
Readers never fail meanwhile: one holding the old ring still reaches this worker, one
holding the new ring reaches the new owner, who gets the file from here; and when this
worker is gone, a reader of the old ring fails over to the key's next owner, which is
the new owner (consistent hashing: removing a worker makes each of its keys' second
owner the first).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from shoal.core.ring import Ring
from shoal.errors import ShoalError
from shoal.proto.master_api import MasterAPI
from shoal.proto.messages import ReadRequest
from shoal.worker.loader import Loader
from shoal.worker.peers import Peers

log = logging.getLogger("shoal.worker.drain")

#: files handed over at once, and the bytes one READ of a hand-over asks for
PARALLEL = 8
WINDOW = 8 << 20
#: seconds between rate-limited ring refreshes asked for by a miss, and the longest a
#: miss waits for one (a master that does not answer must not hold reads up)
REFRESH_EVERY = 0.1
REFRESH_WAIT = 3.0


class Elastic:
    def __init__(self, worker_id: str, master: MasterAPI, loader: Loader, peers: Peers) -> None:
        self.id = worker_id
        self.master = master
        self.loader = loader
        self.peers = peers
        self._drain: asyncio.Task[None] | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._refreshed_at = -REFRESH_EVERY
        #: set when the hand-over is complete (reported as "drained")
        self.drained = False
        #: set once the master took the "drained": the worker should stop
        self.left = asyncio.Event()
        self.files_out = 0
        self.bytes_out = 0
        self.failed_out = 0
        peers.refresh = self.refresh

    # -- the ring -----------------------------------------------------------------------

    async def _fetch_ring(self) -> None:
        try:
            self.peers.view.update(dict(await self.master.ring()))
        except (ShoalError, OSError) as exc:
            log.debug("cannot fetch the ring: %s", exc)

    async def refresh(self) -> None:
        """Fetch the ring again (a miss found the view stale): one fetch for every
        caller meanwhile, at most every REFRESH_EVERY, waited for at most REFRESH_WAIT.
        (The limit was 1 s: a view fetched just before a drain began then stayed stale,
        and the new owner fetched the drained worker's files from the store; the wait
        was 1 s, which a loaded master can exceed.)"""
        t = self._refresh
        if t is None or t.done():
            if time.monotonic() - self._refreshed_at < REFRESH_EVERY:
                return
            self._refreshed_at = time.monotonic()
            t = self._refresh = asyncio.get_running_loop().create_task(self._fetch_ring())
        await asyncio.wait({t}, timeout=REFRESH_WAIT)

    async def after_heartbeat(self, reply: Mapping[str, Any]) -> None:
        """Follow a new epoch (in the background: the heartbeat loop must not wait for
        the ring, or a slow master would make workers miss their expiry), start a
        drain the master asked for, stop once the master says the worker left."""
        epoch = int(reply.get("epoch", -1))
        t = self._refresh
        if epoch != self.peers.view.epoch and (t is None or t.done()):
            self._refreshed_at = time.monotonic()
            self._refresh = asyncio.get_running_loop().create_task(self._fetch_ring())
        if reply.get("left"):
            log.info("worker %s left the cluster", self.id)
            self.left.set()
        elif reply.get("draining") and self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._hand_over())

    async def drain_self(self, key: str, timeout: float, stop: asyncio.Event) -> bool:
        """SIGTERM with a drain timeout: ask the master to drain this worker (proving
        it with its identity ``key``), hand the files over and wait until the master
        has it leave; False when that took longer than ``timeout`` seconds, the
        master refused or was away, or ``stop`` came first (the worker stops anyway)."""
        try:
            await self.master.drain_worker(self.id, key)
        except ShoalError as exc:
            log.warning("cannot drain before stopping (%s): stopping now", exc)
            return False
        log.info("draining before stopping (at most %.0fs)", timeout)
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._hand_over())
        waits = [asyncio.ensure_future(e.wait()) for e in (self.left, stop)]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if not self.left.is_set():
            log.warning("drain not finished within %.0fs: stopping anyway", timeout)
        return self.left.is_set()

    async def close(self) -> None:
        """Stop a hand-over or ring fetch in progress and close the peer connections."""
        tasks = [t for t in (self._drain, self._refresh) if t is not None and not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.peers.close()

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "moved": {
                "files_in": self.loader.moved_files,
                "bytes_in": self.loader.moved_bytes,
                "files_out": self.files_out,
                "bytes_out": self.bytes_out,
            }
        }
        if self.drained:
            out["drained"] = True
        return out

    # -- a drain ------------------------------------------------------------------------

    async def _hand_over(self) -> None:
        await self._fetch_ring()
        view = self.peers.view
        t0 = time.monotonic()
        ring = view.ring
        if ring is not None and self.id in ring.members:
            log.warning("drain: the master's ring still lists this worker; not handing over")
            return
        sem = asyncio.Semaphore(PARALLEL)
        work = []
        table, store = self.loader.table, self.loader.store
        if ring is not None and ring.members:
            before = Ring.build(ring.epoch, [*ring.members, self.id], ring.vnodes)
            for name in table.names():
                ds = table.get(name)
                if ds.policy.placement == "local":
                    continue  # cached for this node's readers, not for an owner
                k = max(1, ds.policy.replicas)
                for fk in list(store.files(name)):
                    size = store.versions(name, fk.path).get(fk.version)
                    if size is None:
                        continue
                    key = f"{name}/{fk.path}"  # the ring's key (clients, jobs)
                    old = before.owners(key, k)
                    for to in ring.owners(key, k):
                        if to not in old and to in view.addrs:
                            work.append(self._give(sem, view.addrs[to], name, fk.path, fk.version, size, ds.policy.page_size))  # fmt: skip
        await asyncio.gather(*work)
        log.info(
            "drain: handed %d files (%d bytes) to their new owners in %.1fs (%d failed)",
            self.files_out,
            self.bytes_out,
            time.monotonic() - t0,
            self.failed_out,
        )
        self.drained = True

    async def _give(
        self,
        sem: asyncio.Semaphore,
        addr: tuple[str, int],
        dataset: str,
        path: str,
        version: str,
        size: int,
        page_size: int,
    ) -> None:
        async with sem:
            try:
                for off in range(0, max(size, 1), WINDOW):
                    length = -1 if off + WINDOW >= size else WINDOW
                    req = ReadRequest(dataset, path, off, length, version, page_size)
                    await self.peers.call(addr, req)
            except (ShoalError, OSError, TimeoutError, EOFError) as exc:
                self.failed_out += 1
                log.warning("drain: /%s/%s not handed over: %s", dataset, path, exc)
                return
            self.files_out += 1
            self.bytes_out += size

"""Pages from other workers: what a new owner asks the previous owners for before it
goes to under storage (elastic scale-out and scale-in, issue 13).

The worker keeps the master's ring answer (``GET /api/v1/ring``: the ring, the earlier
rings with who held which datasets when each ended, and the draining workers, see
:mod:`shoal.master.ringhistory`) in a :class:`PeerView`, refreshed whenever a heartbeat
shows a new epoch. On a miss, :class:`Peers` asks the key's previous owners
(:func:`shoal.core.ring.previous_owners`, only those that held the dataset) with a
worker-to-worker READ over the data path (HELLO with this worker's own token), checks
every page against the checksum the peer sent, and gives up on a peer quietly: an
unreachable, slow or wrong peer costs a short timeout and the page comes from under
storage as before. A peer that failed is skipped for :data:`SUSPECT_FOR` seconds.

The worker layer cannot use shoal.client (siblings), so the connection here is a
small one built on shoal.proto: one request in flight per connection, a few idle
connections kept per peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import xxhash

from shoal.core.paging import page_len
from shoal.core.ring import Ring, previous_owners
from shoal.core.types import Dataset, FileInfo
from shoal.errors import ShoalError
from shoal.proto import wire
from shoal.proto.messages import (
    HelloRequest,
    ReadReply,
    ReadRequest,
    Request,
    decode_reply,
    encode_request,
)

R = TypeVar("R")
log = logging.getLogger("shoal.worker.peers")

#: seconds to connect to a peer and for one request to it
CONNECT_TIMEOUT = 2.0
REQUEST_TIMEOUT = 10.0
#: seconds a peer that failed is not asked again
SUSPECT_FOR = 5.0
#: idle connections kept per peer
POOL_SIZE = 8
#: previous owners asked for one page, at most
ASK_AT_MOST = 2
#: what a peer answers (Unavailable) when it does not hold what a cached-only READ asks
NOT_CACHED = "not cached here"

Addr = tuple[str, int]


@dataclass
class PeerView:
    """The ring, the earlier rings and the peers' addresses, as the master last said."""

    me: str
    epoch: int = -1
    ring: Ring | None = None
    #: earlier rings, newest first, each with member -> datasets it held
    past: list[tuple[Ring, dict[str, frozenset[str]]]] = field(default_factory=list)
    addrs: dict[str, Addr] = field(default_factory=dict)
    #: address -> whether it speaks TLS, as the worker registered (absent: not said)
    tls: dict[Addr, bool] = field(default_factory=dict)

    def update(self, body: Mapping[str, Any]) -> None:
        """Take a ring answer; a malformed part is ignored (peer transfers are an
        optimisation: without them, pages come from under storage)."""
        try:
            vnodes = int(body.get("vnodes", 128))
            workers = list(body.get("workers") or []) + list(body.get("peers") or [])
            addrs = {str(w["id"]): (str(w["host"]), int(w["port"])) for w in workers}
            tls = {addrs[str(w["id"])]: t for w in workers if isinstance(t := w.get("tls"), bool)}
            ring = Ring.build(int(body["epoch"]), [str(w["id"]) for w in body["workers"]], vnodes)
            past = []
            for h in body.get("history") or []:
                holders = {str(m): frozenset(map(str, ds)) for m, ds in h["holders"].items()}
                past.append((Ring.build(int(h["epoch"]), map(str, h["workers"]), vnodes), holders))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("ignoring a malformed ring answer: %r", exc)
            return
        self.ring, self.past, self.addrs, self.epoch = ring, past, addrs, ring.epoch
        self.tls = tls

    def candidates(self, ds: Dataset, path: str) -> list[tuple[str, Addr]]:
        """The previous owners of ``/ds/path`` worth asking, in order: they owned it in
        an earlier ring, held cached files of the dataset then, and are reachable."""
        if self.ring is None or not self.past or ds.policy.placement == "local":
            return []
        held = [r for r, holders in self.past if any(ds.name in v for v in holders.values())]
        if not held:
            return []
        holders: dict[str, frozenset[str]] = {}
        for _, h in self.past:
            for m, v in h.items():
                holders[m] = holders.get(m, frozenset()) | v
        k = max(1, ds.policy.replicas)
        names = previous_owners(f"{ds.name}/{path}", k, self.ring, held, self.me, limit=4)
        out = [
            (m, self.addrs[m]) for m in names if ds.name in holders.get(m, ()) and m in self.addrs
        ]
        return out[:ASK_AT_MOST]


class _Link:
    """One connection to a peer that said HELLO."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.req_id = 0

    async def call(self, req: Request[R]) -> tuple[R, bytes]:
        self.req_id = (self.req_id + 1) & 0xFFFFFFFF
        self.writer.write(encode_request(req, self.req_id))
        await self.writer.drain()
        head = await self.reader.readexactly(wire.RESP_HDR.size)
        status, req_id, _epoch, meta_len, data_len = wire.RESP_HDR.unpack(head)
        if req_id != self.req_id:
            raise ConnectionError(f"answer {req_id} to request {self.req_id}")
        meta = await self.reader.readexactly(meta_len)
        data = await self.reader.readexactly(data_len) if data_len else b""
        return decode_reply(req, status, meta), data

    def close(self) -> None:
        self.writer.close()


class Peers:
    """Worker-to-worker reads of pages (see the module docstring)."""

    def __init__(self, me: str, token: str | None = None) -> None:
        self.view = PeerView(me)
        self._token = token or ""
        self._idle: dict[Addr, list[_Link]] = {}
        self._suspect: dict[str, float] = {}
        #: pages and bytes that came from peers; failed asks
        self.pages_in = 0
        self.bytes_in = 0
        self.failures = 0
        #: asks a peer answered "not cached here"
        self.misses = 0
        #: fetches the ring again (rate limited): set by the worker
        self.refresh: Callable[[], Awaitable[None]] | None = None
        #: the context TLS peers are checked with (the cluster's CA; None: none known)
        self.ssl: ssl.SSLContext | None = None
        #: this worker's own TCP port speaks TLS: peers the ring says nothing of do too
        self.serves_tls = False

    async def _open(self, addr: Addr) -> _Link:
        # TLS exactly to the peers that registered it (an older master does not say)
        ctx = self.ssl if self.view.tls.get(addr, self.serves_tls) else None
        async with asyncio.timeout(CONNECT_TIMEOUT):
            reader, writer = await asyncio.open_connection(
                addr[0], addr[1], ssl=ctx, server_hostname=addr[0] if ctx else None
            )
            link = _Link(reader, writer)
            try:
                hello, _ = await link.call(HelloRequest(token=self._token))
                wire.check_hello(hello.version, f"{addr[0]}:{addr[1]}")
            except BaseException:
                link.close()
                raise
        return link

    async def call(self, addr: Addr, req: Request[R]) -> tuple[R, bytes]:
        """One request to the worker at ``addr`` on a pooled connection; raises the
        peer's error, OSError/TimeoutError when it cannot be reached."""
        idle = self._idle.setdefault(addr, [])
        link = idle.pop() if idle else await self._open(addr)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                out = await link.call(req)
        except ShoalError:
            self._keep(addr, link)  # an error answer: the connection is fine
            raise
        except BaseException:
            link.close()
            raise
        self._keep(addr, link)
        return out

    def _keep(self, addr: Addr, link: _Link) -> None:
        idle = self._idle.setdefault(addr, [])
        if len(idle) < POOL_SIZE and not link.writer.is_closing():
            idle.append(link)
        else:
            link.close()

    def may_hold(self, ds: Dataset, path: str) -> bool:
        """Whether a previous owner may hold pages of ``/ds/path`` (then each page is
        asked of it before under storage)."""
        return bool(self.view.candidates(ds, path))

    async def page(
        self, ds: Dataset, path: str, version: str | None, index: int
    ) -> tuple[FileInfo, bytes] | None:
        """Page ``index`` of ``/ds/path`` (at ``version``; None: whatever the previous
        owner holds) from a previous owner, checked; None when none has it."""
        view = self.view
        if ds.policy.placement == "local":
            return None
        if view.ring is None and self.refresh is not None:
            await self.refresh()  # a worker that just joined: its first look at the ring
        if view.ring is None:
            return None
        key = f"{ds.name}/{path}"  # the ring's key, as clients and jobs place it
        if self.refresh is not None and view.me not in view.ring.owners(key, ds.policy.replicas):
            # asked for a key this worker does not own: its view of the ring may be
            # older than the asker's (a drain or a join moments ago)
            await self.refresh()
        now = time.monotonic()
        ps = ds.policy.page_size
        for peer, addr in view.candidates(ds, path):
            if self._suspect.get(peer, 0.0) > now:
                continue
            # cached only: a previous owner that does not hold it says so, never fetches
            req = ReadRequest(ds.name, path, index * ps, ps, version, ps, cached_only=True)
            try:
                reply, data = await self.call(addr, req)
                got = _checked(reply, data, version, index, ps)
            except ShoalError as exc:
                if exc.code == "unavailable" and NOT_CACHED in str(exc):
                    self.misses += 1  # evicted, or never read there: not a failure
                    continue
                self.failures += 1
                if exc.code == "unavailable":
                    self._suspect[peer] = time.monotonic() + SUSPECT_FOR
                log.warning("peer %s had no %s/%s page %d: %s", peer, ds.name, path, index, exc)
                continue
            except (OSError, TimeoutError, EOFError) as exc:
                self.failures += 1
                self._suspect[peer] = time.monotonic() + SUSPECT_FOR
                log.warning("peer %s had no %s/%s page %d: %s", peer, ds.name, path, index, exc)
                continue
            if got is None:
                self.failures += 1
                log.warning("peer %s sent a bad page %d of /%s/%s", peer, index, ds.name, path)
                continue
            self.pages_in += 1
            self.bytes_in += len(got)
            return FileInfo(path, reply.size, reply.version, reply.mtime), got
        return None

    def close(self) -> None:
        for links in self._idle.values():
            for link in links:
                with contextlib.suppress(Exception):
                    link.close()
        self._idle.clear()


def _checked(
    reply: ReadReply, data: bytes, version: str | None, index: int, ps: int
) -> bytes | None:
    """The page's bytes if the answer is that page of that version and every byte
    matches the checksum sent with it; None otherwise."""
    if version is not None and reply.version != version:
        return None
    if reply.first != index or len(reply.pages) != 1:
        return None
    length, ck = reply.pages[0]
    if length != len(data) or length != page_len(reply.size, ps, index):
        return None
    if xxhash.xxh3_64_intdigest(data) != ck:
        return None
    return data

"""The sync client's reads of a local worker's cache before its event loop exists.

A fresh process (a DataLoader worker, a script, a CLI call) that reads a file cached
on this host used to pay for asyncio and uvloop, a loop thread and the async master
and worker clients before its first byte, about half of its CPU to that byte. Here
the caller's own thread does what that first read needs, blocking: the dataset's
definition and the ring from the master (two GETs over plain HTTP), a ``HELLO`` and a
``LOCATE`` (or ``LOCATE_DIR``) on the local worker's Unix socket, and the ``pread``
of the handed-over pages; the hits that follow are reported (``TOUCH``) on the same
connection. Nothing of asyncio is imported until something needs it.

It is an accelerator, never a second set of rules: answers are installed through
:mod:`shoal.client.handover`, the same functions the async short circuit uses (check
stamps, layout changes, descriptors), every page is read by
:func:`~shoal.client.local.read_located` (checksums, versions, trust), and the HELLO
carries the same token and is checked the same way (protocol version, worker id). It
serves only when the file's first owner on the ring is a worker on this host and
everything goes as expected; anything else -- an https master, a remote owner, an
error answer, a worker slower than the liveness probe's time -- returns None, and the
caller takes the async path, which starts the loop and decides, fails over, reports
and raises as it always does. The sync client uses this only while it has no loop.
"""

from __future__ import annotations

import _thread
import os
import socket
import sys
import threading
import time
import weakref
from typing import Any

from shoal.client.bootstrap import master_get, parse_ring
from shoal.client.cache import ClientCache, WorkerAddr
from shoal.client.handover import (
    LOCATE_AHEAD,
    directories_to_locate,
    layout_moved,
    take_dir,
    take_locations,
    touch_batches,
)
from shoal.client.local import EXTRA_OWNERS, TOUCH_EVERY, read_located
from shoal.config import ClientSettings, token_for
from shoal.core.types import NEVER, Dataset, FileInfo, NsPath, split_path
from shoal.errors import NotFound, ProtocolError, ShoalError, Unavailable
from shoal.proto import control as api
from shoal.proto import wire
from shoal.proto.messages import (
    HelloRequest,
    LocateDirRequest,
    LocateRequest,
    Request,
    StatRequest,
    decode_reply,
    encode_request,
)


def probe_after(timeout: float) -> float:
    """How long a worker may take to answer before it is taken to be hung (see
    shoal.client.conn: a thirtieth of the request deadline, at least a second)."""
    return min(timeout, max(1.0, timeout / 30))


class _Skip(Exception):
    """This path cannot serve the read: the async path's."""


class _Uds:
    """One blocking connection to a local worker's Unix socket that said HELLO."""

    __slots__ = ("__weakref__", "req_id", "sock")

    def __init__(self, path: str, wait: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(wait)
        self.req_id = 0
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise

    def call(self, req: Request[Any], want_fds: bool = False) -> tuple[Any, int, list[int]]:
        """(reply, ring epoch, handed-over descriptors) of ``req``; an error answer is
        raised (its descriptors closed), a broken connection is OSError or EOFError."""
        self.req_id = rid = (self.req_id + 1) & 0xFFFFFFFF
        self.sock.sendall(encode_request(req, rid))
        hdr = bytearray(wire.RESP_HDR.size)
        view = memoryview(hdr)
        fds: list[int] = []
        try:
            if want_fds:
                wire.make_room_for_fds()
                n, anc, _flags, _ = self.sock.recvmsg_into([view], wire.FD_ANC)
                fds.extend(wire.fds_of(anc))
                if n == 0:
                    raise EOFError("worker closed the connection")
                view = view[n:]
            wire.recv_exactly(self.sock, view)
            status, req_id, epoch, meta_len, data_len = wire.RESP_HDR.unpack(hdr)
            if req_id != rid:
                raise ProtocolError(f"response {req_id} for request {rid}")
            meta = bytearray(meta_len)
            wire.recv_exactly(self.sock, memoryview(meta))
            if data_len:  # no located answer carries data: read past it all the same
                wire.recv_exactly(self.sock, memoryview(bytearray(data_len)))
            return decode_reply(req, status, meta), epoch, fds
        except BaseException:
            _close_all(fds)
            raise

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class DirectReads:
    """The blocking first reads of one sync client (see the module docstring)."""

    def __init__(self, settings: ClientSettings, cache: ClientCache) -> None:
        self.settings = settings
        self.cache = cache
        cache.refresh_every = settings.ring_refresh
        self._token: str | None = settings.token
        self._token_known = settings.token is not None
        self._local = threading.local()
        self._all: weakref.WeakSet[_Uds] = weakref.WeakSet()
        #: set once this path failed or closed: the async path serves from then on
        self.off = False
        #: set once the client has its loop, whose ticker reports the hits from then on
        self.handed = False
        self._at_exit = False
        #: the process this was made in (a forked child's copy never sends)
        self._pid = os.getpid()
        #: whether the thread that sends buffered hits every TOUCH_EVERY runs
        self._flushing = False
        self._flush_lock = threading.Lock()

    # -- the read ---------------------------------------------------------------------

    def read(self, path: str, offset: int, length: int) -> bytes | None:
        """Bytes [offset, offset+length) of ``path`` read through a local worker's
        descriptors, or None: ask the async path."""
        if self.off or offset < 0 or not self.settings.short_circuit:
            return None
        try:
            found = self._file(path)
            if found is None:
                return None
            np, ds = found
            w = self._owner(ds, np.key_path)
            data = self._read_local(w, ds, np.key_path, offset, length)
        except Exception:  # _Skip, an error answer, a lost connection, a malformed answer
            self.off = True  # the async path takes over (and answers any error itself)
            return None
        if data is not None:
            self._exit_flush()
            self.touched()
        return data

    def stat(self, path: str) -> FileInfo | None:
        """A file's metadata as its owner on this host answers a ``STAT`` (what the
        async path asks last, after its caches), remembered in the client's metadata
        cache; or None: ask the async path. That is also the answer once a miss in the
        file's directory should list it (``ClientCache.list_due``, counted as the
        async path counts): one listing then serves the directory's next stats. A
        missing file is None too, without turning this path off (``exists()`` asks
        for such files): the async path raises it."""
        if self.off or not self.settings.short_circuit:
            return None
        try:
            found = self._file(path)
            if found is None:
                return None
            np, ds = found
            if self.cache.list_due(ds, np.key_path.rpartition("/")[0]):
                return None
            w = self._owner(ds, np.key_path)
            m, _fds = self._call(w, StatRequest(ds.name, np.key_path, ds.generation))
        except NotFound:
            return None
        except Exception:  # as in read: the async path takes over from here
            self.off = True
            return None
        info: FileInfo = m.info
        if not info.is_dir:
            self.cache.remember(ds.name, info)
        return FileInfo(str(np), info.size, info.version, info.mtime, info.is_dir)

    def _file(self, path: str) -> tuple[NsPath, Dataset] | None:
        """A file's path and its dataset (a mount it names); None for a dataset or
        mount root. Raises what the async path would answer."""
        np = split_path(path)
        if not np.rel:
            return None
        ds = self._dataset(np.dataset)
        ds.mount(np.mount)
        return np, ds

    def _dataset(self, name: str) -> Dataset:
        """The dataset's definition, the ring known: fetched now by a new client."""
        c = self.cache
        hit = c.datasets.get(name)
        now = time.monotonic()
        if hit is not None and c.ring is not None:
            fresh = self.settings.ring_refresh
            if now - c.checked_at > fresh or now - c.ring_at > fresh:
                raise _Skip  # a refresh is due: the loop's
            return hit[0]
        asks = ([api.RING] if c.ring is None else []) + ([] if hit else [api.dataset_path(name)])
        got = master_get(self.settings.master, asks, self._token_now())  # at once
        answers = dict(zip(asks, got, strict=True))
        if api.RING in answers:
            ring, workers, _gen = parse_ring(answers[api.RING])
            if c.ring is None or ring.epoch >= c.ring.epoch:
                c.workers.update(workers)
                c.ring = ring
            c.ring_at = time.monotonic()
        if hit is None:
            ds = Dataset.from_dict(dict(answers[api.dataset_path(name)]))
            now = time.monotonic()
            old = c.datasets.get(name)
            if old is not None and old[0].generation != ds.generation:
                c.forget_dataset(name)  # as ControlPlane.install: metadata may be stale
            c.datasets[name] = (ds, now)
            if not c.checked_at:
                c.checked_at = now  # a new client: what it just fetched is fresh
            return ds
        return hit[0]

    def _owner(self, ds: Dataset, key: str) -> WorkerAddr:
        """The worker the async path would ask first (Router.owners' order: a fresh
        process has no suspects), which must be on this host."""
        c, s = self.cache, self.settings
        assert c.ring is not None
        ids = c.ring.owners(f"{ds.name}/{key}", ds.policy.replicas + EXTRA_OWNERS)
        addrs = [c.workers[i] for i in ids if i in c.workers]
        if ds.policy.placement == "local":
            addrs.sort(key=lambda w: w.node != s.node)
        if not addrs or not addrs[0].uds or addrs[0].node != s.node:
            raise _Skip
        return addrs[0]

    def _read_local(
        self, w: WorkerAddr, ds: Dataset, key: str, offset: int, length: int
    ) -> bytes | None:
        """As ShortCircuit.read_local: a directory's cached files first (a dataset that
        never revalidates), else the file's pages; None when they are not there."""
        c = self.cache
        if ds.policy.staleness == NEVER:
            directory = key.rpartition("/")[0]
            if c.dir_due((w.id, ds.name, directory)):
                whole_first = directories_to_locate(c, w.id, ds, [directory])
                if not (whole_first and self._locate_dir(w, ds, None)):
                    self._locate_dir(w, ds, directory)
                fast = read_located(c, ds, key, offset, length)
                if fast is not None:
                    return fast
        info = c.info(ds, key)
        version = info.version if info is not None else None
        ps = ds.policy.page_size
        req = LocateRequest(
            ds.name, key, version, offset, length, False, LOCATE_AHEAD, ps, ds.generation, True
        )
        m, fds = self._call(w, req, True)
        if layout_moved(c, ds):
            _close_all(fds)
            raise _Skip
        data = take_locations(c, w.id, ds, key, m, fds, offset, length)
        if data is None:
            raise _Skip  # no usable locations: read over the socket, the async way
        c.counters.local += 1
        c.counters.bytes_local += len(data)
        return data

    def _locate_dir(self, w: WorkerAddr, ds: Dataset, directory: str | None) -> bool:
        req = LocateDirRequest(ds.name, directory, ds.policy.page_size, ds.generation, True)
        m, fds = self._call(w, req, True)
        return take_dir(self.cache, w.id, ds, directory, m, fds)

    # -- hits -------------------------------------------------------------------------

    def flush_touches(self) -> None:
        """Report the buffered hits to their workers now, on this thread (best effort:
        a worker that does not take them misses these counts, as on the async path)."""
        for wid, req in touch_batches(self.cache):
            w = self.cache.workers.get(wid)
            if w is None or not w.uds:
                continue
            try:
                self._call(w, req)
            except (ShoalError, OSError, EOFError, ValueError):
                continue

    def touched(self) -> None:
        """A hit was buffered while the client has no loop: make sure it is reported
        within TOUCH_EVERY (as the loop's ticker would), by a thread that sends the
        buffered hits every TOUCH_EVERY and ends once there are none."""
        if self._flushing or self.handed:
            return
        with self._flush_lock:
            if self._flushing:
                return
            self._flushing = True
        # a bare thread: Thread.start() waits until it runs, a switch the reader
        # would pay on its first read
        _thread.start_new_thread(self._flusher, ())

    def _flusher(self) -> None:
        c = self.cache
        while True:
            time.sleep(TOUCH_EVERY)
            if self.handed or self._pid != os.getpid():
                break  # the loop's ticker reports them from now on
            if c.touch_log:
                self.flush_touches()
                continue
            with self._flush_lock:
                if not c.touch_log:
                    self._flushing = False
                    return
        self._flushing = False

    def _exit_flush(self) -> None:
        """Once: flush the hits at interpreter exit (multiprocessing's exit hook when
        it is loaded, which also runs at the end of a forked DataLoader worker)."""
        if self._at_exit:
            return
        self._at_exit = True
        ref = weakref.ref(self)
        util = sys.modules.get("multiprocessing.util")
        if util is not None:
            util.Finalize(self, _flush_at_exit, args=(ref,), exitpriority=9)
        else:
            import atexit

            atexit.register(_flush_at_exit, ref)

    # -- connections ------------------------------------------------------------------

    def _call(
        self, w: WorkerAddr, req: Request[Any], want_fds: bool = False
    ) -> tuple[Any, list[int]]:
        """``req``'s answer on this thread's connection to ``w`` (opened, with its
        HELLO, on first use); a reply's newer ring epoch ends this path (the ring is
        refreshed by the loop)."""
        conn = self._conn(w)
        try:
            reply, epoch, fds = conn.call(req, want_fds)
        except (OSError, EOFError, ProtocolError):
            self._drop(w, conn)
            raise
        ring = self.cache.ring
        if ring is not None and epoch > ring.epoch:
            self.off = True  # what comes next is the async path's, which refreshes
        return reply, fds

    def _conn(self, w: WorkerAddr) -> _Uds:
        conns: dict[str, _Uds] | None = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        conn = conns.get(w.id)
        if conn is not None:
            return conn
        conn = _Uds(w.uds, probe_after(self.settings.request_timeout))
        try:
            token = self._token_now()
            hello_req = HelloRequest(token=token) if token else HelloRequest()
            hello, _epoch, _fds = conn.call(hello_req)
            wire.check_hello(hello.version, w.uds)
            if hello.worker != w.id:
                raise Unavailable(f"the worker at {w.uds} is {hello.worker!r}, not {w.id!r}")
        except BaseException:
            conn.close()
            raise
        conns[w.id] = conn
        self._all.add(conn)
        return conn

    def _drop(self, w: WorkerAddr, conn: _Uds) -> None:
        conn.close()
        conns = getattr(self._local, "conns", None)
        if conns is not None and conns.get(w.id) is conn:
            del conns[w.id]

    def hand_over(self) -> None:
        """The client started its loop: the async path serves, its ticker reports."""
        self.off = self.handed = True

    def close(self) -> None:
        """Close every thread's connections (after a flush of the hits, unless the
        loop reports them); later reads take the async path."""
        if not self.handed and self.cache.touch_log:
            self.flush_touches()
        self.off = self.handed = True
        for conn in list(self._all):
            conn.close()

    def abandon(self) -> None:
        """After fork: the connections are the parent's; forget them here."""
        self.off = self.handed = True
        for conn in list(self._all):
            conn.close()

    # -- the master -------------------------------------------------------------------

    def _token_now(self) -> str | None:
        """This client's token, for the master and the HELLO (as the async pools send
        it): looked up once."""
        if not self._token_known:
            self._token = token_for(self.settings.master)
            self._token_known = True
        return self._token


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _flush_at_exit(ref: weakref.ref[DirectReads]) -> None:
    direct = ref()
    if direct is None or direct._pid != os.getpid():
        return  # gone, or the parent's (its connections are the parent's)
    if not direct.handed and direct.cache.touch_log:
        try:
            direct.flush_touches()
        except Exception:  # exiting anyway: nothing to report to
            pass

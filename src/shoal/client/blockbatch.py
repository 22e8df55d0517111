"""``cat_many`` over blocking connections on the caller's thread (the sync client).

The async ``cat_many`` (shoal.client.batch) resolves and routes each path with an
``await``, copies every byte twice in user space (out of the receive buffer, then per
file) and costs the façade a hop to the loop thread per call. Here, when every path's
dataset and the ring are known and fresh and each file's first healthy owner is on
another host, the paths are grouped by owner and each group's BATCH (at most
``wire.MAX_BATCH`` paths) is sent on this thread's connection to that owner -- all the
owners' requests first, then their answers read in turn, so several workers answer at
once. Every file is checked against its xxh3 and its version remembered, as the async
path does; each file is received into a bytes object of its own (no copy out of a
batch-sized buffer).

What this path does not settle goes to the async ``cat_many`` in one call: any path it
cannot route here (the whole call then), a group whose connection fails, and files a
BATCH does not carry (larger than a page, a bad checksum).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import xxhash

from shoal.core.types import FileInfo, split_path
from shoal.errors import IsADirectory, ShoalError
from shoal.proto.messages import BatchRequest, ItemStatus, decode_reply
from shoal.proto.wire import MAX_BATCH

if TYPE_CHECKING:
    from shoal.client.blocking import BlockingReads, _Conn
    from shoal.client.cache import WorkerAddr
    from shoal.core.types import Dataset

_xxh3 = xxhash.xxh3_64_intdigest

#: what is left to the async path
Rest = list[str]
Out = dict[str, bytes | ShoalError]


def cat_many(b: BlockingReads, paths: list[str]) -> tuple[Out, Rest] | None:
    """(files served, paths left to the async ``cat_many``), or None: all of them."""
    if b.closed:
        return None
    now = time.monotonic()
    out: Out = {}
    groups: dict[tuple[str, str], tuple[Dataset, WorkerAddr, list[tuple[str, str]]]] = {}
    for p in paths:
        try:
            np = split_path(p)
        except ShoalError:
            return None
        ds = b.dataset(np.dataset, now)
        if ds is None:
            return None
        if not np.rel:
            out[p] = IsADirectory(str(np))
            continue
        placed = b.placed(ds, np, now)
        if placed is None:
            return None
        key, w = placed
        g = groups.get((ds.name, w.id))
        if g is None:
            g = groups[(ds.name, w.id)] = (ds, w, [])
        g[2].append((p, key))
    rest: Rest = []
    todo = [
        (ds, w, items[i : i + MAX_BATCH])
        for ds, w, items in groups.values()
        for i in range(0, len(items), MAX_BATCH)
    ]
    while todo:
        # one request per worker in flight on this thread's connection to it
        sent: list[tuple[Dataset, WorkerAddr, list[tuple[str, str]], _Conn, BatchRequest]] = []
        later = []
        busy: set[str] = set()
        for ds, w, items in todo:
            if w.id in busy:
                later.append((ds, w, items))
                continue
            busy.add(w.id)
            req = BatchRequest(ds.name, tuple(k for _, k in items), ds.generation)
            took = b.take(w)
            conn = None
            if took is not None:
                conn = took[0]
                try:
                    conn.send(req)
                except Exception:  # OSError, ...: the async path's
                    conn.close()
                    conn = None
            if conn is None:
                rest.extend(p for p, _ in items)
                continue
            sent.append((ds, w, items, conn, req))
        for ds, w, items, conn, req in sent:
            _answer(b, ds, w, items, conn, req, out, rest)
        todo = later
    return out, rest


def _answer(
    b: BlockingReads,
    ds: Dataset,
    w: WorkerAddr,
    items: list[tuple[str, str]],
    conn: _Conn,
    req: BatchRequest,
    out: Out,
    rest: Rest,
) -> None:
    """Read one BATCH's answer into ``out`` (``rest``: what the async path reads).

    Each file is received into a bytes object of its own (no copy out of a batch-sized
    buffer, whose fresh pages the kernel would also have to fault in), and checked while
    the next one arrives."""
    try:
        status, epoch, meta, data_len = conn.recv_head()
    except Exception:  # OSError, EOFError, ProtocolError: the async path's
        conn.close()
        rest.extend(p for p, _ in items)
        return
    try:
        reply = decode_reply(req, status, meta)
    except ShoalError:  # the worker's error answer, or a malformed one: the async path's
        if data_len:
            conn.close()  # its data not taken: the connection is not reused
        else:
            b.keep(w, conn)
        rest.extend(p for p, _ in items)
        return
    ok = ItemStatus.OK
    if len(reply.items) != len(items) or data_len != sum(
        it.size for it in reply.items if it.status == ok
    ):
        conn.close()
        rest.extend(p for p, _ in items)
        return
    c = b.cache
    ring = c.ring
    if ring is not None and epoch > ring.epoch:
        b.on_epoch()
    remember, name = c.remember, ds.name
    for i, ((p, _), it) in enumerate(zip(items, reply.items, strict=True)):
        if it.status == ok:
            try:
                chunk = conn.recv_data(it.size) if it.size else b""
            except Exception:  # OSError, EOFError: the rest is the async path's
                conn.close()
                rest.extend(p for p, _ in items[i:])
                return
            if _xxh3(chunk) != it.checksum:
                rest.append(p)
            else:
                remember(name, FileInfo(it.path, it.size, it.version))
                out[p] = chunk
        elif it.status == ItemStatus.NOT_SMALL:
            rest.append(p)  # larger than a page: read in pages
        else:
            out[p] = it.error()
    b.keep(w, conn)
    c.counters.remote += 1
    c.counters.bytes_remote += data_len

"""The programs the ``remote`` workload runs inside a host's namespace, one JSON line
on stdout each (``python -m shoal.bench.remoteio KIND ...``):

- ``serve``: raw TCP at the network's speed, the reference. Listens on the host's
  address, prints its port, and answers each 16-byte request (offset, length) with
  ``os.sendfile`` of that range of a local file (the kernel's page cache: no copy in
  user space), until the client closes;
- ``raw``: its reader, ``conns`` connections on threads, each asking ``msg`` bytes at a
  time and receiving them with ``recv_into`` a preallocated page-aligned buffer (no
  allocation, no copy);
- ``large``: the shoal client reading one file in ``chunk`` reads, ``inflight`` at a
  time (``Client.read``; threads share one client);
- ``small``: the shoal client reading whole files, ``Client.cat_many`` in batches of
  ``batch`` from ``threads`` threads (or ``Client.cat`` one file at a time).

Every reader reports wall seconds, bytes and its process's CPU seconds (user + system,
all threads: ``getrusage``), so the workload can say CPU seconds per GB.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import socket
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

REQ = struct.Struct("!QQ")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _out(d: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(d) + "\n")
    sys.stdout.flush()


# -- raw TCP ----------------------------------------------------------------------------


def _serve_one(conn: socket.socket, fd: int) -> None:
    try:
        hdr = bytearray(REQ.size)
        view = memoryview(hdr)
        while True:
            got = 0
            while got < REQ.size:
                n = conn.recv_into(view[got:])
                if n == 0:
                    return
                got += n
            off, left = REQ.unpack(hdr)
            while left > 0:
                n = os.sendfile(conn.fileno(), fd, off, left)
                if n == 0:
                    return
                off += n
                left -= n
    except OSError:
        return
    finally:
        conn.close()


def serve(host: str, path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, 0))
    ls.listen(64)
    _out({"port": ls.getsockname()[1], "size": os.fstat(fd).st_size})
    while True:
        conn, _ = ls.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve_one, args=(conn, fd), daemon=True).start()


def raw(host: str, port: int, file_size: int, msg: int, total: int, conns: int) -> dict[str, Any]:
    """``total`` bytes in messages of ``msg`` over ``conns`` connections; the ranges
    walk the server's file (wrapping around) so they stay in its page cache."""
    msgs = max(1, total // msg)
    per = [msgs // conns + (1 if i < msgs % conns else 0) for i in range(conns)]
    span = max(1, file_size // msg)
    got = [0] * conns
    socks = []
    for _ in range(conns):
        s = socket.create_connection((host, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(s)

    def reader(i: int) -> None:
        s = socks[i]
        buf = mmap.mmap(-1, min(msg, 4 << 20))  # page-aligned, reused for every receive
        view = memoryview(buf)
        k = i
        for _ in range(per[i]):
            s.sendall(REQ.pack((k % span) * msg, msg))
            k += conns
            left = msg
            while left:
                n = s.recv_into(view[: min(left, len(view))])
                if n == 0:
                    raise EOFError("server closed")
                left -= n
                got[i] += n
        view.release()
        buf.close()

    t0, c0 = time.perf_counter(), _cpu()
    with ThreadPoolExecutor(conns) as pool:
        list(pool.map(reader, range(conns)))
    secs, cpu = time.perf_counter() - t0, _cpu() - c0
    for s in socks:
        s.close()
    return {"seconds": secs, "bytes": sum(got), "files": sum(per), "cpu": cpu}


# -- the shoal client -------------------------------------------------------------------


def _client(master: str, short_circuit: bool, pool: int, tls_ca: str | None) -> Any:
    from shoal.client import Client
    from shoal.config import ClientSettings

    kw: dict[str, Any] = {"master": master, "short_circuit": short_circuit, "pool_size": pool}
    if tls_ca:
        kw["tls_ca"] = tls_ca
    return Client(settings=ClientSettings(**kw))


def large(
    c: Any, path: str, size: int, chunk: int, inflight: int, reps: int
) -> list[dict[str, Any]]:
    offs = list(range(0, size, chunk))
    out = []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), _cpu()
        if inflight == 1:
            n = sum(len(c.read(path, o, chunk)) for o in offs)
        else:
            with ThreadPoolExecutor(inflight) as pool:
                n = sum(pool.map(lambda o: len(c.read(path, o, chunk)), offs))
        out.append({"seconds": time.perf_counter() - t0, "bytes": n, "cpu": _cpu() - c0})
    return out


def small(
    c: Any, paths: list[str], batch: int, threads: int, how: str, reps: int
) -> list[dict[str, Any]]:
    def one_batch(b: list[str]) -> int:
        if how == "cat":
            return sum(len(c.cat(p)) for p in b)
        n = 0
        for p, v in c.cat_many(b).items():
            if not isinstance(v, bytes):
                raise RuntimeError(f"{p}: {v!r}")
            n += len(v)
        return n

    batches = [paths[i : i + batch] for i in range(0, len(paths), batch)]
    out = []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), _cpu()
        with ThreadPoolExecutor(threads) as pool:
            n = sum(pool.map(one_batch, batches))
        out.append(
            {
                "seconds": time.perf_counter() - t0,
                "bytes": n,
                "files": len(paths),
                "cpu": _cpu() - c0,
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m shoal.bench.remoteio")
    sub = ap.add_subparsers(dest="kind", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--host", required=True)
    s.add_argument("--file", required=True)
    r = sub.add_parser("raw")
    r.add_argument("--host", required=True)
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--file-size", type=int, required=True)
    r.add_argument("--msg", type=int, required=True)
    r.add_argument("--total", type=int, required=True)
    r.add_argument("--conns", type=int, default=1)
    r.add_argument("--reps", type=int, default=1)
    for name in ("large", "small"):
        p = sub.add_parser(name)
        p.add_argument("--master", required=True)
        p.add_argument("--short-circuit", action="store_true")
        p.add_argument("--pool", type=int, default=8)
        p.add_argument("--tls-ca")
        p.add_argument("--reps", type=int, default=1)
        p.add_argument("--warm", type=int, default=0, help="unmeasured passes first")
    lg = sub.choices["large"]
    lg.add_argument("--path", required=True)
    lg.add_argument("--size", type=int, required=True)
    lg.add_argument("--chunk", type=int, default=1 << 20)
    lg.add_argument("--inflight", type=int, default=1)
    sm = sub.choices["small"]
    sm.add_argument("--paths-file", required=True)
    sm.add_argument("--batch", type=int, default=64)
    sm.add_argument("--threads", type=int, default=4)
    sm.add_argument("--how", choices=("cat_many", "cat"), default="cat_many")
    a = ap.parse_args(argv)
    if a.kind == "serve":
        serve(a.host, a.file)
        return
    if a.kind == "raw":
        runs = [raw(a.host, a.port, a.file_size, a.msg, a.total, a.conns) for _ in range(a.reps)]
        _out({"runs": runs})
        return
    c = _client(a.master, a.short_circuit, a.pool, a.tls_ca)
    try:
        if a.kind == "large":
            if a.warm:
                large(c, a.path, a.size, a.chunk, a.inflight, a.warm)
            runs = large(c, a.path, a.size, a.chunk, a.inflight, a.reps)
        else:
            with open(a.paths_file) as f:
                paths = f.read().split()
            if a.warm:
                small(c, paths, a.batch, a.threads, a.how, a.warm)
            runs = small(c, paths, a.batch, a.threads, a.how, a.reps)
        _out({"runs": runs, "counters": dict(c.counters())})
    finally:
        c.close()


if __name__ == "__main__":
    main()

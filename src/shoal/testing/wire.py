"""A raw data-path client for tests: plain blocking sockets and frames built with
:mod:`shoal.proto.messages`, for sending a worker what a real client never would
(malformed, huge, pipelined or half-sent frames) and reading exactly what it answers.

:func:`connect` says HELLO first (as every client of protocol 2 does), so that what a
test sends next reaches the worker's decoders; ``hello=False`` gives a connection that
has not (to test the refusal of clients of another version).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shoal.proto import wire
from shoal.proto.messages import HelloRequest, LocateReply, LocateRequest, Request, encode_request

Addr = tuple[str, int] | str
R = TypeVar("R")


@dataclass(slots=True)
class RawReply:
    """One response as it came: the status, the request id, the worker's epoch, the
    meta (msgpack decoded, not checked), the data and any descriptors handed over."""

    status: int
    req_id: int
    epoch: int
    meta: Any
    data: bytes = b""
    fds: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == wire.Status.OK


def connect(addr: Addr, timeout: float = 5.0, hello: bool = True) -> socket.socket:
    """A connection to a worker's TCP port or Unix socket, HELLO said unless told not."""
    fam = socket.AF_UNIX if isinstance(addr, str) else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(addr)
        if hello:
            s.sendall(encode_request(HelloRequest(), 0))
            r = read_reply(s)
            if not r.ok or r.meta.get("version") != wire.VERSION:
                raise AssertionError(f"HELLO answered {r.meta!r}")
    except BaseException:
        s.close()
        raise
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("closed by the worker")
        buf += chunk
    return bytes(buf)


def read_reply(s: socket.socket, want_fds: bool = False) -> RawReply:
    """The next response on ``s`` (with ``want_fds``, the descriptors that came with its
    header over a Unix socket)."""
    size = wire.RESP_HDR.size
    fds: list[int] = []
    head = b""
    if want_fds:
        while len(head) < size:
            data, more, _flags, _ = socket.recv_fds(s, size - len(head), wire.MAX_FDS)
            if not data:
                raise ConnectionError("closed by the worker")
            head += data
            fds += more
    else:
        head = recv_exact(s, size)
    status, req_id, epoch, meta_len, data_len = wire.RESP_HDR.unpack(head)
    meta = wire.unpack(recv_exact(s, meta_len)) if meta_len else None
    return RawReply(status, req_id, epoch, meta, recv_exact(s, data_len), fds)


def send(s: socket.socket, req: Request[Any], req_id: int = 1) -> None:
    s.sendall(encode_request(req, req_id))


def call(s: socket.socket, req: Request[R], req_id: int = 1) -> R:
    """Send ``req`` and decode its typed reply (the worker's error raised)."""
    send(s, req, req_id)
    r = read_reply(s)
    if not r.ok:
        raise wire.decode_error(r.meta)
    return req.decode_reply(r.meta)


def hello(addr: Addr, timeout: float = 5.0) -> float:
    """Seconds a HELLO on a fresh connection took; raises unless answered in this
    protocol's version."""
    t0 = time.monotonic()
    connect(addr, timeout).close()
    return time.monotonic() - t0


def locate(
    addr: str, path: str, dataset: str = "ds", cached_only: bool = True
) -> tuple[LocateReply, list[int]]:
    """LOCATE of a whole file over a Unix socket: the reply and the handed-over
    descriptors (the caller closes them)."""
    with connect(addr) as s:
        send(s, LocateRequest(dataset, path, None, 0, -1, cached_only))
        r = read_reply(s, want_fds=True)
    if not r.ok:
        for fd in r.fds:
            os.close(fd)
        raise wire.decode_error(r.meta)
    return LocateReply.decode(r.meta), r.fds

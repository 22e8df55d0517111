"""One data-path connection on the worker: frames in, answers out, one request at a
time. Each frame is checked against the limits of shoal.proto.wire before its body is
buffered, decoded into a typed request (shoal.proto.messages), answered on the spot
when :meth:`DataService.try_fast` can, else in a task. Answers leave with
``os.sendfile`` from the page store's files; when the socket is full the rest follows
with ``sendfile`` as it drains (no page is read into the worker, and no request of
the connection is read until its answer is out), and descriptors travel to local
clients with SCM_RIGHTS in the answer's own ``sendmsg``. Over TLS pages are read and
written through the transport (it encrypts in user space).

The first frame of a connection must be a HELLO of this protocol version (see
shoal.proto.wire): any other op before it, or a HELLO of another version, is answered
with the protocol error naming both versions (clients of protocol 1 send no HELLO).
With the cluster secret, the HELLO's token is verified (once: its claims stay with the
connection and each request's dataset is checked against them); a refused HELLO is
answered ``unauthenticated`` and the connection closed. A connection that has not said
a good HELLO within ``wire.HELLO_TIMEOUT`` is closed, and its frames until then may be
at most ``wire.MAX_HELLO`` bytes.
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shoal.core.tokens import Claims
from shoal.errors import ProtocolError, ShoalError, Unauthenticated, Unavailable
from shoal.proto import wire
from shoal.proto.messages import (
    AnyRequest,
    HelloRequest,
    decode_request,
    encode_reply,
)
from shoal.proto.wire import Op
from shoal.store.base import Location
from shoal.worker.loader import Piece
from shoal.worker.ops import Answer, piece_len

if TYPE_CHECKING:
    from shoal.worker.server import DataService

#: ops whose latency shoal_read_seconds records, by their label
_TIMED = {Op.READ: "read", Op.LOCATE: "locate", Op.BATCH: "batch"}

log = logging.getLogger("shoal.worker.server")


@dataclass(slots=True)
class _Out:
    """An answer's pieces not yet handed to the socket (its header already is)."""

    pieces: list[Piece]
    #: the piece being sent, and where its next byte is (-1: not started)
    i: int = 0
    off: int = -1
    left: int = 0
    #: one open per data file per answer: a BATCH's small files share a few segments
    fds: dict[str, int] = field(default_factory=dict)


class Conn(asyncio.Protocol):
    """One client connection: frames in, replies out, one request at a time."""

    def __init__(self, service: DataService, local: bool) -> None:
        self.service = service
        self.local = local
        #: whether the peer said HELLO in this protocol's version (with a good token)
        self.greeted = False
        #: what the HELLO's token grants (None: the worker checks no tokens)
        self.claims: Claims | None = None
        self._hello_timer: asyncio.TimerHandle | None = None
        self.buf = bytearray()
        self.busy = False
        self.transport: asyncio.Transport | None = None
        self._raw: socket.socket | None = None
        self.peer: Any = None
        #: bytes of service.buffered this connection holds for an incomplete frame
        self.reserved = 0
        #: data_received calls so far, and at the last idle sweep; sweeps seen quiet
        self.ticks = 0
        self._swept_ticks = 0
        self._quiet = 0
        #: reading paused (a request in flight or answers not taken); writing paused
        self._paused = False
        self._wpaused = False
        #: the answer whose pages are still going out with sendfile, as the socket
        #: drains (no request is read meanwhile: one answer at a time)
        self._out: _Out | None = None
        self._sending = False
        self._waiting_writable = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if transport.get_extra_info("sslcontext") is not None:
            sock = None  # TLS: bytes go through the transport (no sendfile, no sendmsg)
        if sock is not None:
            # our own handle on the fd: uvloop's pseudo-socket has no sendmsg/sendfile
            self._raw = socket.socket(fileno=os.dup(sock.fileno()))
            try:
                self._raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            except OSError:
                pass
        peer = self._peer(transport)
        if not self.service.admit(self, peer):
            self._close()
            return
        self.peer = peer
        self._hello_timer = asyncio.get_running_loop().call_later(
            wire.HELLO_TIMEOUT, self._hello_late
        )

    def _hello_late(self) -> None:
        """No good HELLO within HELLO_TIMEOUT of connecting: a silent, slow or garbage
        handshake holds its connection slot no longer."""
        self._hello_timer = None
        if not self.greeted and self.transport is not None:
            self.service.note("connections closed without a HELLO", f"{self.peer}")
            self._unreserve()
            self._close()

    def _peer(self, transport: asyncio.BaseTransport) -> Any:
        """Who is at the other end: the remote address over TCP, the uid on the Unix
        socket (connections are counted per peer)."""
        if self.local:
            if self._raw is not None:
                try:
                    cred = self._raw.getsockopt(
                        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
                    )
                    return ("uid", struct.unpack("3i", cred)[1])
                except OSError:
                    pass
            return ("uid", None)
        name = transport.get_extra_info("peername")
        return name[0] if isinstance(name, tuple) and name else name

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_out()
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        self.transport = None
        self._unreserve()
        if self.peer is not None:
            self.service.release(self, self.peer)
            self.peer = None
        self.buf = bytearray()

    def _close(self) -> None:
        t = self.transport
        if t is not None:
            self.transport = None  # nothing more is read or answered
            t.close()

    def sweep(self) -> None:
        """Called every quarter of the idle timeout: close this connection once it has
        received nothing and taken none of its answer for four sweeps in a row with no
        request in flight (a peer that stops reading mid-answer is closed too)."""
        if self.busy or self.ticks != self._swept_ticks:
            self._swept_ticks = self.ticks
            self._quiet = 0
            return
        self._quiet += 1
        if self._quiet >= 4:
            self._close()

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return  # refused or closing: nothing more is read
        self.ticks += 1
        self.buf += data
        if self.busy or self._sending or self._wpaused:
            # one request answered at a time per connection, and its answer not yet
            # taken: what a client sends ahead waits in the kernel's buffers
            if not self._paused:
                self.transport.pause_reading()
                self._paused = True
            return
        self._next()

    def pause_writing(self) -> None:
        """The peer does not take its answers: read no more requests until it does."""
        self._wpaused = True

    def resume_writing(self) -> None:
        self._wpaused = False
        self._go_on()

    def _go_on(self) -> None:
        if self.busy or self._sending or self._wpaused or self.transport is None:
            return
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        self._next()

    def _unreserve(self) -> None:
        if self.reserved:
            self.service.buffered -= self.reserved
            self.reserved = 0

    def _next(self) -> None:
        hdr = wire.REQ_HDR.size
        while not (self.busy or self._sending or self._wpaused) and self.transport is not None:
            buf = self.buf
            if len(buf) < hdr:
                return
            body_len, op_raw, req_id = wire.REQ_HDR.unpack_from(buf)
            if body_len > (wire.max_request(op_raw) if self.greeted else wire.MAX_HELLO):
                # the framing cannot be trusted past this: answer and close, unread
                self.service.note("oversized frames refused", f"{self.peer}: {body_len} bytes")
                self._fatal(req_id, ProtocolError(f"request of {body_len} bytes is too large"))
                return
            end = hdr + body_len
            if len(buf) < end:
                if end > self.reserved:  # hold room for the whole frame, or refuse it
                    svc = self.service
                    if svc.buffered - self.reserved + end > wire.MAX_BUFFERED:
                        svc.note("frames over the buffer cap refused", f"{self.peer}: {end} bytes")
                        self._fatal(req_id, Unavailable("worker busy: too many bytes buffered"))
                        return
                    svc.buffered += end - self.reserved
                    self.reserved = end
                return
            body = buf[hdr:end]  # a copy: no view of buf may outlive the resize below
            del buf[:end]
            if self.reserved:
                self._unreserve()
                if not buf:
                    self.buf = bytearray()  # give back a large frame's room
            if not self.greeted and op_raw != Op.HELLO:
                self.service.note("requests before a HELLO refused", f"{self.peer}: op {op_raw}")
                self._send_error(req_id, wire.refuse_hello(None) or ProtocolError("HELLO first"))
                continue
            try:
                req = decode_request(op_raw, body)
            except Exception as exc:  # any malformed body: its length is known, go on
                err = exc if isinstance(exc, ShoalError) else ProtocolError(f"bad body: {exc}")
                self.service.note("malformed requests refused", f"{self.peer}: {err.message}")
                self._send_error(req_id, err)
                continue
            op = req.OP
            if isinstance(req, HelloRequest):
                refusal = wire.refuse_hello(req.version)
                if refusal is not None:
                    self.service.note("HELLOs of another version refused", f"{self.peer}: {refusal.message}")  # fmt: skip
                    self._send_error(req_id, refusal)
                    continue
                try:
                    self.claims = self.service.authenticate(req, self.peer)
                except Unauthenticated as exc:
                    self._fatal(req_id, exc)  # before any work: answer and close
                    return
                self.greeted = True
                if self._hello_timer is not None:
                    self._hello_timer.cancel()
                    self._hello_timer = None
            elif self.claims is not None:
                try:
                    self.service.admit_request(self.claims, req, self.peer)
                except Unauthenticated as exc:
                    self._fatal(req_id, exc)  # expired while connected
                    return
                except ShoalError as exc:
                    self._send_error(req_id, exc)
                    continue
            t0 = time.perf_counter()
            try:
                reply = self.service.try_fast(req, self.local)
            except ShoalError as exc:
                self._send_error(req_id, exc)
                continue
            except (IndexError, TypeError, ValueError) as exc:
                self._send_error(req_id, self._bad_args(op, exc))
                continue
            except Exception as exc:
                self._send_error(req_id, self.service.internal(op, exc))
                continue
            if reply is not None:
                self._answer(op, req_id, reply)
                self._timed(op, reply, t0)
                continue
            self.busy = True
            asyncio.get_running_loop().create_task(self._slow(req, req_id, t0))

    def _bad_args(self, op: Op, exc: Exception) -> ShoalError:
        self.service.note("malformed requests refused", f"{self.peer}: {op.name}: {exc!r}")
        return ProtocolError(f"bad arguments for {op.name}: {exc}")

    def _timed(self, op: Op, reply: Answer, t0: float) -> None:
        """Read latency, from the request's arrival to its reply handed to the socket."""
        name = _TIMED.get(op)
        if name is not None:
            source = "ufs" if reply.ufs else "cache"
            self.service.latency.observe(name, source, time.perf_counter() - t0)

    async def _slow(self, req: AnyRequest, req_id: int, t0: float) -> None:
        op = req.OP
        try:
            reply = await self.service.handle(req, self.local)
        except ShoalError as exc:
            self._send_error(req_id, exc)
        except (IndexError, TypeError, ValueError) as exc:
            self._send_error(req_id, self._bad_args(op, exc))
        except Exception as exc:
            self._send_error(req_id, self.service.internal(op, exc))
        else:
            self._answer(op, req_id, reply)
            self._timed(op, reply, t0)
        finally:
            self.busy = False
        self._go_on()

    def _fatal(self, req_id: int, exc: ShoalError) -> None:
        self._send_error(req_id, exc)
        self._unreserve()
        self._close()

    def _send_error(self, req_id: int, exc: ShoalError) -> None:
        if self.transport is not None:
            self.transport.write(wire.encode_error(req_id, self.service.epoch, exc))

    def _answer(self, op: Op, req_id: int, reply: Answer) -> None:
        """Send a reply; a connection that cannot take it is closed (never an exception
        out of the protocol's callbacks: the loop would log a traceback per frame)."""
        try:
            self._send(req_id, reply)
        except OSError as exc:
            self.service.note("answers that could not be sent", f"{self.peer}: {op.name}: {exc}")
            self._close()
        except Exception as exc:
            self.service.internal(op, exc)
            self._close()

    def _send(self, req_id: int, reply: Answer) -> None:
        t = self.transport
        if t is None:
            if reply.own_fds:
                for fd in reply.fds:
                    os.close(fd)
            return
        total = sum(piece_len(p) for p in reply.pieces)
        head = encode_reply(req_id, self.service.epoch, reply.reply, total)
        if reply.fds:
            self._send_fds(head, reply.fds, reply.own_fds)
        else:
            t.write(head)
        if reply.pieces:
            self._out = _Out(reply.pieces)
            try:
                self._pump()
            except BaseException:
                self._end_out()
                raise

    def _pump(self) -> bool:
        """Hand the socket what it takes of the pending answer; True once all of it is
        (or the connection is gone), False while it waits for the socket to drain."""
        out, t = self._out, self.transport
        if out is None:
            return True
        if t is None:
            self._end_out()
            return True
        pieces = out.pieces
        while out.i < len(pieces):
            p = pieces[out.i]
            if isinstance(p, Location):
                if not self._send_file(p, out):
                    return False
            else:
                t.write(p)
            out.i += 1
            out.off = -1
        self._end_out()
        return True

    def _writable(self) -> None:
        """The socket drained while an answer's pages wait: send on, and once it is all
        out, read the next request."""
        self.ticks += 1  # the peer takes its answer: not idle (sweep), however long it is
        try:
            done = self._pump()
        except OSError as exc:
            self.service.note("answers that could not be sent", f"{self.peer}: {exc}")
            self._end_out()
            self._close()
            return
        except Exception as exc:
            self.service.internal(Op.READ, exc)
            self._end_out()
            self._close()
            return
        if done:
            self._go_on()

    def _end_out(self) -> None:
        out = self._out
        self._out = None
        self._sending = False
        if self._waiting_writable:
            self._waiting_writable = False
            if self._raw is not None:
                asyncio.get_running_loop().remove_writer(self._raw.fileno())
        if out is not None:
            for fd in out.fds.values():
                os.close(fd)

    def _send_fds(self, head: bytes, fds: list[int], own: bool) -> None:
        t = self.transport
        assert t is not None and self._raw is not None
        try:
            sent = 0
            if t.get_write_buffer_size() == 0:
                try:
                    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    sent = self._raw.sendmsg([head], anc)
                except BlockingIOError:
                    sent = 0
            if sent == 0:
                # cannot attach descriptors now; the client sees no fds and falls back
                log.debug("socket busy: LOCATE answered without descriptors")
            if sent < len(head):
                t.write(head[sent:])
        finally:
            if own:
                for fd in fds:
                    os.close(fd)

    def _send_file(self, loc: Location, out: _Out) -> bool:
        """Send one located piece: ``sendfile`` while the socket takes it (False: it is
        full, and the rest follows when it drains), else (TLS, or bytes of this answer
        still queued in the transport) read and written through the transport."""
        t = self.transport
        assert t is not None
        if out.off < 0:
            out.off, out.left = loc.offset, loc.length
        fd = out.fds.get(loc.path, -1)
        if fd < 0:
            try:
                fd = out.fds[loc.path] = os.open(loc.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                log.warning("cached file %s vanished: %s", loc.path, exc)
                t.write(bytes(out.left))  # keep framing; the checksum makes the client retry
                return True
        # the descriptor is closed by _end_out, after the answer's last piece
        raw = self._raw
        if raw is not None and t.get_write_buffer_size() == 0:
            sock = raw.fileno()
            while out.left > 0:
                try:
                    n = os.sendfile(sock, fd, out.off, out.left)
                except BlockingIOError:
                    if not self._waiting_writable:
                        asyncio.get_running_loop().add_writer(sock, self._writable)
                        self._waiting_writable = True
                    self._sending = True
                    return False
                if n == 0:
                    break  # the file is shorter than its location says
                out.off += n
                out.left -= n
        while out.left > 0:
            chunk = os.pread(fd, min(out.left, 8 << 20), out.off)
            if not chunk:
                t.write(bytes(out.left))
                break
            t.write(chunk)
            out.off += len(chunk)
            out.left -= len(chunk)
        return True

"""The data-path protocol between clients and workers (version 2): frames and limits.

Length-prefixed binary frames over TCP or a Unix socket; one request in flight per
connection (clients pool connections for concurrency), so frames need no reordering.
The messages inside the frames are typed, one frozen class per op's request and reply,
encoded and decoded in one place: :mod:`shoal.proto.messages`.

Request::

    u32 body_len | u8 op | u32 req_id | body (msgpack array: the request's fields)

Response::

    u8 status | u32 req_id | u32 epoch | u32 meta_len | u64 data_len | meta | data

``status`` is OK or ERR; an ERR's meta is the map ``{"code", "message"}`` (see
shoal.errors) in every version. ``epoch`` is the worker's ring epoch: a client holding
an older ring refreshes it. ``meta`` is msgpack; ``data`` is raw bytes (sent with
sendfile where possible). On a Unix socket a LOCATE response carries open file
descriptors (SCM_RIGHTS) in the same ``sendmsg`` as the response header, so a local
client reads cached bytes with ``pread`` and no copy passes through the worker.

Ops: request fields (the msgpack array, in this order) and reply (meta; data)
(classes in shoal.proto.messages; a trailing field may be left out: its default):

==========  ==========================================  ====================================
op          request                                     reply
==========  ==========================================  ====================================
HELLO       HelloRequest [version, token]               HelloReply {version, worker, node,
                                                        epoch} (a map, in every version)
STAT        StatRequest [dataset, path, generation]     StatReply: FileInfo wire list
LIST        ListRequest [dataset, path, generation]     ListReply [FileInfo wire list, ...]
READ        ReadRequest [dataset, path, offset,         ReadReply [version, size, mtime,
            length, version, page_size, generation]     first, [[len, ck], ...]]; the whole
                                                        pages covering the range
BATCH       BatchRequest [dataset, [path, ...],         BatchReply [[[path, status, version,
            generation]                                 size, ck, code, message], ...]]; the
                                                        OK items' bytes, concatenated
LOCATE      LocateRequest [dataset, path, version,      LocateReply [version, size, mtime,
            offset, length, cached_only, ahead,         first, [[fd_slot, offset, len, ck],
            page_size, generation, runs]                ...], [[dev, ino], ...], miss,
                                                        [ctime_ns, ...], run, sums]
                                                        + SCM_RIGHTS
TOUCH       TouchRequest [dataset, [[path, version,     Done [] (hits served by the short
            pages, bytes], ...]]                        circuit)
DROP        DropRequest [dataset, path, version,        Done [] (a reader saw a bad
            index]                                      checksum)
LOCATE_DIR  LocateDirRequest [dataset, directory,       LocateDirReply [[[path, version,
            page_size, generation, runs]                size, fd_slot, offset, len, ck],
                                                        ...], [[dev, ino], ...], full,
                                                        [[path, version, size, mtime,
                                                        fd_slot, offset], ...], sums,
                                                        [ctime_ns, ...]] + SCM_RIGHTS
                                                        (cached small files of a directory,
                                                        and runs of its large ones if asked;
                                                        directory None: of the whole
                                                        dataset, if small enough)
==========  ==========================================  ====================================

A BATCH item's ``status`` is an :class:`~shoal.proto.messages.ItemStatus`: OK (its
bytes follow), ERROR (``code`` and ``message`` are the error of reading it) or
NOT_SMALL (larger than a page: the client reads it with READ). A LOCATE of
``cached_only`` for a file not wholly cached answers ``miss`` true. A LOCATE reply's
trailing ``stamps`` (one per descriptor; 0 = none) is the data file's ctime at which the
worker read back and checked every page the reply hands over in it: a reader skips
its own checksum of those pages while fstat of the descriptor still shows that ctime
(see shoal.worker.handover.Verified). A LOCATE that says ``runs`` (true) takes a file
kept whole in one data file as one *run* instead of a record per page: ``run`` is
[fd_slot, offset, first, count] (page ``first + i`` lies at ``offset + i * page_size``,
the file's page length long) and ``sums`` the count page checksums as little-endian
u64s, for the whole file whatever range was asked (``pages`` is then empty); a reader
of a 1 GiB file makes one LOCATE, not one per 256 MiB window, and keeps one record for
it. A trailing field added like this needs no version bump: a worker ignores request
fields past those it knows, a reader decodes the reply fields it knows and ignores the
rest, and a field left out takes its default (an older worker answers ``runs`` with
pages, as before).

``version`` None means "whatever the worker holds within the dataset's staleness bound".
``page_size`` is the page layout the reader slices the answer with (0: not checked); a
worker that serves the dataset with another page size (its policy changed) first
refreshes its definitions, then answers the error ``stale_layout``
(:class:`~shoal.errors.StaleLayout`) and the reader refreshes its own and retries, so a
reader never mixes two layouts. ``generation`` is the dataset generation the reader
knows (None: not checked); a worker that knows an older one (a sync or policy change
it has not heard of yet) refreshes its definitions before it answers, so a reader that
saw a sync is never answered from the old manifest.
Paths are '<mount>/<relative path>' inside the dataset.

Data-path protocol v2 (what changed from 1, and how versions meet):

- Every op has one typed request and reply class (shoal.proto.messages); replies are
  msgpack arrays instead of maps, and a BATCH item says what it is with a status
  instead of an error message in its version field and a fake error code ("large").
- The first frame on every connection is a HELLO carrying the client's version; the
  worker answers its own. A worker refuses any other op on a connection that has not
  said HELLO, and a HELLO of another version, with the protocol error naming both
  versions ("this worker speaks data-path protocol 2, the client speaks 1: upgrade the
  client"); a client meeting a worker of another version fails the same way ("worker
  at HOST:PORT speaks data-path protocol 1, this client speaks 2: upgrade the worker"),
  never with a decode error. HELLO's shapes and the ERR map never change between
  versions, so this holds between any two.
- Connections are pooled, so the HELLO costs one round trip per new connection, none
  per request.

Authentication (issue 13): a worker given the cluster secret (``--secret-file``,
``SHOAL_SECRET``) takes a connection only once its HELLO carries a token signed with
it (``[version, token]``; the token is the second field, which workers that check none
ignore, so HELLO's shape is the same in every version and no version bump was
needed). The token is verified once, at the HELLO; its claims stay with the
connection and every later request is checked against them with a set lookup (a
reader token limited to datasets gets ``denied`` for any other dataset, on every op
and on both sockets). A HELLO without a token, or with one this cluster did not sign,
or an expired one, is answered with ``unauthenticated`` (one line saying what to
pass) and the connection is closed, before any other work. A connection must say its
HELLO within HELLO_TIMEOUT seconds of connecting, in a frame of at most MAX_HELLO
bytes (any frame before the HELLO is held to that size too), else it is closed: a
silent, slow or garbage handshake holds nothing for long.
"""

from __future__ import annotations

import array
import os
import socket
import struct
from enum import IntEnum
from typing import Any

import msgpack

from shoal.errors import InvalidArgument, ProtocolError, ShoalError, from_code

#: the data-path protocol version (HELLO carries it; see the docstring)
VERSION = 2
REQ_HDR = struct.Struct("<IBI")  # body_len, op, req_id
RESP_HDR = struct.Struct("<BIIIQ")  # status, req_id, epoch, meta_len, data_len
#: most file descriptors one LOCATE answer carries
MAX_FDS = 250  # SCM_MAX_FD is 253


def _limit(name: str, default: int | float) -> Any:
    """A limit, overridden by ``SHOAL_WIRE_<NAME>`` in the worker's environment (for
    tests, and for operators who know better); an unusable value keeps the default."""
    raw = os.environ.get(f"SHOAL_WIRE_{name}")
    if raw is None:
        return default
    try:
        value = type(default)(float(raw)) if isinstance(default, int) else float(raw)
    except ValueError:
        return default
    return value if value > 0 else default


# -- limits ----------------------------------------------------------------------------
#
# What a worker accepts from one peer, all checked with integer comparisons before any
# work (see shoal.worker.conn.Conn), so that no frame, however crafted, makes the
# worker buffer, allocate or loop without bound:
#
# - a request's body is at most MAX_REQUEST bytes (MAX_REQUEST_LARGE for BATCH and
#   TOUCH, which carry lists); a frame that claims more is answered with the protocol
#   error and the connection is closed before any of its body is buffered (the stream
#   cannot be resynchronised without reading it);
# - all connections together buffer at most MAX_BUFFERED bytes of incomplete frames; a
#   frame that would take more is refused the same way (``unavailable``: the client
#   tries another worker);
# - one peer (a TCP remote address; on the Unix socket, a uid) holds at most
#   CONNS_PER_PEER connections, and the worker at most MAX_CONNS (and never more than a
#   quarter of its descriptor limit: each takes two); connections past either are
#   closed at once;
# - a connection with no request in flight and no bytes received for IDLE_TIMEOUT
#   seconds is closed (a client's pool reconnects transparently);
# - a connection that has not said a good HELLO within HELLO_TIMEOUT seconds of
#   connecting is closed, and until it has, none of its frames may exceed MAX_HELLO
#   bytes (an unauthenticated peer gets no large buffers);
# - a connection whose peer sends while its request is in flight, or does not take its
#   answers, is not read until it does (the worker answers one request at a time, in
#   order), so neither requests nor answers pile up in the worker: a client that sends
#   ahead (the sync client pipelines a sequential reader's next READ) is held to what
#   the kernel buffers;
# - lists are bounded: MAX_BATCH paths per BATCH, MAX_TOUCH_ITEMS items per TOUCH,
#   MAX_TOUCH_PAGES pages bumped per TOUCH item (and 4x that per frame), MAX_AHEAD_PAGES
#   pages a LOCATE looks ahead; arguments have the types and ranges of their op, else
#   the protocol error (the frame's length is known, so the connection goes on).
#
# A refusal is logged aggregated (one line per interval, with a count). Responses are
# not capped here: they are what the worker chose to send (a READ of a whole large
# file is one answer). SHOAL_WIRE_<NAME> in the worker's environment overrides the
# limits read with _limit (tests use small ones).

MAX_REQUEST: int = _limit("MAX_REQUEST", 1 << 20)
#: a BATCH of MAX_BATCH paths of ~2 KB, or a TOUCH of MAX_TOUCH_ITEMS items of ~120 B
MAX_REQUEST_LARGE: int = _limit("MAX_REQUEST_LARGE", 8 << 20)
#: the largest request body any op may have
MAX_BODY: int = max(MAX_REQUEST, MAX_REQUEST_LARGE)
MAX_BUFFERED: int = _limit("MAX_BUFFERED", 256 << 20)
CONNS_PER_PEER: int = _limit("CONNS_PER_PEER", 1024)
MAX_CONNS: int = _limit("MAX_CONNS", 16384)
IDLE_TIMEOUT: float = _limit("IDLE_TIMEOUT", 300.0)
#: seconds a new connection has to say HELLO, and the largest frame it may send first
HELLO_TIMEOUT: float = _limit("HELLO_TIMEOUT", 10.0)
MAX_HELLO: int = _limit("MAX_HELLO", 16384)
MAX_BATCH = 4096
MAX_TOUCH_ITEMS = 65536
MAX_TOUCH_PAGES = 4096
MAX_AHEAD_PAGES = 4096


class Op(IntEnum):
    HELLO = 1
    STAT = 2
    LIST = 3
    READ = 4
    BATCH = 5
    LOCATE = 6
    TOUCH = 7
    DROP = 8
    LOCATE_DIR = 9


class Status(IntEnum):
    OK = 0
    ERR = 1


def pack(obj: Any) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def unpack(buf: bytes | bytearray | memoryview) -> Any:
    return msgpack.unpackb(buf, raw=False, use_list=True, strict_map_key=False)


def encode_request(op: Op, req_id: int, args: list[Any]) -> bytes:
    body = pack(args)
    return REQ_HDR.pack(len(body), op, req_id) + body


class Packed(bytes):
    """Response metadata already packed (kept and sent again as is)."""


def encode_response_head(
    status: Status, req_id: int, epoch: int, meta: Any, data_len: int
) -> bytes:
    m = meta if isinstance(meta, Packed) else pack(meta)
    return RESP_HDR.pack(status, req_id, epoch, len(m), data_len) + m


def encode_error(req_id: int, epoch: int, exc: ShoalError) -> bytes:
    return encode_response_head(
        Status.ERR, req_id, epoch, {"code": exc.code, "message": exc.message}, 0
    )


def decode_error(meta: Any) -> ShoalError:
    if not isinstance(meta, dict) or "code" not in meta:
        return ProtocolError("malformed error response")
    return from_code(str(meta["code"]), str(meta.get("message", "")))


def check_op(op: int) -> Op:
    try:
        return Op(op)
    except ValueError:
        raise ProtocolError(f"unknown op {op}") from None


# -- receiving ----------------------------------------------------------------------

#: ancillary space for the most descriptors one answer hands over
FD_ANC = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


#: descriptor table entries a receiving process makes room for (the client keeps up to
#: 512 handed-over descriptors, plus its own)
FD_TABLE = 1024
_roomy_pid = 0


def make_room_for_fds() -> None:
    """Grow this process's descriptor table to FD_TABLE entries, once per process (a
    forked child's table is only as large as the descriptors it inherited).

    The kernel grows the table on demand, as received descriptors need higher
    numbers, and in a process whose table another thread shares each growth waits
    for an RCU grace period (``expand_fdtable`` in Linux's fs/file.c calls
    ``synchronize_rcu()`` when ``files->count > 1``): a new reader receiving a whole
    dataset's answer (243 descriptors) waited 10-25 ms in ``recvmsg``, against
    0.4-0.6 ms once the table had grown before its threads started. Call it early,
    before the process starts threads of its own (the sync client's constructor,
    ShoalFileSystem's, before fsspec's loop thread). Never closes or moves a
    descriptor in use (``F_DUPFD`` takes the lowest free number at or above the one
    asked for); any error leaves the table to the kernel."""
    global _roomy_pid
    pid = os.getpid()
    if _roomy_pid == pid:
        return
    _roomy_pid = pid
    import fcntl
    import resource

    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        top = FD_TABLE if soft == resource.RLIM_INFINITY else min(FD_TABLE, soft)
        if top <= 64:
            return
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.close(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, top - 1))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        pass


def fds_of(anc: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors an answer handed over (SCM_RIGHTS), from ``recvmsg``'s ancillary
    data."""
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(payload[: len(payload) - (len(payload) % a.itemsize)])
            fds.extend(a)
    return fds


def recv_exactly(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from a blocking socket; EOFError when the peer closes first."""
    while view:
        n = sock.recv_into(view)
        if n == 0:
            raise EOFError("worker closed the connection")
        view = view[n:]


# -- versions ---------------------------------------------------------------------


def check_hello(version: int, where: str) -> None:
    """Raise unless the worker at ``where``, whose HELLO said ``version``, speaks this
    client's protocol version."""
    if version != VERSION:
        who = "the worker" if version < VERSION else "this client"
        raise ProtocolError(
            f"worker at {where} speaks data-path protocol {version}, this client "
            f"speaks {VERSION}: upgrade {who}"
        )


def refuse_hello(client_version: int | None) -> ProtocolError | None:
    """The worker's answer to a client of another version (None: no HELLO at all, as
    from clients of protocol 1); None when the versions match."""
    if client_version == VERSION:
        return None
    if client_version is None:
        return ProtocolError(
            f"this worker speaks data-path protocol {VERSION} and needs a HELLO first "
            "(clients of protocol 1 send none): upgrade the client"
        )
    who = "the client" if client_version < VERSION else "the worker"
    return ProtocolError(
        f"this worker speaks data-path protocol {VERSION}, the client speaks "
        f"{client_version}: upgrade {who}"
    )


#: ops whose requests may be MAX_REQUEST_LARGE
_LARGE_OPS = frozenset({5, 7})  # BATCH, TOUCH


def max_request(op: int) -> int:
    """The largest body a request of ``op`` (checked or not) may have."""
    return MAX_REQUEST_LARGE if op in _LARGE_OPS else MAX_REQUEST


_NONE = type(None)
_S: tuple[type, ...] = (str,)
_I: tuple[type, ...] = (int,)
_SN: tuple[type, ...] = (str, _NONE)
_IN: tuple[type, ...] = (int, _NONE)
_B: tuple[type, ...] = (bool,)
_L: tuple[type, ...] = (list,)
_ANY: tuple[type, ...] = (object,)

#: op -> (arguments it needs, types of each argument it knows); more are ignored
_ARGS: dict[Op, tuple[int, tuple[tuple[type, ...], ...]]] = {
    Op.HELLO: (0, (_ANY,)),
    Op.STAT: (2, (_S, _S, _IN)),
    Op.LIST: (2, (_S, _S, _IN)),
    Op.READ: (5, (_S, _S, _I, _I, _SN, _I, _IN, _B)),
    Op.BATCH: (2, (_S, _L, _IN)),
    Op.LOCATE: (5, (_S, _S, _SN, _I, _I, _B, _I, _I, _IN, _B)),
    Op.TOUCH: (2, (_S, _L)),
    Op.DROP: (4, (_S, _S, _S, _I)),
    Op.LOCATE_DIR: (2, (_S, _SN, _I, _IN, _B)),
}
#: positions of integer arguments that must not be negative (length may be -1)
_NON_NEGATIVE: dict[Op, tuple[int, ...]] = {
    Op.READ: (2, 5, 6),
    Op.LOCATE: (3, 6, 7, 8),
    Op.DROP: (3,),
    Op.LOCATE_DIR: (2, 3),
    Op.STAT: (2,),
    Op.LIST: (2,),
    Op.BATCH: (2,),
}
_LENGTH_ARG = {Op.READ: 3, Op.LOCATE: 4}
_I64 = 1 << 63


def check_args(op: Op, args: Any) -> list[Any]:
    """``args`` if they have the shape ``op`` needs (types, counts, ranges), else
    ProtocolError. Cheap (isinstance in C over the arguments, a few comparisons): it
    runs on every request."""
    if type(args) is not list:
        raise ProtocolError("request body is not a list")
    need, types = _ARGS[op]
    n = len(args)
    if n < need:
        raise ProtocolError(f"{op.name} needs {need} arguments, got {n}")
    if not all(map(isinstance, args, types)):
        for i, t in enumerate(types[:n]):
            if not isinstance(args[i], t):
                got = type(args[i]).__name__
                raise ProtocolError(f"{op.name} argument {i}: {got} not expected")
    for i in _NON_NEGATIVE.get(op, ()):
        if i < n and args[i] is not None and not 0 <= args[i] < _I64:
            raise ProtocolError(f"{op.name} argument {i}: {args[i]} out of range")
    j = _LENGTH_ARG.get(op)
    if j is not None and not -1 <= args[j] < _I64:
        raise ProtocolError(f"{op.name}: length {args[j]} out of range")
    if op == Op.BATCH:
        if len(args[1]) > MAX_BATCH:  # a caller's mistake more than a malformed frame
            raise InvalidArgument(f"batch of {len(args[1])} files: at most {MAX_BATCH}")
        for p in args[1]:
            if not isinstance(p, str):
                raise ProtocolError("BATCH paths must be strings")
    elif op == Op.TOUCH:
        items = args[1]
        if len(items) > MAX_TOUCH_ITEMS:
            raise ProtocolError(f"TOUCH of {len(items)} items: at most {MAX_TOUCH_ITEMS}")
        for it in items:
            if not (
                isinstance(it, list)
                and len(it) >= 4
                and isinstance(it[0], str)
                and isinstance(it[1], str | _NONE)
                and isinstance(it[2], int)
                and isinstance(it[3], int)
            ):
                raise ProtocolError("TOUCH items are [path, version, pages, bytes]")
    return args

"""The data path's messages (protocol v2): one frozen class per op's request and one
per reply. Each encodes to the msgpack array that goes on the wire (its fields in
declaration order) and decodes from it with types and counts checked, else
:class:`~shoal.errors.ProtocolError` (or :class:`~shoal.errors.InvalidArgument` for a
caller's mistake) with a one-line message. Frames, limits and the argument checks are
:mod:`shoal.proto.wire`'s; this module is where a message becomes bytes and bytes a
message, for worker, client and tests alike.

A request is checked whole (it comes from anyone); a reply's shape is checked (an
array of the right length and scalar types, lists of items of the right length) and
its items' values are left to the reader that unpacks them, so the client's hot path
pays a few isinstance calls in C and no per-field work.

HELLO is the one op whose shapes never change (request ``[version]`` or
``[version, token]``, reply a map with ``version``), so a client and a worker of different versions always understand each
other's HELLO (see :func:`shoal.proto.wire.check_hello` and ``refuse_hello``).
"""

from __future__ import annotations

import array
import sys
from collections.abc import Callable
from dataclasses import field, fields
from enum import IntEnum
from operator import attrgetter
from typing import Any, ClassVar, Generic, Self, TypeVar

from shoal.core.records import record
from shoal.core.types import FileInfo
from shoal.errors import ProtocolError, ShoalError, from_code
from shoal.proto import wire
from shoal.proto.wire import VERSION, Op, Packed, Status, check_args, check_op

R = TypeVar("R")
Types = tuple[tuple[type, ...], ...]

#: one TOUCH item: path, version, pages read, bytes read
TouchItem = tuple[str, str | None, int, int]
#: one LOCATE_DIR item: path, version, size, fd slot, offset, length, checksum
DirItem = tuple[str, str, int, int, int, int, int]
#: one LOCATE_DIR run, a file of several pages kept whole: path, version, size, mtime,
#: fd slot, offset of its first page (its checksums in LocateDirReply.sums)
DirRun = tuple[str, str, int, float, int, int]

_S, _I, _L, _B = (str,), (int,), (list,), (bool,)
_NUM = (int, float)
_GETTERS: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def _getter(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    names = [f.name for f in fields(cls)]
    out: Callable[[Any], tuple[Any, ...]]
    if len(names) > 1:
        out = attrgetter(*names)
    elif names:
        one = attrgetter(names[0])
        out = lambda o: (one(o),)  # noqa: E731
    else:
        out = lambda o: ()  # noqa: E731
    _GETTERS[cls] = out
    return out


class Message:
    """A message whose wire form is the array of its fields (attrgetter: C speed)."""

    __slots__ = ()

    def encode(self) -> list[Any]:
        cls = type(self)
        return list((_GETTERS.get(cls) or _getter(cls))(self))


class Request(Message, Generic[R]):
    """A request of one op: decoded with the op's argument checks (wire.check_args),
    missing trailing fields take their defaults; ``decode_reply`` reads its answer."""

    __slots__ = ()
    OP: ClassVar[Op]
    REPLY: ClassVar[Any]

    @classmethod
    def decode(cls, body: Any) -> Self:
        a = check_args(cls.OP, body)
        n = len(cls.__slots__)
        return cls(*(a if len(a) <= n else a[:n]))

    def decode_reply(self, meta: Any) -> R:
        out: R = self.REPLY.decode(meta)
        return out


class Reply(Message):
    """A reply: an array of at least len(TYPES) values of those types (then up to TAIL
    optional ones, unchecked); LISTS: the fields that are lists of items of a length."""

    __slots__ = ()
    TYPES: ClassVar[Types]
    LISTS: ClassVar[tuple[tuple[int, int], ...]] = ()
    TAIL: ClassVar[int] = 0

    @classmethod
    def decode(cls, meta: Any) -> Self:
        types = cls.TYPES
        n = len(types)
        if type(meta) is not list or len(meta) < n or not all(map(isinstance, meta, types)):
            raise ProtocolError(f"malformed {cls.__name__}: not {n} values of their types")
        for i, k in cls.LISTS:
            for it in meta[i]:
                if type(it) is not list or len(it) != k:
                    raise ProtocolError(f"malformed {cls.__name__}: an item is not {k} values")
        return cls(*meta[: n + cls.TAIL])


# -- HELLO: the same in every version -----------------------------------------------------


@record
class HelloReply(Message):
    version: int
    worker: str = ""
    node: str = ""
    epoch: int = 0

    def encode(self) -> dict[str, Any]:  # type: ignore[override]  # a map in every version
        return {"version": self.version, "worker": self.worker, "node": self.node, "epoch": self.epoch}  # fmt: skip

    @classmethod
    def decode(cls, meta: Any) -> HelloReply:
        if not isinstance(meta, dict) or type(meta.get("version")) is not int:
            raise ProtocolError("malformed HELLO reply: no protocol version")
        epoch = meta.get("epoch", 0)
        w, node = meta.get("worker", ""), meta.get("node", "")
        return cls(meta["version"], str(w), str(node), epoch if type(epoch) is int else 0)


@record
class HelloRequest(Request[HelloReply]):
    """``[version]``, or ``[version, token]`` from a client that has a cluster token (a
    worker of any version ignores fields past the version, so this stays readable
    everywhere). The token is never shown (not in repr, logs or errors)."""

    OP: ClassVar[Op] = Op.HELLO
    REPLY: ClassVar[Any] = HelloReply
    version: int = VERSION
    #: the caller's cluster token (shoal.core.tokens); "": none
    token: str = field(default="", repr=False)

    def encode(self) -> list[Any]:
        return [self.version, self.token] if self.token else [self.version]

    @classmethod
    def decode(cls, body: Any) -> HelloRequest:
        a = check_args(Op.HELLO, body)
        if not a or type(a[0]) is not int:
            raise ProtocolError("HELLO without a protocol version")
        if len(a) > 1 and a[1] is not None:
            if type(a[1]) is not str:
                raise ProtocolError("HELLO token must be a string")
            return cls(a[0], a[1])
        return cls(a[0])


# -- STAT, LIST -------------------------------------------------------------------------

_INFO: Types = (_S, _I, _S, _NUM, (bool, int))


def _info(w: Any, what: str) -> FileInfo:
    if type(w) is not list or len(w) < 5 or not all(map(isinstance, w, _INFO)):
        raise ProtocolError(f"malformed {what}: not a file entry")
    return FileInfo.from_wire(w)


@record
class StatReply(Message):
    info: FileInfo

    def encode(self) -> list[Any]:
        return self.info.to_wire()

    @classmethod
    def decode(cls, meta: Any) -> StatReply:
        return cls(_info(meta, "StatReply"))


@record
class StatRequest(Request[StatReply]):
    OP: ClassVar[Op] = Op.STAT
    REPLY: ClassVar[Any] = StatReply
    dataset: str
    path: str
    generation: int | None = None


@record
class ListReply(Message):
    entries: tuple[FileInfo, ...]

    def encode(self) -> list[Any]:
        return [e.to_wire() for e in self.entries]

    @classmethod
    def decode(cls, meta: Any) -> ListReply:
        if type(meta) is not list:
            raise ProtocolError("malformed ListReply: not a list")
        return cls(tuple(_info(w, "ListReply") for w in meta))


@record
class ListRequest(Request[ListReply]):
    OP: ClassVar[Op] = Op.LIST
    REPLY: ClassVar[Any] = ListReply
    dataset: str
    path: str
    generation: int | None = None


# -- READ -------------------------------------------------------------------------------


@record
class ReadReply(Reply):
    """The whole pages covering the range; their bytes follow as the frame's data."""

    TYPES: ClassVar[Types] = (_S, _I, _NUM, _I, _L)
    LISTS: ClassVar[tuple[tuple[int, int], ...]] = ((4, 2),)
    version: str
    size: int
    mtime: float
    #: index of the first page sent
    first: int
    #: [length, checksum] of each page sent, in order
    pages: list[list[int]]


@record
class ReadRequest(Request[ReadReply]):
    """Bytes [offset, offset+length) (length -1: to the end). ``version`` None: what the
    worker holds within the staleness bound; ``page_size`` 0: not checked."""

    OP: ClassVar[Op] = Op.READ
    REPLY: ClassVar[Any] = ReadReply
    dataset: str
    path: str
    offset: int
    length: int
    version: str | None = None
    page_size: int = 0
    generation: int | None = None
    cached_only: bool = False  #: a peer's ask (worker.peers): cached pages only, no fetch


# -- BATCH ------------------------------------------------------------------------------


class ItemStatus(IntEnum):
    """What a BATCH answer says about one of its files."""

    #: its bytes follow in the frame's data, in item order
    OK = 0
    #: reading it failed: ``code`` and ``message`` are the error (see shoal.errors)
    ERROR = 1
    #: larger than one page: not batched, read it with READ (or LOCATE)
    NOT_SMALL = 2


_STATUS = {int(s): s for s in ItemStatus}
_ITEM: Types = (_S, _I, _S, _I, _I, _S, _S)


@record
class BatchItem(Message):
    path: str
    status: ItemStatus
    version: str = ""
    size: int = 0
    checksum: int = 0
    code: str = ""
    message: str = ""

    @classmethod
    def failed(cls, path: str, exc: ShoalError) -> BatchItem:
        return cls(path, ItemStatus.ERROR, code=exc.code, message=exc.message)

    def error(self) -> ShoalError:
        """The error of an ERROR item, rebuilt from its code."""
        return from_code(self.code, self.message)

    @classmethod
    def decode(cls, it: Any) -> BatchItem:
        if type(it) is not list or len(it) != 7 or not all(map(isinstance, it, _ITEM)):
            raise ProtocolError("malformed BatchReply: an item is not 7 values of their types")
        status = _STATUS.get(it[1])
        if status is None:
            raise ProtocolError(f"malformed BatchReply: unknown item status {it[1]}")
        return cls(it[0], status, it[2], it[3], it[4], it[5], it[6])


@record
class BatchReply(Message):
    """One item per path asked, in order; the OK items' bytes follow, concatenated."""

    items: tuple[BatchItem, ...]

    def encode(self) -> list[Any]:
        return [[it.encode() for it in self.items]]

    @classmethod
    def decode(cls, meta: Any) -> BatchReply:
        if type(meta) is not list or len(meta) < 1 or type(meta[0]) is not list:
            raise ProtocolError("malformed BatchReply: no list of items")
        return cls(tuple(BatchItem.decode(it) for it in meta[0]))


@record
class BatchRequest(Request[BatchReply]):
    """Whole small files (at most ``wire.MAX_BATCH``)."""

    OP: ClassVar[Op] = Op.BATCH
    REPLY: ClassVar[Any] = BatchReply
    dataset: str
    paths: tuple[str, ...]
    generation: int | None = None

    @classmethod
    def decode(cls, body: Any) -> BatchRequest:
        a = check_args(Op.BATCH, body)
        return cls(a[0], tuple(a[1]), a[2] if len(a) > 2 else None)


# -- LOCATE, LOCATE_DIR -----------------------------------------------------------------


@record
class LocateReply(Reply):
    """Where the pages are on the worker's disk; descriptors ride along (SCM_RIGHTS)."""

    TYPES: ClassVar[Types] = (_S, _I, _NUM, _I, _L, _L, _B)
    LISTS: ClassVar[tuple[tuple[int, int], ...]] = ((4, 4), (5, 2))
    #: stamps, run, sums: older workers send none, older readers drop them (a reader
    #: checks their shapes itself before it uses them)
    TAIL: ClassVar[int] = 3
    version: str = ""
    size: int = 0
    mtime: float = 0.0
    first: int = 0
    #: [fd slot, offset, length, checksum] per page; slot -1: read it with READ
    pages: list[list[int]] = field(default_factory=list)
    #: [st_dev, st_ino] of each handed-over descriptor, in SCM_RIGHTS order
    fds: list[list[int]] = field(default_factory=list)
    #: a cached-only LOCATE of a file that is not (wholly) cached
    miss: bool = False
    stamps: list[int] = field(default_factory=list)  #: per fd: ctime_ns of its pages' check
    #: asked for ``runs`` and the file is kept whole in one data file: [fd slot, offset
    #: of page ``first``, first, count], its pages back to back from there (``pages``
    #: is then empty); [] otherwise
    run: list[int] = field(default_factory=list)
    #: the run's page checksums, little-endian u64s in page order
    sums: bytes = b""


def pack_sums(sums: list[int]) -> bytes:
    """A run's page checksums as LocateReply.sums carries them (little-endian u64s)."""
    out = array.array("Q", sums)
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def unpack_sums(raw: bytes) -> array.array[int]:
    """LocateReply.sums back into checksums (a length that is a multiple of 8)."""
    out = array.array("Q")
    out.frombytes(raw)
    if sys.byteorder != "little":
        out.byteswap()
    return out


@record
class LocateRequest(Request[LocateReply]):
    """Locations of [offset, offset+length), plus up to ``ahead`` bytes of already
    cached pages after it; ``cached_only``: never fetch (answer a miss instead)."""

    OP: ClassVar[Op] = Op.LOCATE
    REPLY: ClassVar[Any] = LocateReply
    dataset: str
    path: str
    version: str | None
    offset: int
    length: int
    cached_only: bool = False
    ahead: int = 0
    page_size: int = 0
    generation: int | None = None
    #: the reader takes a file kept whole as one run (LocateReply.run), all of it
    runs: bool = False


@record
class LocateDirReply(Reply):
    """Cached small files of a directory (or dataset) and, asked for ``runs``, some of
    its files of several pages kept whole, each as one run; descriptors ride along."""

    TYPES: ClassVar[Types] = (_L, _L, _B)
    LISTS: ClassVar[tuple[tuple[int, int], ...]] = ((0, 7), (1, 2))
    #: runs, sums, runs_full, stamps: empty unless the reader asked for runs (older
    #: readers drop them; a reader checks their shapes itself before it uses them)
    TAIL: ClassVar[int] = 4
    items: list[DirItem] = field(default_factory=list)
    fds: list[list[int]] = field(default_factory=list)
    #: False when descriptors ran out and some cached small files were left out (runs
    #: are best effort: a file left out of them is located by itself)
    full: bool = False
    runs: list[DirRun] = field(default_factory=list)
    #: every run's page checksums, run after run, as LocateReply.sums
    sums: bytes = b""
    #: every cached file of several pages kept whole is in ``runs`` (False: some were
    #: left out, past the limits; a reader of a whole dataset's answer then asks for
    #: its directories' too)
    runs_full: bool = True
    #: per fd: the ctime_ns at which the worker checked every run page in it, or 0
    stamps: list[int] = field(default_factory=list)

    def encode_unstamped(self) -> bytes:
        """The packed answer without its stamps, kept by a worker between requests
        (the stamps change as its checks finish): :func:`with_stamps` completes it."""
        return wire.pack(self.encode()[:-1])


def with_stamps(unstamped: bytes, stamps: list[int]) -> Packed:
    """A LocateDirReply packed by ``encode_unstamped`` with ``stamps`` appended: the
    array's one-byte header (a fixarray of 6) counts one more field."""
    if unstamped[:1] != b"\x96":  # msgpack fixarray of 6
        raise ValueError("not a LocateDirReply packed without its stamps")
    return Packed(b"\x97" + unstamped[1:] + wire.pack(stamps))


@record
class LocateDirRequest(Request[LocateDirReply]):
    """``directory`` None: the whole dataset's cached small files, if few enough."""

    OP: ClassVar[Op] = Op.LOCATE_DIR
    REPLY: ClassVar[Any] = LocateDirReply
    dataset: str
    directory: str | None
    page_size: int = 0
    generation: int | None = None
    #: the reader takes files of several pages as runs (LocateDirReply.runs)
    runs: bool = False


# -- TOUCH, DROP ------------------------------------------------------------------------


@record
class Done(Reply):
    """The empty answer of TOUCH and DROP."""

    TYPES: ClassVar[Types] = ()


DONE = Done()


@record
class TouchRequest(Request[Done]):
    """Hits a client served itself (short circuit): stats and recency on the worker."""

    OP: ClassVar[Op] = Op.TOUCH
    REPLY: ClassVar[Any] = Done
    dataset: str
    items: tuple[TouchItem, ...]

    @classmethod
    def decode(cls, body: Any) -> TouchRequest:
        a = check_args(Op.TOUCH, body)
        return cls(a[0], tuple((it[0], it[1], it[2], it[3]) for it in a[1]))


@record
class DropRequest(Request[Done]):
    """A reader saw a bad checksum on this page (the worker checks it again itself)."""

    OP: ClassVar[Op] = Op.DROP
    REPLY: ClassVar[Any] = Done
    dataset: str
    path: str
    version: str
    index: int


# -- frames -----------------------------------------------------------------------------

#: every request that names a dataset (all but HELLO)
DataRequest = StatRequest | ListRequest | ReadRequest | BatchRequest | LocateRequest | TouchRequest | DropRequest | LocateDirRequest  # fmt: skip
AnyRequest = HelloRequest | DataRequest
AnyReply = HelloReply | StatReply | ListReply | ReadReply | BatchReply | LocateReply | LocateDirReply | Done  # fmt: skip
#: op -> its request class
REQUESTS: dict[Op, Any] = {c.OP: c for c in (HelloRequest, StatRequest, ListRequest, ReadRequest, BatchRequest, LocateRequest, TouchRequest, DropRequest, LocateDirRequest)}  # fmt: skip


def encode_request(req: Request[Any], req_id: int) -> bytes:
    return wire.encode_request(req.OP, req_id, req.encode())


def decode_request(op: int, body: bytes | bytearray | memoryview) -> AnyRequest:
    """The request in a frame's body; ProtocolError (InvalidArgument for a batch too
    large) if it is not one."""
    kind = check_op(op)
    try:
        args = wire.unpack(body)
    except Exception as exc:  # any msgpack failure: extra data, a bad type byte, ...
        raise ProtocolError(f"bad {kind.name} body: {type(exc).__name__}") from None
    req: AnyRequest = REQUESTS[kind].decode(args)
    return req


def encode_reply(req_id: int, epoch: int, reply: AnyReply | Packed, data_len: int = 0) -> bytes:
    """The head of an OK response; its data (``data_len`` bytes) follows."""
    meta = reply if isinstance(reply, Packed) else reply.encode()
    return wire.encode_response_head(Status.OK, req_id, epoch, meta, data_len)


def decode_reply(req: Request[R], status: int, meta: bytes | bytearray | memoryview) -> R:
    """The reply to ``req`` in a response's meta; the worker's error raised if it
    answered with one."""
    try:
        m = wire.unpack(meta) if meta else None
    except Exception as exc:
        raise ProtocolError(f"bad {req.OP.name} reply: {type(exc).__name__}") from None
    if status != Status.OK:
        raise wire.decode_error(m)
    return req.decode_reply(m)


def decode_request_frame(frame: bytes) -> tuple[int, AnyRequest]:
    """(req_id, request) of one whole request frame."""
    hdr = wire.REQ_HDR.size
    if len(frame) < hdr:
        raise ProtocolError(f"truncated frame: {len(frame)} bytes, the header alone is {hdr}")
    body_len, op, req_id = wire.REQ_HDR.unpack_from(frame)
    if len(frame) != hdr + body_len:
        raise ProtocolError(f"truncated frame: {len(frame) - hdr} of {body_len} body bytes")
    return req_id, decode_request(op, memoryview(frame)[hdr:])


def decode_response_frame(req: Request[R], frame: bytes) -> tuple[int, int, R, bytes]:
    """(req_id, epoch, reply, data) of one whole response frame to ``req``; the worker's
    error raised if it answered with one."""
    hdr = wire.RESP_HDR.size
    if len(frame) < hdr:
        raise ProtocolError(f"truncated frame: {len(frame)} bytes, the header alone is {hdr}")
    status, req_id, epoch, meta_len, data_len = wire.RESP_HDR.unpack_from(frame)
    if len(frame) != hdr + meta_len + data_len:
        raise ProtocolError(
            f"truncated frame: {len(frame) - hdr} of {meta_len + data_len} bytes after its header"
        )
    reply = decode_reply(req, status, frame[hdr : hdr + meta_len])
    return req_id, epoch, reply, frame[hdr + meta_len :]

"""The data-path protocol between clients and workers (version 1).

Length-prefixed binary frames over TCP or a Unix socket; one request in flight per
connection (clients pool connections for concurrency), so frames need no reordering.

Request::

    u32 body_len | u8 op | u32 req_id | body (msgpack array of the op's arguments)

Response::

    u8 status | u32 req_id | u32 epoch | u32 meta_len | u64 data_len | meta | data

``status`` is OK or ERR; an ERR's meta is ``{"code", "message"}`` (see shoal.errors).
``epoch`` is the worker's ring epoch: a client holding an older ring refreshes it.
``meta`` is msgpack; ``data`` is raw bytes (sent with sendfile where possible).
On a Unix socket a LOCATE response carries open file descriptors (SCM_RIGHTS) in the
same ``sendmsg`` as the response header, so a local client reads cached bytes with
``pread`` and no copy passes through the worker.

Ops and their arguments / response meta:

=========  ==========================================  =========================================
op         request args                                response meta (data)
=========  ==========================================  =========================================
HELLO      [version]                                   {version, worker, node, epoch}
STAT       [dataset, path, generation]                 FileInfo wire list
LIST       [dataset, path, generation]                 [FileInfo wire list, ...]
READ       [dataset, path, offset, length, version,    {v, size, first, pages: [[len, ck]...]}
           page_size, generation]
                                                       (the whole pages covering the range)
BATCH      [dataset, [path, ...], generation]          {items: [[path, code, v, size, ck]...]}
                                                       (the small files, concatenated)
LOCATE     [dataset, path, version, offset, length,    {v, size, first, pages:
           cached_only, ahead, page_size, generation]
                                                       [[fd_slot, offset, len, ck]...],
                                                       fds: [[dev, ino], ...]} + SCM_RIGHTS
TOUCH      [dataset, [[path, v, pages, bytes]...]]     {} (hits served by short circuit)
DROP       [dataset, path, version, index]             {} (a reader saw a bad checksum)
LOCATE_DIR [dataset, directory, page_size,             {items: [[path, v, size, fd_slot,
           generation]                                 offset, len, ck]...], fds, full}
                                                       + SCM_RIGHTS (cached small files of a
                                                       directory; directory None: of the whole
                                                       dataset, if it is small enough)
=========  ==========================================  =========================================

``version`` None means "whatever the worker holds within the dataset's staleness bound".
``page_size`` is the page layout the reader slices the answer with (0 or absent: not
checked); a worker that serves the dataset with another page size (its policy changed)
first refreshes its definitions, then answers the error ``stale_layout``
(:class:`~shoal.errors.StaleLayout`) and the reader refreshes its own and retries, so a
reader never mixes two layouts. ``generation`` is the dataset generation the reader
knows (absent: not checked); a worker that knows an older one (a sync or policy change
it has not heard of yet) refreshes its definitions before it answers, so a reader that
saw a sync is never answered from the old manifest.
Paths are '<mount>/<relative path>' inside the dataset.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any

import msgpack

from shoal.errors import ProtocolError, ShoalError, from_code

VERSION = 1
REQ_HDR = struct.Struct("<IBI")  # body_len, op, req_id
RESP_HDR = struct.Struct("<BIIIQ")  # status, req_id, epoch, meta_len, data_len
MAX_BODY = 64 << 20
#: most file descriptors one LOCATE answer carries
MAX_FDS = 250  # SCM_MAX_FD is 253


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

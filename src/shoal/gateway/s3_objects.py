"""HeadObject and GetObject: conditions, ranges and the body.

Metadata comes from the client's cache (manifest or file info within the dataset's
staleness bound): a warm GET makes no master and no worker metadata round trip (and,
its pages located on a local worker, awaits nothing: ``read_fast``, ``stat_fast``), and a
cold whole-object GET reads before it stats (:func:`_read_first`), so that it costs one
GET at the store, not a HEAD and a GET. The body goes out one of three ways:

- up to :data:`SMALL` bytes: one ``client.read`` (from the located pages of a local
  worker: a pread in this process) and one write;
- a complete large file on a local worker: its descriptor (``open_local``, kept a few
  seconds for the object's next ranged GETs: ``LocalFiles``) and
  ``sendfile`` (:func:`shoal.gateway.server.send_file_range`); a file found
  incomplete there is asked for again only every :data:`PROBE_EVERY` GETs
  (:class:`Probes`);
- otherwise ``client.read`` in :data:`CHUNK` ranges, :data:`READ_AHEAD` of them in
  flight while one is written.

The ETag (:func:`shoal.gateway.s3_xml.etag_of` of the file version) is the same on
HEAD, GET and listings. No x-amz-checksum-* header is ever sent (botocore checks them
on every GET, ranged ones included), and bodies are never compressed.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from shoal.errors import IsADirectory, NotFound, ShoalError
from shoal.gateway.s3_xml import S3Error, etag_of, http_date, parse_http_date
from shoal.gateway.server import send_file_range

if TYPE_CHECKING:
    from shoal.gateway.s3 import Ctx, S3Gateway

log = logging.getLogger("shoal.gateway.s3")

#: bodies up to this size are read in one piece
SMALL = 4 << 20
#: the range of each read of a streamed body
CHUNK = 8 << 20
#: ranges read ahead of the one being written
READ_AHEAD = 3
#: files at least this large are looked for on a local worker for sendfile
LOCAL_MIN = 8 << 20
#: of the large GETs of a file version found incomplete on the local worker, every
#: how many looks for it there again (:class:`Probes`)
PROBE_EVERY = 16

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, length) of a satisfiable single range; None to send the whole object
    (no header, a malformed one, several ranges, or an empty object); S3Error 416 for
    an unsatisfiable one."""
    if not header:
        return None
    m = _RANGE.fullmatch(header.strip())
    if m is None or (not m[1] and not m[2]) or size == 0:
        return None
    if not m[1]:
        n = int(m[2])
        if n == 0:
            raise _unsatisfiable(size)
        start = max(0, size - n)
        return start, size - start
    start = int(m[1])
    end = int(m[2]) if m[2] else size - 1
    if m[2] and end < start:
        return None  # syntactically invalid: ignored (RFC 9110)
    if start >= size:
        raise _unsatisfiable(size)
    return start, min(end, size - 1) - start + 1


def _unsatisfiable(size: int) -> S3Error:
    return S3Error(
        "InvalidRange",
        "The requested range is not satisfiable",
        416,
        {"Content-Range": f"bytes */{size}"},
    )


def _tags(header: str) -> list[str]:
    out = []
    for t in header.split(","):
        t = t.strip()
        if t.startswith("W/"):
            t = t[2:]
        out.append(t.strip('"'))
    return out


def conditions(headers: Mapping[str, str], etag: str, mtime: float) -> int | None:
    """412 or 304 when a condition stops the request (RFC 7232 order), else None."""
    bare = etag.strip('"')
    im = headers.get("If-Match")
    if im is not None:
        tags = _tags(im)
        if "*" not in tags and bare not in tags:
            return 412
    elif (ius := headers.get("If-Unmodified-Since")) is not None:
        t = parse_http_date(ius)
        if t is not None and int(mtime) > t:
            return 412
    inm = headers.get("If-None-Match")
    if inm is not None:
        tags = _tags(inm)
        if "*" in tags or bare in tags:
            return 304
    elif (ims := headers.get("If-Modified-Since")) is not None:
        t = parse_http_date(ims)  # (asked only when sent: a failed parse raises inside)
        if t is not None and int(mtime) <= t:
            return 304
    return None


async def get_object(gw: S3Gateway, ctx: Ctx, head: bool) -> web.StreamResponse:
    ctx.op = "HeadObject" if head else "GetObject"
    gw.check_read(ctx)
    client = gw.client
    first = None
    if not head:
        first = _read_first_fast(ctx, client.read_fast)
        if first is None:
            first = await _read_first(gw, ctx)
    # read, then stat (the order _read_first explains): warm, both answer from this
    # process's caches with no await, the same entry the read was served by
    info = client.stat_fast(ctx.path) or await client.stat(ctx.path)
    if info.is_dir:
        raise NotFound(f"{ctx.key}: no such key")
    etag = etag_of(info.version)
    headers = {
        "ETag": etag,
        "Last-Modified": http_date(info.mtime),
        "Accept-Ranges": "bytes",
        "Content-Type": "binary/octet-stream",
        "x-amz-request-id": ctx.request_id,
    }
    for param, name in _OVERRIDES.items():
        if param in ctx.query:
            headers[name] = ctx.query[param]
    stop = conditions(ctx.request.headers, etag, info.mtime)
    if stop == 412:
        raise S3Error("PreconditionFailed", "At least one of the preconditions failed", 412)
    if stop == 304:
        headers.pop("Content-Type")
        return web.Response(status=304, headers=headers)
    rng = parse_range(ctx.request.headers.get("Range"), info.size)
    start, length = rng if rng is not None else (0, info.size)
    status = 200
    if rng is not None:
        status = 206
        headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{info.size}"
    request = ctx.request
    if head:
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = length
        await resp.prepare(request)
        await resp.write_eof()
        return resp
    if length <= SMALL:
        if first is not None and rng is None and len(first) == info.size:
            data = first
        else:
            data = await gw.client.read(ctx.path, start, length) if length else b""
        ctx.nbytes = len(data)
        return web.Response(status=status, body=data, headers=headers)
    fd = None
    if info.size >= LOCAL_MIN and gw.probes.due(ctx.path, info.version):
        fd = await gw.local.open(ctx.path, info.version, info.size)
        if fd is None:
            gw.probes.missed(ctx.path, info.version)
    resp = web.StreamResponse(status=status, headers=headers)
    resp.content_length = length
    try:
        await resp.prepare(request)
        if fd is not None:
            ctx.nbytes = await send_file_range(request, resp, fd, start, length)
        else:
            ctx.nbytes = await _stream(gw, ctx, resp, start, length)
        await resp.write_eof()
    except (ShoalError, OSError) as exc:
        # the status line is out: the only way left to say "failed" is to cut the body
        log.warning("s3 gateway: GetObject of %s cut after %d bytes: %s", ctx.key, ctx.nbytes, exc)
        if request.transport is not None:
            request.transport.close()
        raise ConnectionResetError("body cut") from None
    finally:
        if fd is not None:
            os.close(fd)
    return resp


class Probes:
    """Which file versions were found incomplete on the local worker lately
    (``open_local`` answered None): of the large GETs of such a version, only every
    :data:`PROBE_EVERY`-th asks again. Why: a cold large object is read in many ranged
    GETs (boto3's transfer manager: 8 MiB parts, 16 in flight), and each one asked the
    worker for the whole file before its own read -- a round trip and worker CPU per
    part, answered "incomplete" until the last page landed (and always, for a file
    whose pages do not share one data file). A GET that skips the probe streams the
    same bytes from the pages, so a file that completes meanwhile is only sent with
    ``sendfile`` a few GETs later."""

    def __init__(self, every: int = PROBE_EVERY, limit: int = 4096) -> None:
        self._every = every
        self._limit = limit
        #: (path, version) -> GETs that skipped the probe since it missed, oldest first
        self._skipped: dict[tuple[str, str], int] = {}

    def due(self, path: str, version: str) -> bool:
        """Whether this GET asks the local worker for the whole file."""
        key = (path, version)
        n = self._skipped.get(key)
        if n is None:
            return True
        if n + 1 >= self._every:
            del self._skipped[key]
            return True
        self._skipped[key] = n + 1
        return False

    def missed(self, path: str, version: str) -> None:
        """The probe of this version found it incomplete."""
        skipped = self._skipped
        skipped.pop((path, version), None)
        skipped[(path, version)] = 0
        if len(skipped) > self._limit:  # bounded: the oldest go first
            del skipped[next(iter(skipped))]


def _read_first_fast(ctx: Ctx, read_fast: Callable[[str, int, int], bytes | None]) -> bytes | None:
    """:func:`_read_first` when the file's pages are located on a local worker: a
    ``pread`` with no await (``AsyncClient.read_fast``); None: ask :func:`_read_first`.
    A warm 100 KB GET is mostly per-request CPU in this process, and the awaited read
    and stat (path resolution, coroutines) were a tenth of it."""
    if "Range" in ctx.request.headers:
        return None
    return read_fast(ctx.path, 0, SMALL)


async def _read_first(gw: S3Gateway, ctx: Ctx) -> bytes | None:
    """A whole-object GET reads first and stats after: the worker's read of a file it
    does not know brings the file's info with its first page (one GET at the store),
    and the client remembers that info, so the stat then answers from the client's
    cache. Stat first, a cold GET would cost a HEAD at the store and a worker round
    trip more (measured: cold 100 KB GETs at 0.3-0.5x a direct GET). Warm, both answer
    from the cache in either order. The first :data:`SMALL` bytes, or None (a ranged
    GET, or no such file: the stat then says so in S3's terms); other errors are the
    GET's."""
    if "Range" in ctx.request.headers:
        return None
    try:
        return await gw.client.read(ctx.path, 0, SMALL)
    except (NotFound, IsADirectory):
        return None


async def _stream(
    gw: S3Gateway, ctx: Ctx, resp: web.StreamResponse, start: int, length: int
) -> int:
    """``client.read`` in CHUNK ranges, READ_AHEAD of them in flight while one is
    written (a cold object is then fetched by its owners in parallel)."""
    end, pos, sent = start + length, start, 0
    read = gw.client.read
    ahead: collections.deque[asyncio.Task[bytes]] = collections.deque()
    try:
        while sent < length:
            while pos < end and len(ahead) < READ_AHEAD:
                n = min(CHUNK, end - pos)
                ahead.append(asyncio.ensure_future(read(ctx.path, pos, n)))
                pos += n
            data = await ahead.popleft()
            await resp.write(data)
            sent += len(data)
    finally:
        for task in ahead:
            task.cancel()
    return sent

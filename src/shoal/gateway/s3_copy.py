"""CopyObject and DeleteObjects through the S3 gateway (writable datasets only).

CopyObject (PUT with ``x-amz-copy-source``) reads the source through the cache (so a
cached source costs no store GET), spools it and writes it through like a PutObject;
the source may be in any dataset the caller may read, the target must be writable.
S3's copy conditions (``x-amz-copy-source-if-*``) apply to the source; copying an
object onto itself is refused unless ``x-amz-metadata-directive: REPLACE`` (S3's rule:
it would change nothing). Copies are limited to S3's 5 GiB.

UploadPartCopy (an UploadPart with ``x-amz-copy-source``) reads its source the same
way, all of it or the ``x-amz-copy-source-range: bytes=first-last`` the caller names
(a malformed range is InvalidArgument, one past the source's end InvalidRange), into
the upload's part (:mod:`shoal.gateway.s3_multipart`).

DeleteObjects (POST ``?delete``) removes up to 1000 keys, then makes all of them
visible with one sync job (not one per key); each key's outcome is its own
``<Deleted>`` or ``<Error>`` entry, and ``<Quiet>`` leaves out the deleted ones.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

import xxhash
from aiohttp import web

from shoal.core.types import FileInfo
from shoal.errors import NotFound, ShoalError
from shoal.gateway.s3_objects import CHUNK, conditions
from shoal.gateway.s3_writes import MAX_PUT, small_body, xml_response
from shoal.gateway.s3_xml import (
    S3Error,
    doc,
    el,
    els,
    etag_of,
    from_shoal,
    iso_date,
    local_name,
    parse_xml,
)

if TYPE_CHECKING:
    from shoal.gateway.s3 import Ctx, S3Gateway

#: keys of one DeleteObjects request (S3's limit)
MAX_DELETE_KEYS = 1000
#: bytes of a DeleteObjects body (1000 keys of 1024 bytes, with room for the XML)
MAX_DELETE_BODY = 2 << 20
_COPY_RANGE = re.compile(r"bytes=([0-9]+)-([0-9]+)")

_COPY_CONDITIONS = {
    "x-amz-copy-source-if-match": "If-Match",
    "x-amz-copy-source-if-none-match": "If-None-Match",
    "x-amz-copy-source-if-modified-since": "If-Modified-Since",
    "x-amz-copy-source-if-unmodified-since": "If-Unmodified-Since",
}


def copy_source(header: str) -> tuple[str, str]:
    """``(bucket, key)`` of an ``x-amz-copy-source`` header: ``bucket/key`` or
    ``/bucket/key``, percent-encoded, optionally ``?versionId=`` (only the current
    version exists here, so a version id is refused)."""
    raw, _, query = header.partition("?")
    if query:
        raise S3Error("NotImplemented", "copying a version other than the current one", 501)
    bucket, _, key = unquote(raw).lstrip("/").partition("/")
    if not bucket or not key:
        raise S3Error("InvalidArgument", "x-amz-copy-source must be bucket/key", 400)
    return bucket, key


async def _source(gw: S3Gateway, ctx: Ctx) -> tuple[str, FileInfo]:
    """The copy source's shoal path and FileInfo, once the caller may read it and
    its ``x-amz-copy-source-if-*`` conditions hold."""
    from shoal.gateway.s3 import check_key

    h = ctx.request.headers
    bucket, key = copy_source(h["x-amz-copy-source"])
    check_key(key)
    gw.check_read_of(ctx, bucket)
    src = f"/{bucket}/{key}"
    info = await gw.client.stat(src)
    if info.is_dir:
        raise NotFound(f"{key}: no such key")
    wanted = {plain: h[name] for name, plain in _COPY_CONDITIONS.items() if name in h}
    if conditions(wanted, etag_of(info.version), info.mtime) is not None:
        raise S3Error("PreconditionFailed", "At least one of the preconditions failed", 412)
    return src, info


async def _read_into(gw: S3Gateway, src: str, dest: Path, first: int, n: int) -> str:
    """``n`` bytes of ``src`` from ``first``, read through the cache, into ``dest``;
    the xxh128 hex of them."""
    digest = xxhash.xxh128()
    with open(dest, "wb") as f:
        pos, end = first, first + n
        while pos < end:
            data = await gw.client.read(src, pos, min(CHUNK, end - pos))
            if not data:
                raise S3Error("InternalError", "the copy source ended early", 500)
            f.write(data)
            digest.update(data)
            pos += len(data)
    return digest.hexdigest()


async def copy_object(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    ctx.op = "CopyObject"
    gw.check_write(ctx)
    h = ctx.request.headers
    bucket, key = copy_source(h["x-amz-copy-source"])
    replace = h.get("x-amz-metadata-directive", "COPY").upper() == "REPLACE"
    if (bucket, key) == (ctx.bucket, ctx.key) and not replace:
        raise S3Error(
            "InvalidRequest",
            "This copy request is illegal because it is trying to copy an object to itself "
            "without changing the object's metadata",
            400,
        )
    src, info = await _source(gw, ctx)
    if info.size > MAX_PUT:
        raise S3Error("InvalidRequest", f"the copy source is larger than {MAX_PUT} bytes", 400)
    spool = gw.uploads.spool_file()
    try:
        await _read_into(gw, src, spool, 0, info.size)
        ctx.nbytes = info.size
        written = await gw.writer.put_file(ctx.path, str(spool))
    finally:
        spool.unlink(missing_ok=True)
    body = els([("LastModified", iso_date(written.mtime)), ("ETag", etag_of(written.version))])
    return xml_response(doc("CopyObjectResult", body))


def copy_range(header: str | None, size: int) -> tuple[int, int]:
    """``(first, count)`` of an ``x-amz-copy-source-range`` (None: the whole source)."""
    if header is None:
        return 0, size
    m = _COPY_RANGE.fullmatch(header.strip())
    if m is None or int(m[1]) > int(m[2]):
        raise S3Error(
            "InvalidArgument",
            "x-amz-copy-source-range must be bytes=first-last, first <= last",
            400,
        )
    first, last = int(m[1]), int(m[2])
    if last >= size:
        raise S3Error("InvalidRange", f"the range is not within the source's {size} bytes", 416)
    return first, last - first + 1


async def copy_part(gw: S3Gateway, ctx: Ctx, dest: Path) -> tuple[str, int]:
    """UploadPartCopy's bytes into ``dest``: (xxh128 hex of them, their size)."""
    src, info = await _source(gw, ctx)
    first, n = copy_range(ctx.request.headers.get("x-amz-copy-source-range"), info.size)
    if n > MAX_PUT:
        raise S3Error("InvalidRequest", f"a part is at most {MAX_PUT} bytes: copy a range", 400)
    digest = await _read_into(gw, src, dest, first, n)
    ctx.nbytes = n
    return digest, n


def parse_delete(body: bytes) -> tuple[list[str], bool]:
    """The keys of a DeleteObjects body and its Quiet flag, or MalformedXML."""
    root = parse_xml(body, "Delete")
    keys: list[str] = []
    quiet = False
    for child in root:
        name = local_name(child.tag)
        if name == "Quiet":
            quiet = (child.text or "").strip().lower() == "true"
        elif name == "Object":
            fields = {local_name(c.tag): c.text or "" for c in child}
            if "Key" not in fields:
                raise S3Error("MalformedXML", "an Object needs a Key", 400)
            keys.append(fields["Key"])
    if not keys:
        raise S3Error("MalformedXML", "Delete names no objects", 400)
    if len(keys) > MAX_DELETE_KEYS:
        raise S3Error("MalformedXML", f"at most {MAX_DELETE_KEYS} keys per request", 400)
    return keys, quiet


async def delete_objects(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    from shoal.gateway.s3 import check_key

    ctx.op = "DeleteObjects"
    gw.check_write(ctx)
    raw = await small_body(ctx, MAX_DELETE_BODY)
    md5 = ctx.request.headers.get("Content-MD5")
    if md5 is not None:
        got = base64.b64encode(hashlib.md5(raw, usedforsecurity=False).digest()).decode()
        if got != md5.strip():
            raise S3Error("BadDigest", "The Content-MD5 you specified did not match", 400)
    keys, quiet = parse_delete(raw)
    refused: dict[str, S3Error] = {}
    paths: dict[str, str] = {}
    for key in keys:
        try:
            check_key(key)
        except S3Error as exc:
            refused[key] = exc
        except ShoalError as exc:
            refused[key] = from_shoal(exc)
        else:
            paths[key] = f"/{ctx.bucket}/{key}"
    outcome = await gw.writer.delete_many(list(paths.values())) if paths else {}
    out = ""
    for key in dict.fromkeys(keys):
        err = refused.get(key)
        if err is None and key in paths:
            failed = outcome.get(paths[key])
            err = from_shoal(failed) if failed is not None else None
        if err is not None:
            out += "<Error>" + els([("Key", key), ("Code", err.code), ("Message", err.message)]) + "</Error>"  # fmt: skip
        elif not quiet:
            out += "<Deleted>" + el("Key", key) + "</Deleted>"
    return xml_response(doc("DeleteResult", out))

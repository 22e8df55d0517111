"""Writes through the S3 gateway, for checkpoints: PutObject (plain, aws-chunked
signed or STREAMING-UNSIGNED-PAYLOAD-TRAILER) and DeleteObject, and the body helpers
the other writes share (multipart upload: :mod:`shoal.gateway.s3_multipart`, where
its state lives so that any gateway replica continues an upload; CopyObject,
UploadPartCopy and DeleteObjects: :mod:`shoal.gateway.s3_copy`).

A body is spooled to a file while it arrives (decoded from aws-chunked, its declared
SHA-256 / Content-MD5 checked), then written through to the dataset's under store by
:class:`shoal.client.writes.Writer`, which also makes the new version visible (sync
of that key, then the client forgets it).
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash
from aiohttp import web

from shoal.gateway.chunked import AwsChunkedDecoder
from shoal.gateway.s3_xml import (
    S3Error,
    etag_of,
)
from shoal.gateway.sigv4 import payload_check

if TYPE_CHECKING:
    from shoal.gateway.s3 import Ctx, S3Gateway

#: S3's limit of one PUT (and of one part)
MAX_PUT = 5 << 30
_HEX64 = frozenset("0123456789abcdef")


async def receive_body(ctx: Ctx, dest: Path, limit: int) -> tuple[str, int]:
    """Spool the request body (decoded) to ``dest``; (xxh128 hex of it, size)."""
    h = ctx.request.headers
    v = ctx.verified
    declared = v.payload if v is not None else h.get("x-amz-content-sha256", "")
    chunked = declared.startswith("STREAMING-") or "aws-chunked" in h.get("Content-Encoding", "")
    want = h.get("x-amz-decoded-content-length") if chunked else h.get("Content-Length")
    if want is not None and want.isdigit() and int(want) > limit:
        raise S3Error("EntityTooLarge", f"the body is larger than {limit} bytes", 400)
    decoder = None
    if chunked:
        algo = h.get("x-amz-trailer") or h.get("x-amz-sdk-checksum-algorithm")
        n = int(want) if want is not None and want.isdigit() else None
        decoder = AwsChunkedDecoder(v, decoded_length=n, checksum=algo)
    check_sha = v is not None and not chunked and len(declared) == 64 and set(declared) <= _HEX64
    sha = hashlib.sha256() if check_sha else None
    md5 = hashlib.md5(usedforsecurity=False) if "Content-MD5" in h else None
    digest = xxhash.xxh128()
    size = 0
    with open(dest, "wb") as f:
        async for chunk in ctx.request.content.iter_any():
            data = decoder.feed(chunk) if decoder is not None else chunk
            size += len(data)
            if size > limit:
                raise S3Error("EntityTooLarge", f"the body is larger than {limit} bytes", 400)
            if sha is not None:
                sha.update(data)
            if md5 is not None:
                md5.update(data)
            digest.update(data)
            f.write(data)
    if decoder is not None:
        decoder.finish()
    if chunked and want is not None and want.isdigit() and int(want) != size:
        raise S3Error("IncompleteBody", "the body is shorter than its declared length", 400)
    if v is not None and sha is not None:
        payload_check(v, sha.hexdigest())
    if (
        md5 is not None
        and base64.b64encode(md5.digest()).decode() != h.get("Content-MD5", "").strip()
    ):
        raise S3Error("BadDigest", "The Content-MD5 you specified did not match", 400)
    ctx.nbytes = size
    return digest.hexdigest(), size


async def put_object(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    ctx.op = "PutObject"
    gw.check_write(ctx)
    spool = gw.uploads.spool_file()
    try:
        _, size = await receive_body(ctx, spool, MAX_PUT)
        if ctx.key.endswith("/"):
            if size:
                raise S3Error("InvalidArgument", "a key ending in '/' names a folder", 400)
            # a folder marker: shoal's namespace has folders without objects
            return web.Response(headers={"ETag": '"d41d8cd98f00b204e9800998ecf8427e"'})
        info = await gw.writer.put_file(ctx.path, str(spool))
    finally:
        spool.unlink(missing_ok=True)
    return web.Response(headers={"ETag": etag_of(info.version)})


async def delete_object(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    ctx.op = "DeleteObject"
    gw.check_write(ctx)
    await gw.writer.delete(ctx.path)
    return web.Response(status=204)


async def small_body(ctx: Ctx, limit: int) -> bytes:
    n = ctx.request.content_length
    if n is not None and n > limit:
        raise S3Error("EntityTooLarge", f"the body is larger than {limit} bytes", 400)
    out = bytearray()
    async for chunk in ctx.request.content.iter_any():
        out += chunk
        if len(out) > limit:
            raise S3Error("EntityTooLarge", f"the body is larger than {limit} bytes", 400)
    v = ctx.verified
    if v is not None and len(v.payload) == 64 and set(v.payload) <= _HEX64:
        payload_check(v, hashlib.sha256(out).hexdigest())
    return bytes(out)


def xml_response(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/xml")

"""Writes through the S3 gateway, for checkpoints: PutObject (plain, aws-chunked
signed or STREAMING-UNSIGNED-PAYLOAD-TRAILER), multipart upload (create, upload
part, complete, abort, list parts, list uploads) and DeleteObject (CopyObject and
DeleteObjects: :mod:`shoal.gateway.s3_copy`).

A body is spooled to a local file while it arrives (decoded from aws-chunked, its
declared SHA-256 / Content-MD5 checked), then written through to the dataset's under
store by :class:`shoal.client.writes.Writer`, which also makes the new version visible
(sync of that key, then the client forgets it). Parts of a multipart upload are
spooled one file each and joined (``copy_file_range``) at Complete; upload state lives
in this gateway process only (a restarted gateway has no uploads in flight).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash
from aiohttp import web

from shoal.gateway.chunked import AwsChunkedDecoder
from shoal.gateway.s3_xml import (
    MAX_COMPLETE_BODY,
    S3Error,
    doc,
    el,
    els,
    etag_of,
    iso_date,
    parse_complete,
)
from shoal.gateway.sigv4 import payload_check

if TYPE_CHECKING:
    from shoal.gateway.s3 import Ctx, S3Gateway

#: S3's limits: one PUT, one part, the smallest part but the last, the part count
MAX_PUT = 5 << 30
MIN_PART = 5 << 20
MAX_PARTS = 10_000
_HEX64 = frozenset("0123456789abcdef")


@dataclass
class Upload:
    id: str
    bucket: str
    key: str
    owner: str
    dir: Path
    initiated: float = field(default_factory=time.time)
    #: part number -> (etag without quotes, size, mtime)
    parts: dict[int, tuple[str, int, float]] = field(default_factory=dict)


class Uploads:
    """Multipart uploads in flight, their parts spooled under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._by_id: dict[str, Upload] = {}

    def create(self, bucket: str, key: str, owner: str) -> Upload:
        uid = secrets.token_urlsafe(24)
        d = self.root / "uploads" / uid
        d.mkdir(parents=True, mode=0o700)
        up = self._by_id[uid] = Upload(uid, bucket, key, owner, d)
        return up

    def get(self, ctx: Ctx) -> Upload:
        up = self._by_id.get(ctx.query.get("uploadId", ""))
        if up is None or up.bucket != ctx.bucket or up.key != ctx.key:
            raise S3Error("NoSuchUpload", "The specified upload does not exist", 404)
        return up

    def drop(self, up: Upload) -> None:
        self._by_id.pop(up.id, None)
        shutil.rmtree(up.dir, ignore_errors=True)

    def list_doc(self, bucket: str, prefix: str) -> bytes:
        items = sorted(
            (u for u in self._by_id.values() if u.bucket == bucket and u.key.startswith(prefix)),
            key=lambda u: (u.key, u.initiated),
        )
        body = els([("Bucket", bucket), ("Prefix", prefix), ("MaxUploads", 1000)])
        body += el("IsTruncated", "false")
        for u in items:
            body += (
                "<Upload>"
                + els([("Key", u.key), ("UploadId", u.id), ("Initiated", iso_date(u.initiated))])
                + "<StorageClass>STANDARD</StorageClass></Upload>"
            )
        return doc("ListMultipartUploadsResult", body)

    def spool_file(self) -> Path:
        (self.root / "put").mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.root / "put" / secrets.token_hex(12)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


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


async def create_upload(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    ctx.op = "CreateMultipartUpload"
    gw.check_write(ctx)
    await gw.client.dataset(ctx.bucket)
    up = gw.uploads.create(ctx.bucket, ctx.key, ctx.identity.name)
    body = els([("Bucket", ctx.bucket), ("Key", ctx.key), ("UploadId", up.id)])
    return xml_response(doc("InitiateMultipartUploadResult", body))


def _part_number(ctx: Ctx) -> int:
    raw = ctx.query.get("partNumber", "")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PARTS:
        raise S3Error("InvalidArgument", f"partNumber must be 1..{MAX_PARTS}", 400)
    return int(raw)


async def upload_part(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    ctx.op = "UploadPart"
    gw.check_write(ctx)
    up = gw.uploads.get(ctx)
    n = _part_number(ctx)
    if "x-amz-copy-source" in ctx.request.headers:
        raise S3Error("NotImplemented", "UploadPartCopy is not supported", 501)
    tmp = up.dir / f"{n}.partial"
    try:
        digest, size = await receive_body(ctx, tmp, MAX_PUT)
        os.replace(tmp, up.dir / str(n))
    finally:
        tmp.unlink(missing_ok=True)
    up.parts[n] = (digest, size, time.time())
    return web.Response(headers={"ETag": f'"{digest}"'})


async def list_parts(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    ctx.op = "ListParts"
    gw.check_write(ctx)
    up = gw.uploads.get(ctx)
    q = ctx.query
    try:
        marker = int(q.get("part-number-marker") or 0)
        max_parts = min(int(q.get("max-parts") or 1000), 1000)
    except ValueError:
        raise S3Error(
            "InvalidArgument", "part-number-marker and max-parts are integers", 400
        ) from None
    numbers = sorted(p for p in up.parts if p > marker)
    page, more = numbers[:max_parts], len(numbers) > max_parts
    body = els(
        [
            ("Bucket", up.bucket),
            ("Key", up.key),
            ("UploadId", up.id),
            ("PartNumberMarker", marker),
            ("NextPartNumberMarker", page[-1] if page else marker),
            ("MaxParts", max_parts),
            ("IsTruncated", "true" if more else "false"),
        ]
    )
    body += f"<Initiator><ID>{up.owner}</ID></Initiator><Owner><ID>{up.owner}</ID></Owner>"
    body += el("StorageClass", "STANDARD")
    for p in page:
        etag, size, mtime = up.parts[p]
        body += (
            "<Part>"
            + els(
                [
                    ("PartNumber", p),
                    ("LastModified", iso_date(mtime)),
                    ("ETag", f'"{etag}"'),
                    ("Size", size),
                ]
            )
            + "</Part>"
        )
    return xml_response(doc("ListPartsResult", body))


async def complete_upload(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    ctx.op = "CompleteMultipartUpload"
    gw.check_write(ctx)
    up = gw.uploads.get(ctx)
    raw = await small_body(ctx, MAX_COMPLETE_BODY)
    wanted = parse_complete(raw)
    numbers = [n for n, _ in wanted]
    if numbers != sorted(set(numbers)):
        raise S3Error("InvalidPartOrder", "parts must be listed in ascending order", 400)
    for i, (n, etag) in enumerate(wanted):
        have = up.parts.get(n)
        if have is None or have[0] != etag:
            raise S3Error("InvalidPart", f"part {n} was not uploaded with that ETag", 400)
        if i < len(wanted) - 1 and have[1] < MIN_PART:
            raise S3Error("EntityTooSmall", f"part {n} is smaller than {MIN_PART} bytes", 400)
    whole = up.dir / "whole"
    await asyncio.to_thread(_join, whole, [(up.dir / str(n), up.parts[n][1]) for n in numbers])
    info = await gw.writer.put_file(ctx.path, str(whole))
    gw.uploads.drop(up)
    body = els(
        [
            ("Location", f"/{ctx.bucket}/{ctx.key}"),
            ("Bucket", ctx.bucket),
            ("Key", ctx.key),
            ("ETag", etag_of(info.version)),
        ]
    )
    return xml_response(doc("CompleteMultipartUploadResult", body))


async def abort_upload(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    ctx.op = "AbortMultipartUpload"
    gw.check_write(ctx)
    gw.uploads.drop(gw.uploads.get(ctx))
    return web.Response(status=204)


def _join(dest: Path, parts: list[tuple[Path, int]]) -> None:
    """The parts, in order, into ``dest`` (copy_file_range: no copy through Python)."""
    with open(dest, "wb") as out:
        for path, size in parts:
            with open(path, "rb") as part:
                _copy(part.fileno(), out.fileno(), size)


def _copy(src: int, dst: int, n: int) -> None:
    left = n
    while left > 0:
        k = os.copy_file_range(src, dst, left)
        if k == 0:
            raise S3Error("InternalError", "a spooled part is shorter than its size", 500)
        left -= k


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

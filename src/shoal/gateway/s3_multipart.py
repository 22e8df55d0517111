"""Multipart uploads of the S3 gateway that a restarted gateway, or any replica of it,
continues: CreateMultipartUpload, UploadPart (UploadPartCopy: :mod:`shoal.gateway.
s3_copy`), ListParts, CompleteMultipartUpload, AbortMultipartUpload and the state
behind ListMultipartUploads.

Where the state lives, and why. An upload is one directory of the uploads directory
(``--uploads-dir``; in Kubernetes a ReadWriteMany volume that every replica mounts):

    <uploads>/<id>/upload.json      bucket, key, owner, initiated (written once, whole)
    <uploads>/<id>/p00001.<etag>    part 1; its ETag (xxh128 of its bytes) in its name
    <uploads>/<id>/tmp.<random>     a part, or the joined object, being written
    <uploads>/.tmp/<id>             an upload being created (renamed into place)
    <uploads>/.trash/<id>.<random>  an upload being removed

Every change is one rename, so two replicas (or a replica and its restarted self)
never see half of one: a part appears whole under its final name, a re-sent part
replaces the older file of that number (the newest bytes win, as on S3), an upload
vanishes at once when it is completed, aborted or expired. Nothing is kept in the
process (a gateway without writable datasets makes no directory). The volume needs
close-to-open consistency (CephFS, NFS, EFS): a replica must see another's rename
once it has returned. The parts stay out of the dataset's under store: the Writer's only way in
is a published write (a sync of the key), which would put them in the manifest and
every listing, and the gateway may not open under stores itself (the layer rule);
native multipart on an S3 under store needs Writer support (see the README). Complete
joins the parts (``copy_file_range``: on one filesystem a server-side or reflink
copy) and writes the object through the Writer like a PutObject.

Upload ids are 24 random bytes (unguessable) and bound to bucket, key and owner in
``upload.json``: another key's or identity's request on the id is refused. An upload
with no activity for ``max_age`` seconds (default a day, the last part's arrival
counts) is removed by a sweep that every replica runs; ListMultipartUploads shows an
upload until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from aiohttp import web

from shoal.errors import InvalidArgument, ShoalError
from shoal.gateway.s3_writes import MAX_PUT, receive_body, small_body, xml_response
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

if TYPE_CHECKING:
    from shoal.gateway.s3 import Ctx, S3Gateway

__all__ = ["MAX_AGE", "MAX_PARTS", "MIN_PART", "Upload", "Uploads"]

log = logging.getLogger("shoal.gateway.s3")

#: S3's limits: the smallest part but the last, the part count
MIN_PART = 5 << 20
MAX_PARTS = 10_000
#: seconds without activity after which an upload is abandoned (removed)
MAX_AGE = 86_400.0
#: uploads one ListMultipartUploads page shows
MAX_UPLOADS = 1000
_ID = re.compile(r"[A-Za-z0-9_-]{32}")
_PART = re.compile(r"p(\d{5})\.([0-9a-f]{32})")


class Part(NamedTuple):
    etag: str
    size: int
    mtime_ns: int
    path: Path


@dataclass(frozen=True)
class Upload:
    id: str
    bucket: str
    key: str
    owner: str
    dir: Path
    initiated: float


def _no_upload() -> S3Error:
    return S3Error("NoSuchUpload", "The specified upload does not exist", 404)


class Uploads:
    """Multipart uploads under ``root`` (shared by replicas), and the local spool of
    this process's PutObject and CopyObject bodies under ``spool``. A gateway without
    writable datasets (``writes`` false) never makes ``root``."""

    def __init__(
        self, spool: Path, root: Path, max_age: float = MAX_AGE, writes: bool = True
    ) -> None:
        self.spool = spool
        self.root = root
        self.max_age = max_age
        self.writes = writes
        if not writes:
            return
        try:
            for d in (root, root / ".tmp", root / ".trash"):
                d.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise InvalidArgument(f"uploads directory {root}: {exc.strerror or exc}") from None

    # -- uploads ------------------------------------------------------------------------

    def create(self, bucket: str, key: str, owner: str) -> Upload:
        uid = secrets.token_urlsafe(24)
        tmp = self.root / ".tmp" / uid
        tmp.mkdir(mode=0o700)
        now = time.time()
        meta = {"bucket": bucket, "key": key, "owner": owner, "initiated": now}
        (tmp / "upload.json").write_text(json.dumps(meta))
        os.rename(tmp, self.root / uid)
        return Upload(uid, bucket, key, owner, self.root / uid, now)

    def load(self, uid: str) -> Upload | None:
        """The upload ``uid``, or None when there is none (or the id is malformed)."""
        if not _ID.fullmatch(uid):
            return None
        d = self.root / uid
        try:
            meta = json.loads((d / "upload.json").read_bytes())
            return Upload(
                uid, meta["bucket"], meta["key"], meta["owner"], d, float(meta["initiated"])
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def get(self, ctx: Ctx) -> Upload:
        """The upload the request names; another key's is NoSuchUpload, another
        identity's AccessDenied."""
        up = self.load(ctx.query.get("uploadId", ""))
        if up is None or up.bucket != ctx.bucket or up.key != ctx.key:
            raise _no_upload()
        if up.owner != ctx.identity.name:
            raise S3Error("AccessDenied", "the upload belongs to another identity", 403)
        return up

    def parts(self, up: Upload) -> dict[int, Part]:
        """The upload's parts by number (the newest file of a number: a re-sent part
        is briefly there twice)."""
        out: dict[int, Part] = {}
        try:
            entries = list(os.scandir(up.dir))
        except FileNotFoundError:
            raise _no_upload() from None
        for e in entries:
            m = _PART.fullmatch(e.name)
            if m is None:
                continue
            try:
                st = e.stat()
            except FileNotFoundError:  # replaced by a newer one meanwhile
                continue
            n, p = int(m[1]), Part(m[2], st.st_size, st.st_mtime_ns, Path(e.path))
            if n not in out or (p.mtime_ns, p.etag) > (out[n].mtime_ns, out[n].etag):
                out[n] = p
        return out

    def part_tmp(self, up: Upload) -> Path:
        return up.dir / f"tmp.{secrets.token_hex(12)}"

    def add_part(self, up: Upload, n: int, tmp: Path, etag: str) -> None:
        """``tmp`` (in the upload's directory) becomes part ``n``; older files of that
        number go (never a newer one: of two racing uploads of a part the newer
        stays)."""
        final = up.dir / f"p{n:05d}.{etag}"
        try:
            os.replace(tmp, final)
            mine = (final.stat().st_mtime_ns, etag)
        except FileNotFoundError:  # completed or aborted meanwhile
            raise _no_upload() from None
        for old in up.dir.glob(f"p{n:05d}.*"):
            if old.name == final.name:
                continue
            with contextlib.suppress(FileNotFoundError):
                if (old.stat().st_mtime_ns, old.name.rpartition(".")[2]) < mine:
                    old.unlink()

    def drop(self, up: Upload) -> None:
        """Remove the upload: gone for every replica at the rename, then deleted."""
        trash = self.root / ".trash" / f"{up.id}.{secrets.token_hex(4)}"
        try:
            os.rename(up.dir, trash)
        except FileNotFoundError:
            return  # another replica removed it first
        shutil.rmtree(trash, ignore_errors=True)

    def all(self) -> list[Upload]:
        if not self.writes:
            return []
        found = (self.load(e.name) for e in os.scandir(self.root) if _ID.fullmatch(e.name))
        return [u for u in found if u is not None]

    def list_doc(self, bucket: str, q: Mapping[str, str]) -> bytes:
        """ListMultipartUploadsResult of ``bucket`` (every identity's uploads, as S3
        lists them: an id alone gives no access to an upload), one page of at most
        ``max-uploads``: in key order, a key's uploads oldest first, after
        ``key-marker`` (and, on that key, after the upload ``upload-id-marker``)."""
        prefix, key_marker = q.get("prefix", ""), q.get("key-marker", "")
        id_marker = q.get("upload-id-marker", "") if key_marker else ""
        try:
            limit = min(int(q.get("max-uploads") or MAX_UPLOADS), MAX_UPLOADS)
        except ValueError:
            raise S3Error("InvalidArgument", "max-uploads is an integer", 400) from None
        if limit < 0:
            raise S3Error("InvalidArgument", "max-uploads is not negative", 400)
        items = sorted(
            (u for u in self.all() if u.bucket == bucket and u.key.startswith(prefix)),
            key=lambda u: (u.key, u.initiated, u.id),
        )
        ids = [(u.key, u.id) for u in items]
        if id_marker and (key_marker, id_marker) in ids:
            items = items[ids.index((key_marker, id_marker)) + 1 :]
        elif key_marker:
            items = [u for u in items if u.key > key_marker]
        page, more = items[:limit], len(items) > limit
        body = els([("Bucket", bucket), ("KeyMarker", key_marker)])
        body += els([("UploadIdMarker", id_marker), ("Prefix", prefix), ("MaxUploads", limit)])
        body += el("IsTruncated", "true" if more else "false")
        if more and page:
            body += els([("NextKeyMarker", page[-1].key), ("NextUploadIdMarker", page[-1].id)])
        for u in page:
            who = els([("ID", u.owner), ("DisplayName", u.owner)])
            body += (
                "<Upload>"
                + els([("Key", u.key), ("UploadId", u.id)])
                + f"<Initiator>{who}</Initiator><Owner>{who}</Owner>"
                + el("StorageClass", "STANDARD")
                + el("Initiated", iso_date(u.initiated))
                + "</Upload>"
            )
        return doc("ListMultipartUploadsResult", body)

    # -- expiry -------------------------------------------------------------------------

    def sweep(self, now: float) -> list[str]:
        """Remove uploads idle for more than ``max_age`` (their last part counts) and
        leftovers of interrupted creates and removals; the ids removed."""
        gone: list[str] = []
        for e in os.scandir(self.root):
            if not _ID.fullmatch(e.name):
                continue
            up = self.load(e.name)
            try:
                active = e.stat().st_mtime
            except FileNotFoundError:
                continue
            if up is None:  # no upload.json: not one of ours to judge
                continue
            if now - max(up.initiated, active) > self.max_age:
                self.drop(up)
                gone.append(up.id)
        for e in os.scandir(self.root / ".trash"):
            shutil.rmtree(e.path, ignore_errors=True)
        for e in os.scandir(self.root / ".tmp"):
            with contextlib.suppress(FileNotFoundError):
                if now - e.stat().st_mtime > self.max_age:
                    shutil.rmtree(e.path, ignore_errors=True)
        return gone

    async def sweeping(self, app: web.Application) -> AsyncIterator[None]:
        """An aiohttp cleanup context: sweeps while the application runs."""
        if not self.writes:
            yield
            return
        task = asyncio.create_task(self._sweep_forever())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _sweep_forever(self) -> None:
        every = min(max(self.max_age / 4, 1.0), 600.0)
        while True:
            try:
                gone = await asyncio.to_thread(self.sweep, time.time())
            except OSError as exc:
                log.warning("s3 gateway: sweeping %s failed: %s", self.root, exc)
            else:
                if gone:
                    log.info("s3 gateway: removed %d abandoned multipart uploads", len(gone))
            await asyncio.sleep(every)

    # -- this process's spool -------------------------------------------------------------

    def spool_file(self) -> Path:
        (self.spool / "put").mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.spool / "put" / secrets.token_hex(12)

    def close(self) -> None:
        shutil.rmtree(self.spool, ignore_errors=True)


# -- handlers -------------------------------------------------------------------------


async def create_upload(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    ctx.op = "CreateMultipartUpload"
    gw.check_write(ctx)
    await gw.client.dataset(ctx.bucket)
    up = await asyncio.to_thread(gw.uploads.create, ctx.bucket, ctx.key, ctx.identity.name)
    body = els([("Bucket", ctx.bucket), ("Key", ctx.key), ("UploadId", up.id)])
    return xml_response(doc("InitiateMultipartUploadResult", body))


def _part_number(ctx: Ctx) -> int:
    raw = ctx.query.get("partNumber", "")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PARTS:
        raise S3Error("InvalidArgument", f"partNumber must be 1..{MAX_PARTS}", 400)
    return int(raw)


async def upload_part(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    from shoal.gateway.s3_copy import copy_part

    copying = "x-amz-copy-source" in ctx.request.headers
    ctx.op = "UploadPartCopy" if copying else "UploadPart"
    gw.check_write(ctx)
    up = gw.uploads.get(ctx)
    n = _part_number(ctx)
    tmp = gw.uploads.part_tmp(up)
    try:
        try:
            if copying:
                digest, _ = await copy_part(gw, ctx, tmp)
            else:
                digest, _ = await receive_body(ctx, tmp, MAX_PUT)
        except FileNotFoundError as exc:
            if isinstance(exc, ShoalError):  # the copy source (NotFound is one too)
                raise
            raise _no_upload() from None  # its directory went: completed or aborted
        await asyncio.to_thread(gw.uploads.add_part, up, n, tmp, digest)
    finally:
        tmp.unlink(missing_ok=True)
    if copying:
        mtime = time.time()
        body = els([("LastModified", iso_date(mtime)), ("ETag", f'"{digest}"')])
        return xml_response(doc("CopyPartResult", body))
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
    parts = await asyncio.to_thread(gw.uploads.parts, up)
    numbers = sorted(p for p in parts if p > marker)
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
    who = el("ID", up.owner)
    body += f"<Initiator>{who}</Initiator><Owner>{who}</Owner>"
    body += el("StorageClass", "STANDARD")
    for n in page:
        p = parts[n]
        fields = [
            ("PartNumber", n),
            ("LastModified", iso_date(p.mtime_ns / 1e9)),
            ("ETag", f'"{p.etag}"'),
            ("Size", p.size),
        ]
        body += "<Part>" + els(fields) + "</Part>"
    return xml_response(doc("ListPartsResult", body))


async def complete_upload(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    ctx.op = "CompleteMultipartUpload"
    gw.check_write(ctx)
    up = gw.uploads.get(ctx)
    wanted = parse_complete(await small_body(ctx, MAX_COMPLETE_BODY))
    numbers = [n for n, _ in wanted]
    if numbers != sorted(set(numbers)):
        raise S3Error("InvalidPartOrder", "parts must be listed in ascending order", 400)
    have = await asyncio.to_thread(gw.uploads.parts, up)
    for i, (n, etag) in enumerate(wanted):
        p = have.get(n)
        if p is None or p.etag != etag:
            raise S3Error("InvalidPart", f"part {n} was not uploaded with that ETag", 400)
        if i < len(wanted) - 1 and p.size < MIN_PART:
            raise S3Error("EntityTooSmall", f"part {n} is smaller than {MIN_PART} bytes", 400)
    whole = gw.uploads.part_tmp(up)
    try:
        try:
            await asyncio.to_thread(_join, whole, [(have[n].path, have[n].size) for n in numbers])
        except FileNotFoundError:  # aborted (or completed elsewhere) meanwhile
            raise _no_upload() from None
        ctx.nbytes = sum(have[n].size for n in numbers)
        info = await gw.writer.put_file(ctx.path, str(whole))
    finally:
        whole.unlink(missing_ok=True)
    await asyncio.to_thread(gw.uploads.drop, up)
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
    await asyncio.to_thread(gw.uploads.drop, gw.uploads.get(ctx))
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
        try:
            k = os.copy_file_range(src, dst, left)
        except OSError as exc:
            # a filesystem without it (some network ones): copy through a buffer
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            data = memoryview(os.read(src, min(left, 8 << 20)))
            k = len(data)
            while data:
                data = data[os.write(dst, data) :]
        if k == 0:
            raise S3Error("InternalError", "a part is shorter than its size", 500)
        left -= k

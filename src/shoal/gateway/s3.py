"""The S3-compatible gateway: an aiohttp application over the shoal client.

Namespace: bucket = dataset, key = '<mount>/<path>' (the dataset's key paths, as in
its manifest), path-style (``endpoint/bucket/key``); virtual-host style too when a
``domain`` is configured (``bucket.domain/key``).

One handler takes every request, authenticates it (SigV4 header or presigned, SigV2
query: :mod:`shoal.gateway.sigv4`), maps the caller to a shoal identity
(:mod:`shoal.gateway.auth`) and dispatches on method, bucket/key and sub-resource:

- service: ListBuckets
- bucket: HeadBucket, ListObjects v1/v2, GetBucketLocation, ListMultipartUploads,
  harmless answers to ?acl ?policy ?cors ?versioning and the other probes
- object: HeadObject, GetObject (:mod:`shoal.gateway.s3_objects`); PutObject,
  DeleteObject (:mod:`shoal.gateway.s3_writes`), multipart upload, shared by gateway
  replicas (:mod:`shoal.gateway.s3_multipart`), CopyObject, UploadPartCopy and
  DeleteObjects (:mod:`shoal.gateway.s3_copy`), only for datasets the gateway was told
  are writable, and only for identities that may write them

Errors are S3 XML (:mod:`shoal.gateway.s3_xml`); ``GET /metrics`` without a signature
is the Prometheus text of this gateway (a signed request there is a bucket listing).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes

from aiohttp import web

from shoal.client.aio import AsyncClient
from shoal.client.wholefile import LocalFiles
from shoal.client.writes import Writer
from shoal.errors import PathOutsideDataset, ShoalError
from shoal.gateway import s3_buckets, s3_copy, s3_multipart, s3_objects, s3_writes
from shoal.gateway.auth import Credentials, Identity
from shoal.gateway.metrics import GatewayMetrics
from shoal.gateway.s3_listing import IndexCache
from shoal.gateway.s3_multipart import MAX_AGE, Uploads
from shoal.gateway.s3_xml import S3Error, error_body, from_shoal
from shoal.gateway.sigv4 import AuthError, HttpRequest, Verified, verify

__all__ = ["Ctx", "S3Gateway"]

log = logging.getLogger("shoal.gateway.s3")

#: the longest key S3 accepts, in UTF-8 bytes
MAX_KEY_BYTES = 1024
#: requests whose headers together pass this are refused (aiohttp also caps each line)
MAX_HEADER_BYTES = 64 << 10
_CONTROL = re.compile("[\x00-\x1f\x7f]")


@dataclass
class Ctx:
    """One request as the handlers see it."""

    request: web.Request
    method: str
    bucket: str
    key: str
    query: dict[str, str]
    verified: Verified | None
    identity: Identity
    request_id: str
    op: str = "Unknown"
    nbytes: int = 0
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """The shoal path of the object ('/<dataset>/<mount>/<path>')."""
        return f"/{self.bucket}/{self.key}"


Handler = Callable[["S3Gateway", Ctx], Awaitable[web.StreamResponse]]


class S3Gateway:
    def __init__(
        self,
        client: AsyncClient,
        credentials: Credentials,
        *,
        writable: frozenset[str] = frozenset(),
        spool_dir: str | Path | None = None,
        uploads_dir: str | Path | None = None,
        upload_max_age: float = MAX_AGE,
        region: str = "us-east-1",
        domain: str | None = None,
    ) -> None:
        self.client = client
        self.credentials = credentials
        self.writable = writable
        self.region = region
        self.domain = domain.lower().strip(".") if domain else None
        self.metrics = GatewayMetrics("s3")
        self.started = time.time()
        self.writer = Writer(client)
        self.indexes = IndexCache()
        self.probes = s3_objects.Probes()
        self.local = LocalFiles(client)
        spool = Path(spool_dir) if spool_dir else Path(os.environ.get("TMPDIR", "/tmp"))
        # multipart uploads outlive this process: a fixed directory, shared by replicas
        uploads = Path(uploads_dir) if uploads_dir else spool / f"shoal-s3-uploads-{os.getuid()}"
        self.uploads = Uploads(
            spool / f"shoal-s3-{os.getpid()}", uploads, upload_max_age, writes=bool(writable)
        )
        self._ids = itertools.count(1)
        self._id_prefix = os.urandom(4).hex().upper()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 20)
        # one route: the handler does S3's own routing on the raw path and query
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_cleanup.append(self._cleanup)
        app.cleanup_ctx.append(self.uploads.sweeping)
        return app

    async def _cleanup(self, app: web.Application) -> None:
        await self.writer.close()
        self.uploads.close()
        self.local.close()
        await self.client.close()

    # -- the one handler ---------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        rid = f"{self._id_prefix}{next(self._ids):012X}"
        ctx: Ctx | None = None
        try:
            raw_path, _, raw_query = request.raw_path.partition("?")
            if raw_path == "/metrics" and request.method == "GET" and not _signed(request):
                return await self.metrics.handler(request)
            ctx = self._context(request, raw_path, raw_query, rid)
            resp = await self._dispatch(ctx)
        except S3Error as exc:
            resp = self._error(request, exc, rid, ctx)
        except AuthError as exc:
            resp = self._error(request, S3Error(exc.code, exc.message, exc.http_status), rid, ctx)
        except ShoalError as exc:
            if exc.http_status >= 500 or exc.code == "unauthenticated":
                op = ctx.op if ctx is not None else "?"
                log.warning("s3 gateway: %s failed: %s: %s", op, type(exc).__name__, exc.message)
            resp = self._error(request, from_shoal(exc), rid, ctx)
        except (ConnectionResetError, web.HTTPException):
            raise
        except Exception:
            log.exception("s3 gateway: %s %s failed", request.method, (ctx.op if ctx else "?"))
            err = S3Error("InternalError", "We encountered an internal error", 500)
            resp = self._error(request, err, rid, ctx)
        op = ctx.op if ctx is not None else "Unknown"
        self.metrics.observe(op, resp.status, ctx.nbytes if ctx else 0, time.perf_counter() - t0)
        return resp

    def _error(
        self, request: web.Request, err: S3Error, rid: str, ctx: Ctx | None
    ) -> web.StreamResponse:
        resource = request.raw_path.partition("?")[0]
        headers = {"x-amz-request-id": rid, **err.headers}
        if request.method == "HEAD":
            return web.Response(status=err.status, headers=headers)
        body = error_body(err, resource, rid)
        return web.Response(
            status=err.status, body=body, headers=headers, content_type="application/xml"
        )

    def _context(self, request: web.Request, raw_path: str, raw_query: str, rid: str) -> Ctx:
        size = sum(len(k) + len(v) for k, v in request.raw_headers)
        if size > MAX_HEADER_BYTES:
            raise S3Error("RequestHeaderSectionTooLarge", "the request headers are too large", 400)
        headers = [(_text(k), _text(v)) for k, v in request.raw_headers]
        req = HttpRequest(request.method, raw_path, raw_query, headers)
        verified = verify(req, self.credentials.secret_for)
        if verified is None:
            identity = self.credentials.anonymous()
        else:
            found = self.credentials.identity(verified.access_key)
            if found is None:  # the verifier knew the key: the credentials changed since
                raise S3Error("InvalidAccessKeyId", "the access key is not known", 403)
            identity = found
        bucket, key = self._target(request, raw_path)
        return Ctx(
            request, request.method, bucket, key, parse_query(raw_query), verified, identity, rid
        )

    def _target(self, request: web.Request, raw_path: str) -> tuple[str, str]:
        if not raw_path.startswith("/"):
            raise S3Error("InvalidURI", "the request path must start with '/'", 400)
        host = (request.headers.get("Host") or "").lower()
        if not host.endswith("]"):  # an IPv6 literal keeps its colons
            host = host.rpartition(":")[0] or host
        if self.domain and host.endswith("." + self.domain):
            bucket, key_raw = host[: -len(self.domain) - 1], raw_path[1:]
        else:
            bucket_raw, _, key_raw = raw_path[1:].partition("/")
            bucket = unquote(bucket_raw)
        try:
            key = unquote_to_bytes(key_raw).decode("utf-8")
        except UnicodeDecodeError:
            raise S3Error("InvalidURI", "the key is not valid UTF-8", 400) from None
        if key:
            check_key(key)
        return bucket, key

    async def _dispatch(self, ctx: Ctx) -> web.StreamResponse:
        m, q = ctx.method, ctx.query
        if not ctx.bucket:
            if m == "GET":
                return await s3_buckets.list_buckets(self, ctx)
            raise S3Error("MethodNotAllowed", "only GET is allowed on the service", 405)
        if not ctx.key:
            if m == "POST" and "delete" in q:
                return await s3_copy.delete_objects(self, ctx)
            return await s3_buckets.bucket_op(self, ctx)
        if m in ("GET", "HEAD"):
            if "uploadId" in q and m == "GET":
                return await s3_multipart.list_parts(self, ctx)
            if "acl" in q or "tagging" in q:
                return await s3_buckets.object_probe(self, ctx)
            return await s3_objects.get_object(self, ctx, head=m == "HEAD")
        if m == "PUT":
            if "uploadId" in q or "partNumber" in q:
                return await s3_multipart.upload_part(self, ctx)
            if "x-amz-copy-source" in ctx.request.headers:
                return await s3_copy.copy_object(self, ctx)
            return await s3_writes.put_object(self, ctx)
        if m == "POST":
            if "uploads" in q:
                return await s3_multipart.create_upload(self, ctx)
            if "uploadId" in q:
                return await s3_multipart.complete_upload(self, ctx)
            raise S3Error("NotImplemented", "this POST is not supported", 501)
        if m == "DELETE":
            if "uploadId" in q:
                return await s3_multipart.abort_upload(self, ctx)
            return await s3_writes.delete_object(self, ctx)
        raise S3Error("MethodNotAllowed", f"{m} is not allowed here", 405)

    # -- permissions ------------------------------------------------------------------

    def check_read(self, ctx: Ctx, listing: bool = False) -> None:
        self.check_read_of(ctx, ctx.bucket, listing)

    def check_read_of(self, ctx: Ctx, ds: str, listing: bool = False) -> None:
        """Whether the caller of ``ctx`` may read (or list) dataset ``ds``."""
        who = ctx.identity
        if self.credentials.is_public(ds):
            return
        ok = who.can_list(ds) if listing else who.can_read(ds)
        if not ok:
            raise _denied(ctx)

    def check_write(self, ctx: Ctx) -> None:
        ds = ctx.bucket
        if ctx.verified is None or not ctx.identity.can_write(ds):
            raise _denied(ctx)
        if ds not in self.writable:
            raise S3Error("AccessDenied", f"dataset {ds} is read-only through this gateway", 403)


def _denied(ctx: Ctx) -> S3Error:
    if ctx.verified is None:
        return S3Error("AccessDenied", "anonymous access is not allowed here", 403)
    return S3Error("AccessDenied", "Access Denied", 403)


def _signed(request: web.Request) -> bool:
    q = request.query
    return "Authorization" in request.headers or "X-Amz-Signature" in q or "Signature" in q


def _text(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("latin-1")


def parse_query(raw: str) -> dict[str, str]:
    """Query parameters, percent-decoded (not '+'), the first value of each name."""
    out: dict[str, str] = {}
    if not raw:
        return out
    for part in raw.split("&"):
        if not part:
            continue
        k, _, v = part.partition("=")
        out.setdefault(unquote(k), unquote(v))
    return out


def check_key(key: str) -> None:
    """Refuse keys shoal cannot name safely: NUL and control characters, '.' and '..'
    segments, empty segments inside the key (they would alias another key)."""
    if len(key.encode()) > MAX_KEY_BYTES:
        raise S3Error("KeyTooLongError", "Your key is too long", 400)
    if _CONTROL.search(key):
        raise S3Error("InvalidArgument", "keys may not contain control characters", 400)
    segments = key.split("/")
    inner = segments[:-1] if segments[-1] == "" else segments
    if any(s in ("", ".", "..") for s in inner):
        raise PathOutsideDataset("keys may not contain '.', '..' or empty segments")

"""Service and bucket operations of the S3 gateway: ListBuckets, HeadBucket,
GetBucketLocation, ListObjects v1/v2, and the sub-resources clients probe."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from aiohttp import web

from shoal.errors import DatasetNotFound
from shoal.gateway.s3_listing import (
    MAX_KEYS,
    Page,
    after,
    decode_token,
    encode_token,
    list_page,
    walk_index,
)
from shoal.gateway.s3_xml import S3Error, doc, el, els, etag_of, iso_date

if TYPE_CHECKING:
    from shoal.gateway.s3 import Ctx, S3Gateway

OWNER = "<Owner><ID>shoal</ID><DisplayName>shoal</DisplayName></Owner>"

#: GET sub-resources with a fixed empty answer: name -> (root element, inner XML)
_EMPTY_DOCS = {
    "versioning": ("VersioningConfiguration", ""),
    "logging": ("BucketLoggingStatus", ""),
    "notification": ("NotificationConfiguration", ""),
    "accelerate": ("AccelerateConfiguration", ""),
    "requestPayment": ("RequestPaymentConfiguration", "<Payer>BucketOwner</Payer>"),
}
#: GET sub-resources S3 answers with a 404 when nothing is configured
_NOT_CONFIGURED = {
    "policy": ("NoSuchBucketPolicy", "The bucket policy does not exist"),
    "cors": ("NoSuchCORSConfiguration", "The CORS configuration does not exist"),
    "lifecycle": ("NoSuchLifecycleConfiguration", "The lifecycle configuration does not exist"),
    "tagging": ("NoSuchTagSet", "The TagSet does not exist"),
    "website": ("NoSuchWebsiteConfiguration", "The specified bucket does not have a website"),
    "encryption": (
        "ServerSideEncryptionConfigurationNotFoundError",
        "The server side encryption configuration was not found",
    ),
    "object-lock": (
        "ObjectLockConfigurationNotFoundError",
        "Object Lock configuration does not exist for this bucket",
    ),
    "replication": ("ReplicationConfigurationNotFoundError", "no replication configuration"),
    "ownershipControls": ("OwnershipControlsNotFoundError", "no ownership controls"),
    "publicAccessBlock": ("NoSuchPublicAccessBlockConfiguration", "no public access block"),
}


def xml(body: bytes, status: int = 200) -> web.Response:
    return web.Response(status=status, body=body, content_type="application/xml")


def acl_doc() -> bytes:
    grant = (
        '<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        'xsi:type="CanonicalUser"><ID>shoal</ID><DisplayName>shoal</DisplayName></Grantee>'
        "<Permission>FULL_CONTROL</Permission></Grant>"
    )
    return doc("AccessControlPolicy", f"{OWNER}<AccessControlList>{grant}</AccessControlList>")


async def list_buckets(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    ctx.op = "ListBuckets"
    who = ctx.identity
    names = sorted(
        d.name
        for d in await gw.client.datasets()
        if who.can_list(d.name) or who.can_read(d.name) or gw.credentials.is_public(d.name)
    )
    if ctx.verified is None and not names:
        raise S3Error("AccessDenied", "anonymous access is not allowed here", 403)
    created = iso_date(gw.started)
    items = "".join(f"<Bucket>{el('Name', n)}{el('CreationDate', created)}</Bucket>" for n in names)
    return xml(doc("ListAllMyBucketsResult", f"{OWNER}<Buckets>{items}</Buckets>"))


async def _dataset_exists(gw: S3Gateway, ctx: Ctx) -> None:
    await gw.client.dataset(ctx.bucket)  # DatasetNotFound -> NoSuchBucket


async def bucket_op(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    m, q = ctx.method, ctx.query
    if m == "HEAD":
        ctx.op = "HeadBucket"
        gw.check_read(ctx, listing=True)
        await _dataset_exists(gw, ctx)
        return web.Response(headers={"x-amz-bucket-region": gw.region})
    if m == "PUT" and not q:
        ctx.op = "CreateBucket"
        gw.check_read(ctx, listing=True)
        try:
            await _dataset_exists(gw, ctx)
        except DatasetNotFound:
            raise S3Error(
                "AccessDenied", "buckets are shoal datasets: create one with the shoal CLI", 403
            ) from None
        raise S3Error("BucketAlreadyOwnedByYou", "the dataset exists", 409)
    if m != "GET":
        ctx.op = "BucketWrite"
        raise S3Error("AccessDenied", "bucket configuration is read-only", 403)
    gw.check_read(ctx, listing=True)
    if "location" in q:
        ctx.op = "GetBucketLocation"
        await _dataset_exists(gw, ctx)
        loc = "" if gw.region == "us-east-1" else gw.region
        return xml(doc("LocationConstraint", loc))
    if "uploads" in q:
        ctx.op = "ListMultipartUploads"
        await _dataset_exists(gw, ctx)
        return xml(gw.uploads.list_doc(ctx.bucket, q))
    if "acl" in q:
        ctx.op = "GetBucketAcl"
        await _dataset_exists(gw, ctx)
        return xml(acl_doc())
    for name, (root, inner) in _EMPTY_DOCS.items():
        if name in q:
            ctx.op = "GetBucketConfig"
            await _dataset_exists(gw, ctx)
            return xml(doc(root, inner))
    for name, (code, message) in _NOT_CONFIGURED.items():
        if name in q:
            ctx.op = "GetBucketConfig"
            await _dataset_exists(gw, ctx)
            raise S3Error(code, message, 404)
    return await list_objects(gw, ctx, v2=q.get("list-type") == "2")


async def object_probe(gw: S3Gateway, ctx: Ctx) -> web.StreamResponse:
    """GET ?acl / ?tagging on an object: fixed answers once the object exists."""
    gw.check_read(ctx)
    ctx.op = "GetObjectAcl" if "acl" in ctx.query else "GetObjectTagging"
    info = await gw.client.stat(ctx.path)
    if info.is_dir:
        raise S3Error("NoSuchKey", "The specified key does not exist.", 404)
    if "acl" in ctx.query:
        return xml(acl_doc())
    return xml(doc("Tagging", "<TagSet></TagSet>"))


# -- listings -------------------------------------------------------------------------


def _max_keys(q: dict[str, str]) -> int:
    raw = q.get("max-keys", "")
    if not raw:
        return MAX_KEYS
    try:
        n = int(raw)
    except ValueError:
        raise S3Error("InvalidArgument", "max-keys must be an integer", 400) from None
    if n < 0:
        raise S3Error("InvalidArgument", "max-keys must not be negative", 400)
    return min(n, MAX_KEYS)


async def list_objects(gw: S3Gateway, ctx: Ctx, v2: bool) -> web.StreamResponse:
    ctx.op = "ListObjectsV2" if v2 else "ListObjects"
    q = ctx.query
    prefix, delim = q.get("prefix", ""), q.get("delimiter", "")
    enc = q.get("encoding-type", "")
    if enc and enc != "url":
        raise S3Error("InvalidArgument", "Invalid Encoding Method specified in Request", 400)
    max_keys = _max_keys(q)
    token = q.get("continuation-token") if v2 else None
    marker = q.get("start-after", "") if v2 else q.get("marker", "")
    if token is not None:
        start = decode_token(token)
    elif marker:
        start = after(marker, prefix, delim)
    else:
        start = ""
    ds = await gw.client.dataset(ctx.bucket)
    man = await gw.client.manifest(ds)
    if man is not None:
        index = gw.indexes.get(ds.name, man)
    else:
        index = await walk_index(gw.client, ds.name, prefix, delim)
    page = list_page(index, prefix, delim, start, max_keys)
    return xml(_list_doc(ctx.bucket, q, page, max_keys, v2, token, marker))


def _list_doc(
    bucket: str,
    q: dict[str, str],
    page: Page,
    max_keys: int,
    v2: bool,
    token: str | None,
    marker: str,
) -> bytes:
    url = q.get("encoding-type") == "url"

    def enc(s: str) -> str:
        return quote(s, safe="/") if url else s

    prefix, delim = q.get("prefix", ""), q.get("delimiter", "")
    head: list[tuple[str, object]] = [("Name", bucket), ("Prefix", enc(prefix))]
    if v2:
        if token is not None:
            head.append(("ContinuationToken", token))
        if marker:
            head.append(("StartAfter", enc(marker)))
        head.append(("KeyCount", len(page.contents) + len(page.prefixes)))
    else:
        head.append(("Marker", enc(marker)))
    head.append(("MaxKeys", max_keys))
    if delim:
        head.append(("Delimiter", enc(delim)))
    if url:
        head.append(("EncodingType", "url"))
    head.append(("IsTruncated", "true" if page.truncated else "false"))
    if page.truncated and page.resume is not None:
        if v2:
            head.append(("NextContinuationToken", encode_token(page.resume)))
        elif page.last is not None:
            head.append(("NextMarker", enc(page.last)))
    parts = [els(head)]
    for key, row in page.contents:
        parts.append(
            "<Contents>"
            + els(
                [
                    ("Key", enc(key)),
                    ("LastModified", iso_date(row.mtime)),
                    ("ETag", etag_of(row.version)),
                    ("Size", row.size),
                    ("StorageClass", "STANDARD"),
                ]
            )
            + ("" if v2 else OWNER)
            + "</Contents>"
        )
    for p in page.prefixes:
        parts.append(f"<CommonPrefixes>{el('Prefix', enc(p))}</CommonPrefixes>")
    return doc("ListBucketResult", "".join(parts))

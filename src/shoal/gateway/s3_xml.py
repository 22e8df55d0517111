"""S3's wire vocabulary: the error table (shoal error code -> S3 error code), error
bodies, the XML documents the gateway answers with, ETags and dates.

Status codes: a :class:`~shoal.errors.ShoalError` keeps the ``http_status`` of the one
table in :mod:`shoal.errors`; only its S3 ``Code`` comes from :data:`S3_CODES` here. An
error that only exists in S3's protocol (InvalidRange, NoSuchUpload, MalformedXML ...)
is an :class:`S3Error` with S3's own status. 5xx bodies never carry the message of the
failure (it may name internals); every body carries Code, Message, Resource, RequestId.
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from xml.sax.saxutils import escape

from shoal.errors import ShoalError

__all__ = [
    "NS",
    "S3_CODES",
    "S3Error",
    "error_body",
    "etag_of",
    "from_shoal",
    "http_date",
    "iso_date",
    "local_name",
    "parse_complete",
    "parse_xml",
]

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
_DECL = '<?xml version="1.0" encoding="UTF-8"?>\n'

#: shoal error code -> S3 error code (the status stays the one of shoal.errors)
S3_CODES: dict[str, str] = {
    "io": "InternalError",
    "user": "InvalidRequest",
    "invalid": "InvalidArgument",
    "no_dataset": "NoSuchBucket",
    "exists": "BucketAlreadyOwnedByYou",
    "outside": "NoSuchKey",
    "credentials": "AccessDenied",
    "not_found": "NoSuchKey",
    "denied": "AccessDenied",
    # the master refused the gateway's own token: a gateway misconfiguration (logged)
    "unauthenticated": "AccessDenied",
    "is_dir": "NoSuchKey",
    "store": "InternalError",
    "store_retryable": "ServiceUnavailable",
    "store_timeout": "RequestTimeout",
    "store_fatal": "InternalError",
    "unavailable": "ServiceUnavailable",
    "corrupt": "InternalError",
    "protocol": "InternalError",
    "stale": "OperationAborted",
    "stale_layout": "ServiceUnavailable",
}


class S3Error(Exception):
    """An error answered as S3 XML: ``code`` (S3's), ``status``, a one-line message
    without secrets, and extra headers (e.g. Content-Range on a 416)."""

    def __init__(
        self, code: str, message: str, status: int, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.headers = headers or {}


def from_shoal(exc: ShoalError) -> S3Error:
    status = exc.http_status
    code = S3_CODES.get(exc.code, "InternalError")
    # a 5xx message may name workers, stores or paths of under storage: keep it inside
    message = exc.message if status < 500 else "the cache could not serve the request"
    return S3Error(code, message, status)


def error_body(err: S3Error, resource: str, request_id: str) -> bytes:
    return (
        f"{_DECL}<Error><Code>{escape(err.code)}</Code><Message>{escape(err.message)}</Message>"
        f"<Resource>{escape(resource)}</Resource><RequestId>{request_id}</RequestId></Error>"
    ).encode()


def doc(root: str, inner: str) -> bytes:
    """An S3 XML document ``<root xmlns=...>inner</root>``."""
    return f'{_DECL}<{root} xmlns="{NS}">{inner}</{root}>'.encode()


def el(name: str, value: object) -> str:
    return f"<{name}>{escape(str(value))}</{name}>"


def els(pairs: Iterable[tuple[str, object]]) -> str:
    return "".join(el(k, v) for k, v in pairs)


# -- ETags and dates -------------------------------------------------------------

_S3_ETAG = re.compile(r"^[0-9a-f]{32}(-[0-9]{1,5})?$")


@functools.lru_cache(maxsize=8192)
def etag_of(version: str) -> str:
    """The quoted ETag of a file version: the version itself when under storage gave an
    S3 ETag, else a stable digest of it with a '-1' suffix, so that no client takes it
    for the MD5 of the bytes (rclone and others check single-part ETags as MD5s)."""
    if _S3_ETAG.match(version):
        return f'"{version}"'
    digest = hashlib.md5(version.encode(), usedforsecurity=False).hexdigest()
    return f'"{digest}-1"'


@functools.lru_cache(maxsize=8192)
def http_date(mtime: float) -> str:
    """The HTTP date of ``mtime`` (kept: every GET of a file asks for the same one)."""
    return email.utils.formatdate(mtime if mtime > 0 else 0, usegmt=True)


def iso_date(mtime: float) -> str:
    t = mtime if mtime > 0 else 0.0
    ms = int((t - int(t)) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{ms:03d}Z"


def parse_http_date(text: str) -> float | None:
    try:
        dt = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return dt.timestamp() if dt is not None else None


# -- request bodies ----------------------------------------------------------------

#: the largest CompleteMultipartUpload body read (10,000 parts take about 1.2 MB)
MAX_COMPLETE_BODY = 2 << 20


def parse_complete(body: bytes) -> list[tuple[int, str]]:
    """``[(part number, etag without quotes)]`` of a CompleteMultipartUpload body, or
    S3Error MalformedXML. Entity declarations are refused before parsing."""
    root = parse_xml(body, "CompleteMultipartUpload")
    out: list[tuple[int, str]] = []
    for part in root:
        if local_name(part.tag) != "Part":
            continue
        fields = {local_name(c.tag): (c.text or "").strip() for c in part}
        try:
            number = int(fields["PartNumber"])
            etag = fields["ETag"].strip('"')
        except (KeyError, ValueError):
            raise S3Error("MalformedXML", "a Part needs PartNumber and ETag", 400) from None
        out.append((number, etag))
    if not out:
        raise S3Error("MalformedXML", "CompleteMultipartUpload names no parts", 400)
    return out


def parse_xml(body: bytes, root_name: str) -> ET.Element:
    """A request body's XML whose root element is ``root_name`` (any namespace), or
    S3Error MalformedXML. Entity declarations are refused before parsing."""
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
        raise S3Error("MalformedXML", "DTDs and entities are not accepted", 400)
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        raise S3Error("MalformedXML", "the XML is not well-formed", 400) from None
    if local_name(root.tag) != root_name:
        raise S3Error("MalformedXML", f"expected {root_name}", 400)
    return root


def local_name(tag: str) -> str:
    """An element's name without its namespace."""
    return tag.rpartition("}")[2]

"""Server-side verification of AWS request signatures for the S3 gateway.

:func:`verify` takes a request exactly as received (:class:`HttpRequest`) and returns
``None`` (anonymous), a :class:`Verified` (who signed, what payload they declared) or
raises :class:`AuthError` with the S3 error code to answer. No HTTP library here.
Schemes: SigV4 in the Authorization header and presigned, SigV2 presigned (boto3's
default presign in us-east-1) and in the header (s3cmd's default).

The canonical request follows what real clients sign (S3 never normalises paths):
the raw path decoded to bytes and re-encoded but for ``A-Za-z0-9-._~/``, ``//`` and a
trailing ``/`` kept; the query split at the first ``=``, unquoted (``+`` stays),
re-encoded, sorted, duplicates kept; header values trimmed and collapsed, repeats
joined by ``,``; Host as received. Checked: 15 minutes of clock skew, X-Amz-Expires
1..604800 and expiry, the scope's date and service, every signed header present,
``host`` and every ``x-amz-*`` header signed, one auth mechanism, and the signature
in constant time. Messages never carry a secret or a signature. docs/gateway-auth.md
has the user's view.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from functools import lru_cache
from urllib.parse import quote, unquote_to_bytes

#: most a request's clock may differ from ours, seconds (AWS's 15 minutes)
MAX_SKEW = 15 * 60
#: longest validity of a presigned URL, seconds (seven days, as AWS)
MAX_EXPIRES = 604800
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED = "UNSIGNED-PAYLOAD"
#: payload declarations that mean an aws-chunked body (see shoal.gateway.chunked)
STREAMING_PAYLOADS = frozenset(
    {
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
    }
)
_ALGORITHM = "AWS4-HMAC-SHA256"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX64_ANY_CASE = re.compile(r"[0-9a-fA-F]{64}")
_SCOPE_PART = re.compile(r"[!-~]{1,64}")
_AMZ_DATE = re.compile(r"\d{8}T\d{6}Z")
_V2_SIGNATURE = re.compile(r"[A-Za-z0-9+/]{27}=")  # base64 of 20 bytes
#: SigV2 sub-resources that are part of the string to sign (botocore's list)
_V2_SUBRESOURCE_NAMES = (
    "accelerate acl cors defaultObjectAcl location logging partNumber policy "
    "requestPayment torrent versioning versionId versions website uploads uploadId "
    "response-content-type response-content-language response-expires "
    "response-cache-control response-content-disposition response-content-encoding "
    "delete lifecycle tagging restore storageClass notification replication "
    "analytics metrics inventory select select-type object-lock"
)
_V2_SUBRESOURCES = frozenset(_V2_SUBRESOURCE_NAMES.split())
_V4_QUERY_KEYS = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature")
_V2_QUERY_KEYS = ("AWSAccessKeyId", "Signature")


@dataclass(frozen=True)
class HttpRequest:
    """A request as received: ``raw_path`` percent-encoded without the query,
    ``raw_query`` without '?', ``headers`` in any case with duplicates kept."""

    method: str
    raw_path: str
    raw_query: str
    headers: list[tuple[str, str]]


class AuthError(Exception):
    """A request whose authentication failed: ``code`` is the S3 error code,
    ``message`` one line without secrets, ``http_status`` 403 or 400."""

    def __init__(self, code: str, message: str, http_status: int = 403) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.http_status = http_status

    def __repr__(self) -> str:
        return f"AuthError({self.code!r}, {self.message!r}, {self.http_status})"


@dataclass(frozen=True)
class Verified:
    """What a verified request declared. ``payload`` is the declared payload hash (hex
    sha256, UNSIGNED-PAYLOAD or a STREAMING-* value); the last four let the aws-chunked
    decoder check chunk signatures (set for SigV4 only)."""

    access_key: str
    payload: str
    scheme: str  # "v4-header" | "v4-query" | "v2-query" | "v2-header"
    seed_signature: str | None = field(default=None, repr=False)
    signing_key: bytes | None = field(default=None, repr=False)
    amz_date: str | None = None
    scope: str | None = None


@lru_cache(maxsize=1024)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """The SigV4 key for one day, region and service (kept: it changes once a day)."""
    key = _hmac(("AWS4" + secret).encode(), date)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return key


def verify(
    req: HttpRequest,
    secret_for: Callable[[str], str | None],
    now: float | None = None,
    *,
    service: str | None = "s3",
    body_sha256: str | None = None,
    allow_v2: bool = True,
    virtual_bucket: str | None = None,
) -> Verified | None:
    """None for an anonymous request (no Authorization header and no auth query
    parameters); Verified for a good one; AuthError otherwise.

    ``service`` is the one a SigV4 scope must name (None: any, for AWS's generic test
    vectors). ``body_sha256`` stands in for an absent x-amz-content-sha256 header
    (services other than S3 sign the body's hash without sending it); for S3 a SigV4
    header request without that header is refused. ``allow_v2=False`` refuses SigV2
    (which signs neither Host nor most query parameters). ``virtual_bucket`` is the
    bucket a virtual-hosted request names in its Host (SigV2 signs ``/bucket/key``).
    """
    v = _Check(req, secret_for, time.time() if now is None else now, service)
    v.v2_prefix = f"/{virtual_bucket}" if virtual_bucket else ""
    names = {k for k, _ in v.query}
    authz = v.headers.all("authorization")
    v4_query = any(k in names for k in _V4_QUERY_KEYS)
    v2_query = any(k in names for k in _V2_QUERY_KEYS)
    if len(authz) > 1:
        raise AuthError("AuthorizationHeaderMalformed", "more than one Authorization header", 400)
    if sum((bool(authz), v4_query, v2_query)) > 1:
        raise AuthError("InvalidRequest", "only one auth mechanism allowed per request", 400)
    v2_header = bool(authz) and authz[0].strip().startswith("AWS ")
    if not allow_v2 and (v2_query or v2_header):
        msg = "SigV2 is disabled here: sign with SigV4 (botocore: signature_version='s3v4')"
        raise AuthError("InvalidRequest", msg, 400)
    if authz:
        value = authz[0].strip()
        if value.startswith(_ALGORITHM + " "):
            return v.v4_header(value[len(_ALGORITHM) :], body_sha256)
        if value.startswith("AWS "):
            return v.v2(value[4:].strip(), None)
        scheme = value.split(" ", 1)[0][:32]
        msg = f"unsupported authorization type {scheme!r}: use AWS4-HMAC-SHA256 (SigV4)"
        raise AuthError("InvalidRequest", msg, 400)
    if v4_query:
        return v.v4_query()
    if v2_query:
        return v.v2_query()
    return None


def payload_check(verified: Verified, body_sha256_hex: str) -> None:
    """AuthError XAmzContentSHA256Mismatch when the declared payload is a hex hash and
    the body's differs (UNSIGNED-PAYLOAD and STREAMING-* declarations pass)."""
    declared = verified.payload
    if not _HEX64_ANY_CASE.fullmatch(declared):
        return
    if not hmac.compare_digest(declared.lower(), body_sha256_hex.lower()):
        msg = "the body's SHA-256 is not the x-amz-content-sha256 the request declared"
        raise AuthError("XAmzContentSHA256Mismatch", msg, 400)


_SKEWED = "the difference between the request time and the server's time is too large"
_MISMATCH = "the request signature we calculated does not match the signature you provided"
_UNKNOWN_KEY = "the access key id does not exist in our records"


class _Check:
    """One request being verified."""

    def __init__(
        self,
        req: HttpRequest,
        secret_for: Callable[[str], str | None],
        now: float,
        service: str | None,
    ) -> None:
        self.req = req
        self.headers = _Headers(req.headers)
        self.query = _parse_query(req.raw_query)
        self.secret_for = secret_for
        self.now = now
        self.service = service
        self.v2_prefix = ""

    # --- SigV4 -------------------------------------------------------------------

    def v4_header(self, value: str, body_sha256: str | None) -> Verified:
        err = "AuthorizationHeaderMalformed"
        fields: dict[str, str] = {}
        for part in value.split(","):
            name, eq, val = part.strip().partition("=")
            if not eq or name in fields:
                raise AuthError(err, "malformed Authorization header", 400)
            fields[name] = val.strip()
        if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
            msg = "the Authorization header needs Credential, SignedHeaders and Signature"
            raise AuthError(err, msg, 400)
        amz_date = self._header_date()
        if abs(_parse_amz_date(amz_date, err) - self.now) > MAX_SKEW:
            raise AuthError("RequestTimeTooSkewed", _SKEWED)
        declared = self.headers.one("x-amz-content-sha256")
        if declared is None:
            if self.service == "s3" or body_sha256 is None:
                msg = "missing required header x-amz-content-sha256"
                raise AuthError("MissingSecurityHeader", msg, 400)
            declared = body_sha256
        return self._v4(fields, amz_date, declared, self.query, "v4-header", err)

    def v4_query(self) -> Verified:
        err = "AuthorizationQueryParametersError"
        params: dict[str, str] = {}
        for k, v in self.query:
            if k.startswith("X-Amz-"):
                if k in params:
                    raise AuthError(err, f"{k} appears more than once", 400)
                params[k] = v
        parts = ("Algorithm", "Credential", "Date", "Expires", "SignedHeaders", "Signature")
        need = [f"X-Amz-{k}" for k in parts]
        missing = [k for k in need if k not in params]
        if missing:
            raise AuthError(err, f"presigned URL lacks {', '.join(missing)}", 400)
        if params["X-Amz-Algorithm"] != _ALGORITHM:
            raise AuthError(err, f"X-Amz-Algorithm must be {_ALGORITHM}", 400)
        expires = params["X-Amz-Expires"]
        if not expires.isdigit() or not 1 <= int(expires) <= MAX_EXPIRES:
            msg = f"X-Amz-Expires must be a number of seconds 1..{MAX_EXPIRES}"
            raise AuthError(err, msg, 400)
        amz_date = params["X-Amz-Date"]
        signed_at = _parse_amz_date(amz_date, err)
        if signed_at - self.now > MAX_SKEW:
            raise AuthError("AccessDenied", "the presigned URL is not yet valid (clock skew)")
        if self.now > signed_at + int(expires):
            raise AuthError("AccessDenied", "request has expired")
        fields = {
            "Credential": params["X-Amz-Credential"],
            "SignedHeaders": params["X-Amz-SignedHeaders"],
            "Signature": params["X-Amz-Signature"],
        }
        declared = self.headers.one("x-amz-content-sha256") or UNSIGNED
        query = [(k, v) for k, v in self.query if k != "X-Amz-Signature"]
        return self._v4(fields, amz_date, declared, query, "v4-query", err)

    def _v4(
        self,
        fields: dict[str, str],
        amz_date: str,
        payload: str,
        query: list[tuple[str, str]],
        scheme: str,
        err: str,
    ) -> Verified:
        _check_payload_value(payload)
        parts = fields["Credential"].rsplit("/", 4)
        if len(parts) != 5 or not parts[0] or parts[4] != "aws4_request":
            raise AuthError(err, "Credential must be KEY/DATE/REGION/SERVICE/aws4_request", 400)
        access_key, date, region, svc, _ = parts
        if not (_SCOPE_PART.fullmatch(region) and _SCOPE_PART.fullmatch(svc)):
            raise AuthError(err, "the credential's region and service must be printable", 400)
        if date != amz_date[:8]:
            raise AuthError(err, "the credential's date is not the request's date", 400)
        if self.service is not None and svc != self.service:
            raise AuthError(err, f"the credential's service must be {self.service!r}", 400)
        signed = fields["SignedHeaders"].split(";")
        if not all(signed) or any(h != h.lower() for h in signed):
            raise AuthError(err, "SignedHeaders must be lower-case names separated by ';'", 400)
        if "host" not in signed:
            raise AuthError(err, "the host header must be signed", 400)
        for name in signed:
            if not self.headers.all(name):
                raise AuthError("AccessDenied", f"signed header {name!r} is not in the request")
        # as S3: an x-amz-* header nobody signed could change what the request does
        exempt = {"x-amz-content-sha256"} if scheme == "v4-query" else set()
        for name in sorted(self.headers.names()):
            if name.startswith("x-amz-") and name not in signed and name not in exempt:
                msg = f"headers present in the request were not signed: {name}"
                raise AuthError("AccessDenied", msg)
        signature = fields["Signature"]
        if not _HEX64.fullmatch(signature):
            raise AuthError(err, "Signature must be 64 lower-case hex digits", 400)
        secret = self.secret_for(access_key)
        if secret is None:
            raise AuthError("InvalidAccessKeyId", _UNKNOWN_KEY)
        creq = "\n".join(
            (
                self.req.method,
                _canonical_uri(self.req.raw_path),
                _canonical_query(query),
                "".join(f"{n}:{self.headers.canonical(n)}\n" for n in signed),
                fields["SignedHeaders"],
                payload,
            )
        )
        scope = f"{date}/{region}/{svc}/aws4_request"
        creq_hash = hashlib.sha256(creq.encode("utf-8", "surrogateescape")).hexdigest()
        sts = "\n".join((_ALGORITHM, amz_date, scope, creq_hash))
        key = signing_key(secret, date, region, svc)
        expected = hmac.digest(key, sts.encode(), "sha256").hex()  # one-shot, in C
        if not hmac.compare_digest(expected, signature):
            raise AuthError("SignatureDoesNotMatch", _MISMATCH)
        return Verified(access_key, payload, scheme, signature, key, amz_date, scope)

    def _header_date(self) -> str:
        amz = self.headers.one("x-amz-date")
        if amz is not None:
            return amz.strip()
        date = self.headers.one("date")
        if date is None:
            raise AuthError("AccessDenied", "the request has no x-amz-date or Date header")
        return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(_parse_http_date(date)))

    # --- SigV2 -------------------------------------------------------------------

    def v2_query(self) -> Verified:
        err = "AuthorizationQueryParametersError"
        need = ("AWSAccessKeyId", "Signature", "Expires")
        params = {k: v for k, v in self.query if k in need}
        missing = [k for k in need if k not in params]
        if missing:
            raise AuthError(err, f"presigned URL lacks {', '.join(missing)}", 400)
        expires = params["Expires"]
        if not expires.isdigit():
            raise AuthError(err, "Expires must be seconds since the epoch", 400)
        if self.now > int(expires):
            raise AuthError("AccessDenied", "request has expired")
        if int(expires) - self.now > MAX_EXPIRES + MAX_SKEW:
            raise AuthError(err, f"Expires may be at most {MAX_EXPIRES} seconds ahead", 400)
        return self.v2(f"{params['AWSAccessKeyId']}:{params['Signature']}", expires)

    def v2(self, cred: str, expires: str | None) -> Verified:
        """SigV2: ``cred`` is KEY:SIGNATURE; ``expires`` None for the header form."""
        headers = self.headers
        err = (
            "AuthorizationHeaderMalformed"
            if expires is None
            else "AuthorizationQueryParametersError"
        )
        access_key, colon, signature = cred.rpartition(":")
        if not colon or not access_key or not _V2_SIGNATURE.fullmatch(signature):
            raise AuthError(err, "SigV2 credentials must be KEY:BASE64-SIGNATURE", 400)
        if expires is None:
            date = headers.one("x-amz-date") or headers.one("date")
            if date is None:
                raise AuthError("AccessDenied", "the request has no x-amz-date or Date header")
            if abs(_parse_http_date(date) - self.now) > MAX_SKEW:
                raise AuthError("RequestTimeTooSkewed", _SKEWED)
            date_line = "" if headers.one("x-amz-date") is not None else date.strip()
        else:
            date_line = expires
        sub = sorted((k, v) for k, v in self.query if k in _V2_SUBRESOURCES)
        resource = self.v2_prefix + (self.req.raw_path or "/")
        if sub:
            resource += "?" + "&".join(f"{k}={v}" if v else k for k, v in sub)
        signed = _Headers(self.req.headers)
        if expires is not None:
            # a presigner moves the headers it signed into the query (botocore does)
            hoisted = [
                (k, v)
                for k, v in self.query
                if _v2_hoisted(k.lower()) and not headers.all(k.lower())
            ]
            signed = _Headers([*self.req.headers, *hoisted])
        amz = sorted(n for n in signed.names() if n.startswith("x-amz-"))
        sts = "\n".join(
            (
                self.req.method,
                (signed.all("content-md5") or [""])[0].strip(),
                (signed.all("content-type") or [""])[0].strip(),
                date_line,
                "".join(f"{n}:{','.join(v.strip() for v in signed.all(n))}\n" for n in amz)
                + resource,
            )
        )
        secret = self.secret_for(access_key)
        if secret is None:
            raise AuthError("InvalidAccessKeyId", _UNKNOWN_KEY)
        mac = hmac.new(secret.encode(), sts.encode("utf-8", "surrogateescape"), hashlib.sha1)
        if not hmac.compare_digest(base64.b64encode(mac.digest()).decode(), signature):
            raise AuthError("SignatureDoesNotMatch", _MISMATCH)
        return Verified(access_key, UNSIGNED, "v2-header" if expires is None else "v2-query")


def _v2_hoisted(name: str) -> bool:
    return name.startswith("x-amz-") or name in ("content-md5", "content-type")


def _check_payload_value(value: str) -> None:
    if value == UNSIGNED or value in STREAMING_PAYLOADS or _HEX64_ANY_CASE.fullmatch(value):
        return
    msg = "x-amz-content-sha256 must be a hex SHA-256, UNSIGNED-PAYLOAD or STREAMING-*"
    raise AuthError("InvalidRequest", msg, 400)


def _canonical_uri(raw_path: str) -> str:
    raw = (raw_path or "/").encode("utf-8", "surrogateescape")
    return quote(unquote_to_bytes(raw), safe="/-_.~")


def _canonical_query(query: Iterable[tuple[str, str]]) -> str:
    def enc(s: str) -> str:
        return quote(s, safe="-_.~", errors="surrogateescape")

    return "&".join(f"{k}={v}" for k, v in sorted((enc(k), enc(v)) for k, v in query))


def _parse_query(raw: str) -> list[tuple[str, str]]:
    """Decoded (name, value) pairs in order, duplicates kept, '+' not a space."""
    out = []
    for piece in raw.split("&"):
        if piece:
            k, _, v = piece.partition("=")
            out.append((_unquote(k), _unquote(v)))
    return out


def _unquote(s: str) -> str:
    # surrogateescape keeps bytes that are not UTF-8 exactly as sent, so the re-encoded
    # canonical form is the client's
    raw = unquote_to_bytes(s.encode("utf-8", "surrogateescape"))
    return raw.decode("utf-8", "surrogateescape")


# --- helpers ---------------------------------------------------------------------------


class _Headers:
    """Case-insensitive view of the received headers, duplicates kept in order."""

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._by_name: dict[str, list[str]] = {}
        for name, value in items:
            self._by_name.setdefault(name.lower(), []).append(value)

    def names(self) -> Iterable[str]:
        return self._by_name.keys()

    def all(self, name: str) -> list[str]:
        return self._by_name.get(name, [])

    def one(self, name: str) -> str | None:
        values = self._by_name.get(name)
        if not values:
            return None
        if len(values) > 1 and len(set(values)) > 1:
            raise AuthError("InvalidRequest", f"conflicting {name} headers", 400)
        return values[0]

    def canonical(self, name: str) -> str:
        return ",".join(" ".join(v.split()) for v in self._by_name[name])


@lru_cache(maxsize=256)
def _parse_amz_date(value: str, err: str) -> float:
    """Seconds since the epoch of an ISO 8601 basic date (kept: requests in flight
    together mostly share their second)."""
    if not _AMZ_DATE.fullmatch(value):
        raise AuthError(err, "the date must be in the form YYYYMMDDTHHMMSSZ", 400)
    try:
        v = value
        when = datetime(int(v[:4]), int(v[4:6]), int(v[6:8]), int(v[9:11]), int(v[11:13]))
        return when.replace(second=int(v[13:15]), tzinfo=UTC).timestamp()
    except ValueError:
        raise AuthError(err, "the date is not a valid date", 400) from None


def _parse_http_date(value: str) -> float:
    value = value.strip()
    if _AMZ_DATE.fullmatch(value):
        return _parse_amz_date(value, "AccessDenied")
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        raise AuthError("AccessDenied", "the Date header is not a valid HTTP date") from None
    if when.tzinfo is None:  # "-0000": UTC without a zone
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.digest(key, msg.encode(), "sha256")

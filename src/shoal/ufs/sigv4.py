"""AWS Signature Version 4 for the bodiless GETs of :mod:`shoal.ufs.s3get` (objects and
listing pages), with the derived signing key kept for the day it is valid.

Why not botocore's signer per request: it builds an AWSRequest, re-parses the URL and
derives the four-HMAC signing key every time, ~110 us a request on this machine kind,
about a tenth of a worker's CPU per cold small file. This module does the same
canonicalisation (S3 rules: the path as sent, not normalised; the query as sent,
pairs sorted; header values trimmed) and is checked against botocore's signer in
tests/unit/test_ufs_sigv4.py for the same clock.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

#: sha256 of an empty body: every request signed here has none
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def host_of(endpoint: str) -> str:
    """The Host header botocore signs for ``endpoint``: lowercase, IPv6 in brackets, no
    userinfo, no default port."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host


def _utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


class Signer:
    """Signs GETs to one host in one region for one set of credentials."""

    def __init__(
        self,
        host: str,
        region: str,
        creds: Mapping[str, str],
        *,
        clock: Callable[[], _dt.datetime] = _utcnow,
    ) -> None:
        self.host = host
        self.region = region
        self._key = creds["key"]
        self._secret = creds["secret"]
        self._token = creds.get("token") or ""
        self._clock = clock
        self._day = ""
        self._signing_key = b""

    def _key_for(self, day: str) -> bytes:
        if day != self._day:

            def h(k: bytes, msg: str) -> bytes:
                return hmac.new(k, msg.encode(), hashlib.sha256).digest()

            k = h(f"AWS4{self._secret}".encode(), day)
            self._signing_key = h(h(h(k, self.region), "s3"), "aws4_request")
            self._day = day
        return self._signing_key

    def sign(self, path: str, query: str, headers: Mapping[str, str]) -> dict[str, str]:
        """``headers`` plus Host, the date, payload hash, token and Authorization for a
        GET of ``path`` (percent-encoded, as sent) with ``query`` (encoded, as sent)."""
        stamp = self._clock().strftime("%Y%m%dT%H%M%SZ")
        day = stamp[:8]
        out = dict(headers)
        out["Host"] = self.host
        out["X-Amz-Date"] = stamp
        out["X-Amz-Content-SHA256"] = EMPTY_SHA256
        if self._token:
            out["X-Amz-Security-Token"] = self._token
        canon = sorted((k.lower(), " ".join(v.split())) for k, v in out.items())
        signed = ";".join(k for k, _ in canon)
        if query:
            query = "&".join(sorted(query.split("&"), key=lambda p: p.partition("=")[::2]))
        request = "\n".join(
            ("GET", path, query, *(f"{k}:{v}" for k, v in canon), "", signed, EMPTY_SHA256)
        )
        scope = f"{day}/{self.region}/s3/aws4_request"
        digest = hashlib.sha256(request.encode()).hexdigest()
        to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{digest}"
        sig = hmac.new(self._key_for(day), to_sign.encode(), hashlib.sha256).hexdigest()
        out["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self._key}/{scope}, "
            f"SignedHeaders={signed}, Signature={sig}"
        )
        return out

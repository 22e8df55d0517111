"""A lean GET for S3: one SigV4-signed request on aiohttp, for the hot path of a worker
(cold reads and loads: one ranged, conditional GET per page or small file).

Why not s3fs/aiobotocore here: profiled under a load job, ~64% of a worker's CPU went
into aiobotocore's request pipeline (event hooks, serializer, user-agent building,
response parser) for every GET, which capped one worker at ~400 GETs/s on this machine
kind while raw boto3 in four processes did ~1,000. This module signs with botocore's
own SigV4 signer (so the canonicalisation rules are botocore's) and sends the request
with aiohttp; listing and metadata calls still go through s3fs.

Used for path-style addressing against an explicit endpoint (S3-compatible stores);
other set-ups keep the s3fs path.
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from shoal.errors import (
    CredentialsError,
    FatalStoreError,
    NotFound,
    PermissionDenied,
    RetryableStoreError,
    StaleVersion,
)

_EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@dataclass
class Reply:
    status: int
    headers: Any
    body: bytes


class FastGet:
    def __init__(
        self, endpoint: str, bucket: str, region: str, creds: dict[str, str] | None
    ) -> None:
        self.base = endpoint.rstrip("/") + "/" + urllib.parse.quote(bucket, safe="")
        self.region = region
        self._creds = creds  # None = anonymous
        self._session: aiohttp.ClientSession | None = None
        self._owner: tuple[asyncio.AbstractEventLoop, int] | None = None

    def _http(self) -> aiohttp.ClientSession:
        owner = (asyncio.get_running_loop(), os.getpid())
        if self._session is None or self._owner != owner or self._session.closed:
            # a session belongs to one loop in one process (fork, new asyncio.run)
            # no session-wide timeout: each request gets its attempt's (see get)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256, ttl_dns_cache=300),
                timeout=aiohttp.ClientTimeout(total=None),
                auto_decompress=False,
            )
            self._owner = owner
        return self._session

    def _sign(self, url: str, headers: dict[str, str]) -> dict[str, str]:
        if self._creds is None:
            return headers
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        c = self._creds
        req = AWSRequest(method="GET", url=url, headers=dict(headers))
        req.headers["X-Amz-Content-SHA256"] = _EMPTY_SHA256
        S3SigV4Auth(Credentials(c["key"], c["secret"], c.get("token")), "s3", self.region).add_auth(
            req
        )
        return dict(req.headers.items())

    async def get(
        self,
        key: str,
        start: int,
        end: int | None,
        if_match: str | None,
        timeouts: tuple[float, float],
    ) -> Reply:
        """GET bytes [start, end] (inclusive; None = to the end) of one object.

        ``timeouts`` is (connect, read): seconds to connect, and how long the store may
        stay silent (for the head of its answer and between chunks of the body); no
        total, so a large body that keeps arriving is never cut."""
        url = self.base + "/" + urllib.parse.quote(key, safe="/~")
        headers = {"Range": f"bytes={start}-" + ("" if end is None else str(end))}
        if if_match is not None:
            headers["If-Match"] = f'"{if_match}"'
        signed = self._sign(url, headers)
        connect, read = timeouts
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)
        try:
            async with self._http().get(
                URL(url, encoded=True), headers=signed, timeout=timeout
            ) as r:
                body = await r.read()
                reply = Reply(r.status, r.headers, body)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # chained: the retry loop tells a silent store (a timeout) from one that
            # answered; the text never carries the request's signature
            raise RetryableStoreError(f"GET {key}: {type(exc).__name__}") from exc
        if reply.status in (200, 206, 416):
            return reply
        raise _error(reply, key)

    async def close(self) -> None:
        s, self._session = self._session, None
        if s is not None and self._owner == (asyncio.get_running_loop(), os.getpid()):
            await s.close()


def _error(r: Reply, key: str) -> Exception:
    code = ""
    text = r.body[:1000].decode("utf-8", "replace")
    if "<Code>" in text:
        code = text.split("<Code>", 1)[1].split("</Code>", 1)[0]
    why = f"GET {key}: HTTP {r.status} {code}".rstrip()
    if r.status == 412:
        return StaleVersion(f"{key} changed in under storage")
    if r.status == 404:
        return NotFound(why)
    if r.status == 403:
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return CredentialsError(why)
        return PermissionDenied(why)
    if r.status in (429, 500, 502, 503, 504) or code in ("SlowDown", "RequestTimeout"):
        return RetryableStoreError(why)
    return FatalStoreError(why)

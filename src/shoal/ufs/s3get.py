"""A lean GET for S3: one SigV4-signed request on aiohttp, for the hot paths of a worker
(cold reads and loads: one ranged, conditional GET per page or small file; cold
listings: one GET per ListObjectsV2 page, see :mod:`shoal.ufs.s3list`).

Why not s3fs/aiobotocore here: profiled under a load job, ~64% of a worker's CPU went
into aiobotocore's request pipeline (event hooks, serializer, user-agent building,
response parser) for every GET, which capped one worker at ~400 GETs/s on this machine
kind while raw boto3 in four processes did ~1,000; a cold listing spent ~70% of its
CPU in botocore's XML parser (a dateutil parse per key). Requests are signed by
:mod:`shoal.ufs.sigv4` (checked against botocore's signer) and sent with aiohttp;
metadata calls still go through s3fs.

Used for path-style addressing against an explicit endpoint (S3-compatible stores);
other set-ups keep the s3fs path. Against a plain-http endpoint requests go through
:mod:`shoal.ufs.rawget` (bodies read straight into their buffer: a worker's CPU per
cold byte was ~40% aiohttp's response path); https, and answers that module does not
frame, go through aiohttp.
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
from shoal.ufs.classify import classify_code
from shoal.ufs.rawget import RawPool, Unframed
from shoal.ufs.sigv4 import Signer, host_of


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
        #: the bucket's path as sent (S3 signs the path as sent)
        self.path = urllib.parse.urlsplit(self.base).path
        self._origin = self.base[: len(self.base) - len(self.path)]
        self.region = region
        self._host = host_of(endpoint)
        self._signer = None if creds is None else Signer(self._host, region, creds)
        parts = urllib.parse.urlsplit(endpoint)
        self._raw: RawPool | None = None
        if parts.scheme == "http" and parts.hostname:
            self._raw = RawPool(parts.hostname, parts.port or 80)
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

    async def _send(
        self, path: str, query: str, headers: dict[str, str], timeouts: tuple[float, float]
    ) -> Reply | BaseException:
        """One signed GET of ``path`` (and ``query``), both percent-encoded as sent; a
        failure to get an answer comes back as its exception."""
        if self._signer is not None:
            headers = self._signer.sign(path, query, headers)
        target = path + ("?" + query if query else "")
        if self._raw is not None:
            request = _request(target, self._host, headers)
            if request is not None:
                try:
                    status, got, body = await self._raw.get(request, timeouts)
                    return Reply(status, got, body)
                except Unframed:
                    pass  # an answer shape rawget does not read: again through aiohttp
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    return exc
        url = self._origin + target
        connect, read = timeouts
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)
        try:
            async with self._http().get(
                URL(url, encoded=True), headers=headers, timeout=timeout
            ) as r:
                return Reply(r.status, r.headers, await r.read())
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return exc

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
        path = self.path + "/" + urllib.parse.quote(key, safe="/~")
        headers = {"Range": f"bytes={start}-" + ("" if end is None else str(end))}
        if if_match is not None:
            headers["If-Match"] = f'"{if_match}"'
        reply = await self._send(path, "", headers, timeouts)
        if isinstance(reply, BaseException):
            # chained: the retry loop tells a silent store (a timeout) from one that
            # answered; the text never carries the request's signature
            raise RetryableStoreError(f"GET {key}: {type(reply).__name__}") from reply
        if reply.status in (200, 206, 416):
            return reply
        raise _error(reply, key)

    async def list_page(self, query: str, what: str, timeouts: tuple[float, float]) -> bytes:
        """The body of one ListObjectsV2 answer for ``query`` (encoded, see
        :func:`shoal.ufs.s3list.list_query`); errors are classified as botocore's
        would be through the s3fs path (:func:`shoal.ufs.classify.classify_code`)."""
        reply = await self._send(self.path, query, {}, timeouts)
        if isinstance(reply, BaseException):
            raise RetryableStoreError(f"LIST {what}: {type(reply).__name__}") from reply
        if reply.status == 200:
            return reply.body
        code = _code(reply)
        cls = classify_code(code, reply.status)
        raise cls(f"LIST {what}: {code or 'error'} (HTTP {reply.status})")

    async def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
        s, self._session = self._session, None
        if s is not None and self._owner == (asyncio.get_running_loop(), os.getpid()):
            await s.close()


def _request(target: str, host: str, headers: dict[str, str]) -> bytes | None:
    """The bytes of a GET of ``target`` (None if a header value could split the
    request: aiohttp then refuses it with its own error)."""
    if "Host" not in headers:
        headers = {"Host": host, **headers}
    lines = [f"GET {target} HTTP/1.1"]
    for k, v in headers.items():
        if "\r" in v or "\n" in v:
            return None
        lines.append(f"{k}: {v}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1")


def _code(r: Reply) -> str:
    text = r.body[:1000].decode("utf-8", "replace")
    if "<Code>" in text:
        return text.split("<Code>", 1)[1].split("</Code>", 1)[0]
    return ""


def _error(r: Reply, key: str) -> Exception:
    code = _code(r)
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

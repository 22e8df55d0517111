"""The s3:// driver: S3 and S3-compatible stores (MinIO, OSS, moto) through s3fs.

Mount options:

- ``endpoint_url``: an S3-compatible endpoint; path-style addressing is then the default
- ``region``: the bucket's region
- ``anon``: unsigned requests (public buckets)
- ``addressing``: ``path``, ``virtual`` or ``auto``
- ``credentials_file``: an AWS-style ini file (``aws_access_key_id``,
  ``aws_secret_access_key``, optional ``aws_session_token``), read each time a
  connection is built, so rotated keys are picked up
- ``profile``: the section of ``credentials_file`` (default ``default``), or without
  it a profile of the standard AWS configuration
- ``connect_timeout`` (3), ``read_timeout`` (4), ``deadline`` (8), ``hold`` (5):
  seconds; how long a connection may take, how long the store may stay silent on a
  request (before its first byte or between chunks), how long one operation may try
  over all its attempts, and how long requests fail at once after the store went
  silent (see :mod:`shoal.ufs.errors`). A black-holed store fails a read within
  ``deadline`` with a StoreTimeout that names the bucket and endpoint.

Without these, credentials come from the environment (``AWS_ACCESS_KEY_ID`` ...), the
standard AWS chain. Credentials never appear in ``repr``, ``describe()`` or messages.

Ranged reads with a version are conditional (``If-Match: <etag>``): a 412 becomes
StaleVersion without any extra round trip. Retries are shoal's alone: s3fs's and
botocore's own retry loops are switched off so backoff is decided in one place.

The s3fs instance (``asynchronous=True``, no instance cache) is created on first use
in the running loop and rebuilt when the store is used from another loop or after
fork (see :mod:`shoal.ufs.fsspec_driver`): aiobotocore sessions are bound to the loop
that made them.
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import email.utils
import logging
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from fsspec.spec import AbstractFileSystem

from shoal.core.types import FileInfo
from shoal.errors import CredentialsError, InvalidArgument
from shoal.ufs.errors import DEFAULT_RETRY, RetryPolicy, attempt_timeouts, call_with_retry
from shoal.ufs.fsspec_driver import FsspecStore, check_range
from shoal.ufs.options import DEADLINE_OPTIONS, check_known, opt_bool, opt_choice, opt_deadlines
from shoal.ufs.paths import clean_rel, join, mtime_of, redact_uri, relative, version_of
from shoal.ufs.s3get import FastGet
from shoal.ufs.s3list import Entry, ListPage, list_query, pages, parse_page

log = logging.getLogger("shoal.ufs.s3")

OPTIONS = (
    "endpoint_url",
    "region",
    "anon",
    "addressing",
    "credentials_file",
    "profile",
    *DEADLINE_OPTIONS,
)
_PAGE = 1000


def read_credentials(path: str, profile: str | None) -> dict[str, str]:
    """key/secret/token from an AWS-style ini file; CredentialsError names only the file."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except (OSError, configparser.Error) as exc:
        kind = type(exc).__name__
        raise CredentialsError(f"cannot read credentials_file {path}: {kind}") from None
    section = profile or "default"
    if not parser.has_section(section):
        raise CredentialsError(f"credentials_file {path} has no [{section}] section")
    sec = parser[section]
    key, secret = sec.get("aws_access_key_id"), sec.get("aws_secret_access_key")
    if not key or not secret:
        raise CredentialsError(
            f"credentials_file {path} [{section}] needs aws_access_key_id and aws_secret_access_key"
        )
    out = {"key": key.strip(), "secret": secret.strip()}
    token = sec.get("aws_session_token")
    if token:
        out["token"] = token.strip()
    return out


class S3Store(FsspecStore):
    """One bucket/prefix in S3 or an S3-compatible store."""

    def __init__(
        self, uri: str, options: Mapping[str, str], *, retry: RetryPolicy = DEFAULT_RETRY
    ) -> None:
        check_known("s3", options, OPTIONS)
        location = uri.split("://", 1)[1]
        if "@" in location.partition("/")[0]:
            raise InvalidArgument(
                "s3 URIs may not carry credentials; use credentials_file=PATH or the environment"
            )
        bucket_path = location.strip("/")
        if not bucket_path:
            raise InvalidArgument("s3 URI needs a bucket: s3://bucket[/prefix]")
        self._endpoint = options.get("endpoint_url") or None
        if self._endpoint and "@" in self._endpoint.split("://", 1)[-1].partition("/")[0]:
            raise InvalidArgument("endpoint_url may not carry credentials; use credentials_file")
        if self._endpoint:
            parts = urlsplit(self._endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise InvalidArgument(
                    f"endpoint_url {self._endpoint!r} is not an http:// or https:// URL"
                )
        self._region = options.get("region") or None
        self._anon = opt_bool(options, "anon", False)
        default_addr = "path" if self._endpoint else None
        self._addressing = opt_choice(options, "addressing", ("path", "virtual", "auto"))
        self._addressing = self._addressing or default_addr
        self._cred_file = options.get("credentials_file") or None
        self._profile = options.get("profile") or None
        if self._cred_file:
            read_credentials(self._cred_file, self._profile)  # fail at open time, not first read
        retry = opt_deadlines(options, retry)
        bucket = bucket_path.partition("/")[0]
        # messages name the store by bucket and endpoint (a dead proxy or MinIO is then
        # plain to see); the endpoint carries no credentials (refused above)
        name = f"s3://{bucket}" + (f" at {redact_uri(self._endpoint)}" if self._endpoint else "")
        super().__init__(
            f"s3://{bucket_path}", bucket_path, self._build, retry=retry, store_name=name
        )
        self.scheme = "s3"
        self._bucket, _, self._prefix = bucket_path.partition("/")
        self._fast: FastGet | None = None
        self._fast_tried = False

    def _build(self, loop: asyncio.AbstractEventLoop) -> AbstractFileSystem:
        import s3fs

        kwargs: dict[str, Any] = {}
        if self._cred_file:
            creds = read_credentials(self._cred_file, self._profile)
            kwargs.update(creds)
            self._scrub[:] = list(creds.values())
        elif self._profile:
            kwargs["profile"] = self._profile
        config: dict[str, Any] = {
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            # botocore's timeouts are per client, not per request: an attempt started
            # late in an operation's deadline may overrun it by up to read_timeout
            "connect_timeout": self._retry.connect_timeout,
            "read_timeout": self._retry.read_timeout,
        }
        if self._addressing:
            config["s3"] = {"addressing_style": self._addressing}
        client: dict[str, Any] = {"region_name": self._region} if self._region else {}
        fs = s3fs.S3FileSystem(
            anon=self._anon,
            endpoint_url=self._endpoint,
            client_kwargs=client,
            config_kwargs=config,
            asynchronous=True,
            loop=loop,
            skip_instance_cache=True,
            use_listings_cache=False,
            **kwargs,
        )
        fs.retries = 1  # shoal.ufs.errors decides retries
        return fs

    def _discard(self, fs: AbstractFileSystem) -> None:
        # its loop is gone or belongs to another process: awaiting a close there is
        # impossible, so close the connection pools synchronously
        http = getattr(getattr(getattr(fs, "_s3", None), "_endpoint", None), "http_session", None)
        for session in list((getattr(http, "_sessions", None) or {}).values()):
            connector = getattr(session, "connector", None)
            if connector is not None:
                with contextlib.suppress(RuntimeError):  # "Event loop is closed"
                    connector._close()

    def _key(self, rel: str) -> str:
        return join(self._prefix, rel) if self._prefix else clean_rel(rel)

    def _fast_get(self) -> FastGet | None:
        """The lean GET path (see shoal.ufs.s3get) where it applies: path-style requests
        to an explicit endpoint, with credentials resolved the way s3fs would."""
        if self._fast is not None or self._fast_tried:
            return self._fast
        self._fast_tried = True
        if not self._endpoint or self._addressing != "path":
            return None
        creds: dict[str, str] | None = None
        env_key = os.environ.get("AWS_ACCESS_KEY_ID")
        env_secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
        if self._cred_file:
            creds = read_credentials(self._cred_file, self._profile)
        elif not self._anon and not self._profile and env_key and env_secret:
            # what botocore's chain takes first without a profile (its EnvProvider),
            # read without importing botocore.session: ~0.3 s of a cold worker's CPU
            creds = {"key": env_key, "secret": env_secret}
            token = os.environ.get("AWS_SESSION_TOKEN") or os.environ.get("AWS_SECURITY_TOKEN")
            if token:
                creds["token"] = token
        elif not self._anon:
            import botocore.session

            found = botocore.session.Session(profile=self._profile).get_credentials()
            if found is None:
                return None  # the s3fs path raises the proper CredentialsError
            frozen = found.get_frozen_credentials()
            creds = {"key": frozen.access_key, "secret": frozen.secret_key}
            if frozen.token:
                creds["token"] = frozen.token
        if creds is not None:
            self._scrub[:] = list(creds.values())
        region = (
            self._region
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
        )
        self._fast = FastGet(self._endpoint, self._bucket, region, creds)
        return self._fast

    async def _get(
        self, rel: str, start: int, end: int | None, version: str | None
    ) -> tuple[Any, bytes] | None:
        """One GET on the lean path: (headers, body), or None for an empty range (416)."""
        fast = self._fast_get()
        assert fast is not None
        key = self._key(rel)

        async def once() -> Any:
            return await fast.get(key, start, end, version, attempt_timeouts(self._retry))

        reply = await call_with_retry(
            once, self._where(rel), policy=self._retry, scrub=self._scrub, health=self._health
        )
        if reply.status == 416:
            return None
        return reply.headers, reply.body  # case-insensitive: servers spell ETag their way

    async def read(self, path: str, start: int, end: int, version: str | None = None) -> bytes:
        rel = clean_rel(path)
        check_range(start, end)
        if start == end:
            return b""
        if self._fast_get() is not None:
            got = await self._get(rel, start, end - 1, version)
            if got is None and version is not None:
                await self._check_version(rel, version)
            return b"" if got is None else got[1]
        kw: dict[str, Any] = {"Bucket": self._bucket, "Key": self._key(rel)}
        kw["Range"] = f"bytes={start}-{end - 1}"
        if version is not None:
            kw["IfMatch"] = f'"{version}"'

        async def op(fs: AbstractFileSystem) -> bytes:
            try:
                resp = await fs._call_s3("get_object", **kw)
            except OSError as exc:
                if _is_invalid_range(exc):
                    return b""  # start at or beyond the end: nothing to return
                raise
            body = resp["Body"]
            try:
                return bytes(await body.read())
            finally:
                body.close()

        data = await self._run(rel, op)
        if not data and version is not None:
            await self._check_version(rel, version)  # 416 carried no If-Match verdict
        return data

    async def read_head(self, path: str, length: int) -> tuple[FileInfo, bytes]:
        """One ranged GET: its ETag, Content-Range total and body give info and data,
        so a cold small file costs one request, like a plain GET."""
        rel = clean_rel(path)
        if self._fast_get() is not None:
            got = await self._get(rel, 0, max(0, length - 1), None)
            if got is None:
                return await self.info(rel), b""
            headers, body = got
            total = str(headers.get("Content-Range") or "").rpartition("/")[2]
            size = int(total) if total.isdigit() else len(body)
            mtime = 0.0
            lm = headers.get("Last-Modified")
            if lm:
                with contextlib.suppress(TypeError, ValueError):
                    mtime = email.utils.parsedate_to_datetime(lm).timestamp()
            etag = str(headers.get("ETag") or "")
            info = FileInfo(rel, size, version_of({"ETag": etag}, size, mtime), mtime, False)
            return info, body
        kw: dict[str, Any] = {
            "Bucket": self._bucket,
            "Key": self._key(rel),
            "Range": f"bytes=0-{max(0, length - 1)}",
        }

        async def op(fs: AbstractFileSystem) -> tuple[dict[str, Any], bytes] | None:
            try:
                resp = await fs._call_s3("get_object", **kw)
            except OSError as exc:
                if _is_invalid_range(exc):
                    return None  # an empty object
                raise
            body = resp["Body"]
            try:
                return resp, bytes(await body.read())
            finally:
                body.close()

        got = await self._run(rel, op)
        if got is None:
            info = await self.info(rel)
            return info, b""
        resp, data = got
        total = str(resp.get("ContentRange") or "").rpartition("/")[2]
        size = int(total) if total.isdigit() else len(data)
        mtime = mtime_of(resp)
        info = FileInfo(rel, size, version_of(resp, size, mtime), mtime, False)
        return info, data

    def _lean_pages(
        self, fast: FastGet, rel: str, delimiter: str | None
    ) -> AsyncIterator[ListPage]:
        """The listing pages below ``rel`` on the lean path, each page retried on its own."""
        key = self._key(rel)
        prefix = f"{key}/" if key else ""
        where = self._where(rel)

        async def fetch(token: str | None) -> ListPage:
            query = list_query(prefix, delimiter, token, _PAGE)

            async def once() -> ListPage:
                timeouts = attempt_timeouts(self._retry)
                return parse_page(await fast.list_page(query, where, timeouts))

            return await call_with_retry(
                once, where, policy=self._retry, scrub=self._scrub, health=self._health
            )

        return pages(fetch)

    def _entry(self, key: str, size: int, etag: str, mtime: float) -> FileInfo:
        return FileInfo(
            relative(self._root, f"{self._bucket}/{key}"),
            size,
            version_of({"ETag": etag}, size, mtime),
            mtime,
            False,
        )

    def _entries(self, contents: Iterable[Entry]) -> list[FileInfo]:
        return [self._entry(*e) for e in contents]

    async def ls(self, path: str) -> list[FileInfo]:
        fast = self._fast_get()
        if fast is None:
            return await super().ls(path)
        rel = clean_rel(path)
        infos: list[FileInfo] = []
        async for page in self._lean_pages(fast, rel, "/"):
            infos += self._entries(page.contents)
            for p in page.prefixes:
                name = relative(self._root, f"{self._bucket}/{p[:-1]}")
                infos.append(FileInfo(name, 0, version_of({}, 0, 0.0), 0.0, True))
        if not infos:
            # an empty directory, a file or nothing at all: s3fs's rules decide, as before
            return await super().ls(path)
        return self._children(rel, infos)

    async def walk(self, path: str = "") -> AsyncIterator[FileInfo]:
        fast = self._fast_get()
        if fast is not None:
            async for info in self._lean_walk(fast, clean_rel(path)):
                yield info
            return
        rel = clean_rel(path)
        key = self._key(rel)
        kw: dict[str, Any] = {"Bucket": self._bucket, "Prefix": f"{key}/" if key else ""}
        kw["MaxKeys"] = _PAGE
        any_found = False
        while True:
            page_kw = dict(kw)

            async def op(fs: AbstractFileSystem, page_kw: dict[str, Any] = page_kw) -> Any:
                return await fs._call_s3("list_objects_v2", **page_kw)

            page = await self._run(rel, op)
            for obj in page.get("Contents", []):
                if obj["Key"].endswith("/"):
                    continue  # a directory marker
                any_found = True
                yield self._object_info(obj)
            if not page.get("IsTruncated"):
                break
            kw["ContinuationToken"] = page["NextContinuationToken"]
        if not any_found:
            found = await self.info(rel)  # NotFound for a missing path
            if not found.is_dir:
                yield found

    async def _lean_walk(self, fast: FastGet, rel: str) -> AsyncIterator[FileInfo]:
        any_found = False
        async for page in self._lean_pages(fast, rel, None):
            for e in page.contents:
                if e[0].endswith("/"):
                    continue  # a directory marker
                any_found = True
                yield self._entry(*e)
        if not any_found:
            found = await self.info(rel)  # NotFound for a missing path
            if not found.is_dir:
                yield found

    def _object_info(self, obj: Mapping[str, Any]) -> FileInfo:
        size = int(obj.get("Size") or 0)
        mtime = mtime_of(dict(obj))
        return FileInfo(
            path=relative(self._root, f"{self._bucket}/{obj['Key']}"),
            size=size,
            version=version_of(dict(obj), size, mtime),
            mtime=mtime,
            is_dir=False,
        )

    async def close(self) -> None:
        if self._fast is not None:
            await self._fast.close()
        fs, self._fs = self._fs, None
        creator = getattr(fs, "_s3creator", None)
        if creator is None:
            return
        if self._fs_loop is asyncio.get_running_loop():
            await creator.__aexit__(None, None, None)
        elif fs is not None:
            self._discard(fs)


def _is_invalid_range(exc: BaseException) -> bool:
    cause = exc.__cause__
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return False
    code = (response.get("Error") or {}).get("Code")
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code == "InvalidRange" or status == 416


def open_s3(uri: str, options: Mapping[str, str]) -> S3Store:
    return S3Store(uri, options)


__all__ = ["OPTIONS", "S3Store", "open_s3", "read_credentials"]

"""The webhdfs:// driver: HDFS (or an HttpFS gateway) over its REST API, through
fsspec's WebHDFS implementation (sync, ``requests``; called from worker threads).

URI: ``webhdfs://[user@]namenode[:port]/path`` (port 9870 when omitted). Mount options:
``user`` (the simple-auth user name), ``use_https``, ``connect_timeout`` (3),
``read_timeout`` (4), ``deadline`` (8), ``hold`` (5) as for s3 (see
:mod:`shoal.ufs.errors`), and ``timeout``: one value for both the connect and the read
timeout of every HTTP request (then not cut to the deadline). Kerberos (SPNEGO) is not
supported.

A ranged read is one OPEN with offset and length (following the namenode's redirect
to a datanode); HDFS has no conditional read, so with a version the file status is
checked before and after and a change raises StaleVersion. version = size-mtime.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from fsspec.spec import AbstractFileSystem
from fsspec.utils import infer_storage_options

from shoal.errors import InvalidArgument, StaleVersion
from shoal.ufs.errors import DEFAULT_RETRY, RetryPolicy, attempt_timeouts
from shoal.ufs.fsspec_driver import FsspecStore, check_range
from shoal.ufs.options import DEADLINE_OPTIONS, check_known, opt_bool, opt_deadlines, opt_float
from shoal.ufs.paths import clean_rel

log = logging.getLogger("shoal.ufs.webhdfs")

OPTIONS = ("user", "use_https", "timeout", "kerberos", *DEADLINE_OPTIONS)
DEFAULT_PORT = 9870


class WebHdfsStore(FsspecStore):
    """One directory of an HDFS cluster reached over WebHDFS."""

    # fsspec's WebHDFS raises these for RemoteExceptions it does not map itself
    backend_errors = (RuntimeError, ValueError)

    def __init__(
        self, uri: str, options: Mapping[str, str], *, retry: RetryPolicy = DEFAULT_RETRY
    ) -> None:
        check_known("webhdfs", options, OPTIONS)
        if opt_bool(options, "kerberos", False):
            raise InvalidArgument(
                "webhdfs: kerberos (SPNEGO) authentication is not supported; "
                "use simple auth (user=NAME) or an HttpFS gateway"
            )
        parts = infer_storage_options(uri)
        if parts.get("password"):
            raise InvalidArgument("webhdfs URIs may not carry a password; use user=NAME")
        host = parts.get("host") or ""
        if not host:
            raise InvalidArgument("webhdfs URI needs a namenode: webhdfs://host[:port]/path")
        self._host = str(host)
        self._port = int(parts.get("port") or DEFAULT_PORT)
        self._user = options.get("user") or parts.get("username") or None
        self._https = opt_bool(options, "use_https", False)
        #: an explicit per-request timeout, else each attempt's (see _build)
        self._timeout = opt_float(options, "timeout", 0.0) if "timeout" in options else None
        retry = opt_deadlines(options, retry)
        root = "/" + str(parts.get("path") or "").strip("/")
        super().__init__(
            f"webhdfs://{self._host}:{self._port}{root}",
            root,
            self._build,
            retry=retry,
            store_name=f"webhdfs://{self._host}:{self._port}",
        )
        self.scheme = "webhdfs"

    def _build(self, loop: asyncio.AbstractEventLoop) -> AbstractFileSystem:
        from fsspec.implementations.webhdfs import WebHDFS

        fs = WebHDFS(
            self._host,
            port=self._port,
            user=self._user,
            use_https=self._https,
            skip_instance_cache=True,
            use_listings_cache=False,
        )
        # requests has no session-wide timeout; without one a stuck namenode hangs a
        # thread. Each request takes its attempt's (connect, read) timeouts, read when
        # it is sent: asyncio.to_thread carries the attempt's context into the thread.
        send = fs.session.request

        def request(*args: Any, **kwargs: Any) -> Any:
            if "timeout" not in kwargs:
                fixed = self._timeout
                kwargs["timeout"] = fixed if fixed is not None else attempt_timeouts(self._retry)
            return send(*args, **kwargs)

        fs.session.request = request
        return fs

    async def read(self, path: str, start: int, end: int, version: str | None = None) -> bytes:
        rel = clean_rel(path)
        check_range(start, end)
        if start == end:
            return b""
        before = await self.info(rel)
        if version is not None and before.version != version:
            raise StaleVersion(
                f"{self._where(rel)}: changed (version {before.version}, wanted {version})"
            )
        end = min(end, before.size)
        if start >= end:
            return b""
        full = self._full(rel)

        def fetch(fs: Any) -> bytes:
            out = fs._call("OPEN", path=full, offset=start, length=end - start, redirect=False)
            if "Location" in out.headers:  # the namenode points at a datanode
                out = fs.session.get(fs._apply_proxy(out.headers["Location"]))
                out.raise_for_status()
            return bytes(out.content)

        async def op(fs: AbstractFileSystem) -> bytes:
            return await asyncio.to_thread(fetch, fs)

        data = await self._run(rel, op)
        if version is not None:
            await self._check_version(rel, version)
        return data


def open_webhdfs(uri: str, options: Mapping[str, str]) -> WebHdfsStore:
    return WebHdfsStore(uri, options)

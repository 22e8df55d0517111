"""Test helpers for S3: a moto S3 server in a subprocess on a free 127.0.0.1 port,
bucket seeding with dummy credentials, and a counting reverse proxy.

Nothing here touches global state (no environment variables are set); every helper
binds only 127.0.0.1. Typical use::

    with MotoServer() as moto, CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, "data", {"a/b.bin": b"..."})
        # point the store under test at proxy.endpoint, then:
        proxy.counts()            # {"GET": 3, "GET_range": 2, "HEAD": 1, ...}
        proxy.counts_for("data/a/b.bin")["GET"]
        proxy.reset()

From another process: ``GET <proxy.endpoint>/__counts__`` returns the same JSON and
``POST <proxy.endpoint>/__reset__`` zeroes it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

log = logging.getLogger("shoal.testing.s3")

#: the dummy credentials moto accepts; pass them explicitly, never via os.environ
CREDENTIALS = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "region_name": "us-east-1",
}
_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "content-length",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5):
            return True
    except urllib.error.HTTPError:
        return True  # it speaks HTTP
    except OSError:
        return False


def start_moto(timeout: float = 15.0) -> tuple[subprocess.Popen[bytes], str]:
    """Launch ``python -m moto.server`` on a free port; (process, endpoint_url)."""
    for _ in range(3):  # the port found free may be taken before moto binds it
        port = free_port()
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers(endpoint + "/moto-api/"):
                return proc, endpoint
            time.sleep(0.1)
        stop_moto(proc)
    raise RuntimeError(f"moto server did not answer within {timeout}s")


def stop_moto(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class MotoServer:
    """``with MotoServer() as moto: moto.endpoint`` -- a moto S3 server subprocess."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""

    def start(self) -> MotoServer:
        self.proc, self.endpoint = start_moto()
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_moto(self.proc)
            self.proc = None

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def s3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, **CREDENTIALS)


def make_bucket(endpoint: str, bucket: str, files: dict[str, bytes] | None = None) -> None:
    """Create ``bucket`` (if needed) and put ``files`` (key -> bytes) into it."""
    client = s3_client(endpoint)
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    for key, data in (files or {}).items():
        client.put_object(Bucket=bucket, Key=key, Body=data)


def write_credentials_file(
    path: str | os.PathLike[str],
    key: str = "testing",
    secret: str = "testing",
    profile: str = "default",
) -> str:
    """An AWS-style credentials file for the ``credentials_file`` mount option."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"[{profile}]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n")
    return os.fspath(path)


class CountingProxy:
    """A reverse proxy in front of an S3 endpoint that counts requests.

    Counts are keyed by method, plus ``<METHOD>_range`` for requests with a Range
    header and ``<METHOD>_range_bytes`` for the bytes those asked for; ``counts_for(path)``
    gives the same per request path (``bucket/key``).
    Runs its own event loop on a daemon thread; start/stop are explicit.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.endpoint = ""
        self._lock = threading.Lock()
        self._total: collections.Counter[str] = collections.Counter()
        self._by_path: dict[str, collections.Counter[str]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None

    # -- counts ---------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._total)

    def counts_for(self, path: str) -> dict[str, int]:
        with self._lock:
            return dict(self._by_path.get(path.strip("/"), {}))

    def reset(self) -> None:
        with self._lock:
            self._total.clear()
            self._by_path.clear()

    def _count(self, request: web.Request) -> None:
        keys = [request.method]
        rng = request.headers.get("Range", "")
        asked = 0
        if rng:
            keys.append(f"{request.method}_range")
            first, _, last = rng.removeprefix("bytes=").partition("-")
            if first.isdigit() and last.isdigit():
                asked = int(last) - int(first) + 1
        path = request.path.strip("/")
        with self._lock:
            per = self._by_path.setdefault(path, collections.Counter())
            for k in keys:
                self._total[k] += 1
                per[k] += 1
            if asked:  # bytes the ranged requests asked for ("bytes=a-b" ones)
                self._total[f"{request.method}_range_bytes"] += asked
                per[f"{request.method}_range_bytes"] += asked

    # -- serving --------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/__counts__" and request.method == "GET":
            with self._lock:
                body = {
                    "total": dict(self._total),
                    "paths": {p: dict(c) for p, c in self._by_path.items()},
                }
            return web.json_response(body)
        if request.path == "/__reset__" and request.method == "POST":
            self.reset()
            return web.json_response({"ok": True})
        self._count(request)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        data = await request.read()
        async with self._session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=data if data else None,
            allow_redirects=False,
        ) as up:
            payload = await up.read()
            resp = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in _HOP:
                    resp.headers.add(k, v)
            length = up.headers.get("Content-Length")
            resp.content_length = int(length) if length is not None else len(payload)
            await resp.prepare(request)
            if request.method != "HEAD":
                await resp.write(payload)
            await resp.write_eof()
            return resp

    async def _start(self) -> str:
        self._session = ClientSession(
            auto_decompress=False,
            timeout=ClientTimeout(total=60),
            skip_auto_headers=("User-Agent", "Content-Type"),
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server: Any = site._server
        port = server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def start(self) -> CountingProxy:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="counting-proxy", daemon=True)
        self._thread.start()
        self.endpoint = asyncio.run_coroutine_threadsafe(self._start(), loop).result(10)
        return self

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()

    def __enter__(self) -> CountingProxy:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def fetch_counts(proxy_endpoint: str) -> dict[str, Any]:
    """``{"total": {...}, "paths": {...}}`` from a proxy, possibly in another process."""
    with urllib.request.urlopen(proxy_endpoint.rstrip("/") + "/__counts__", timeout=5) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def reset_counts(proxy_endpoint: str) -> None:
    req = urllib.request.Request(proxy_endpoint.rstrip("/") + "/__reset__", method="POST")
    with urllib.request.urlopen(req, timeout=5):
        pass

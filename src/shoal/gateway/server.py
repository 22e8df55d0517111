"""HTTP plumbing shared by the gateways: running an aiohttp application on uvloop
(optionally TLS), printing the bound URL, and sending a file range to a response.

Sending files: uvloop has no ``loop.sendfile`` (it raises NotImplementedError), so
:func:`send_file_range` calls ``os.sendfile`` itself from a worker thread on the
connection's socket once the response headers have left the transport's buffer; the
thread waits for writability with ``poll`` (the event loop never watches this socket
for writes while its buffer is empty, so the two never race). Over TLS, or when the
headers are still buffered, it copies in 8 MiB preads instead: never 64 KiB at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import select
import signal
import ssl
import sys
from collections.abc import Callable

from aiohttp import web

from shoal.core.tls import server_context

__all__ = ["COPY_CHUNK", "run_http", "send_file_range", "serve_forever"]

log = logging.getLogger("shoal.gateway.server")

#: bytes per pread when a file range cannot go out with sendfile
COPY_CHUNK = 8 << 20
#: bytes per sendfile(2) call (one call may send less)
_SENDFILE_CHUNK = 64 << 20
#: seconds a sendfile thread waits for a peer that reads nothing
_STALL_S = 60.0


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The gateway's server context: the cluster's (:func:`shoal.core.tls.server_context`)."""
    return server_context(cert, key)


async def run_http(
    app: web.Application,
    host: str,
    port: int,
    tls_cert: str | None,
    tls_key: str | None,
    banner: str,
    *,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``app`` on host:port (0: a free port) until SIGTERM/SIGINT or cancellation.

    ``banner`` is formatted with ``url`` (e.g. "shoal s3 gateway listening on {url}")
    and printed as one flushed line on stdout once the socket is bound, so a parent
    process that started the gateway on port 0 can read its address."""
    ctx = tls_context(tls_cert, tls_key)
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        # keep-alive: many small GETs reuse one connection
        keepalive_timeout=75.0,
        shutdown_timeout=5.0,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ctx, backlog=1024, reuse_address=True)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        scheme = "https" if ctx else "http"
        shown = f"[{host}]" if ":" in host else host
        url = f"{scheme}://{shown}:{bound}"
        print(banner.format(url=url), flush=True)
        if ready is not None:
            ready(url)
        await serve_forever()
    finally:
        await runner.cleanup()


def write_url(path: str, url: str) -> None:
    """``url`` into ``path`` whole (a temporary name, then a rename): a parent polling
    for the file (``shoal up``) never reads half of it."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(url + "\n")
    os.replace(tmp, path)


async def serve_forever() -> None:
    """Wait for SIGTERM or SIGINT (or cancellation)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


async def send_file_range(
    request: web.Request, resp: web.StreamResponse, fd: int, offset: int, count: int
) -> int:
    """Send ``count`` bytes of ``fd`` from ``offset`` as the body of the prepared
    ``resp``; return the bytes sent. The caller owns ``fd`` and ends the response."""
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("connection lost")
    sock = transport.get_extra_info("socket")
    plain = transport.get_extra_info("sslcontext") is None and sock is not None
    if plain and count > 0 and transport.get_write_buffer_size() == 0 and sys.platform == "linux":
        log.debug("sendfile of %d bytes", count)
        return await asyncio.to_thread(_sendfile_blocking, sock.fileno(), fd, offset, count)
    log.debug("copy of %d bytes in %d-byte preads", count, COPY_CHUNK)
    sent = 0
    while sent < count:
        n = min(COPY_CHUNK, count - sent)
        chunk = await asyncio.to_thread(os.pread, fd, n, offset + sent)
        if not chunk:
            raise OSError(errno.EIO, "file shorter than its size")
        await resp.write(chunk)
        sent += len(chunk)
    return sent


def _sendfile_blocking(sock_fd: int, fd: int, offset: int, count: int) -> int:
    sent = 0
    while sent < count:
        try:
            n = os.sendfile(sock_fd, fd, offset + sent, min(_SENDFILE_CHUNK, count - sent))
        except BlockingIOError:
            poll = select.poll()
            poll.register(sock_fd, select.POLLOUT)
            if not poll.poll(_STALL_S * 1000):
                raise TimeoutError("the peer stopped reading") from None
            continue
        if n == 0:
            raise OSError(errno.EIO, "file shorter than its size")
        sent += n
    return sent

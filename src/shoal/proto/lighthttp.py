"""A small HTTP/1.1 client on asyncio streams, for the GETs a reader sends the master
(the ring and its dataset's definition, then a manifest or a refresh now and then).

Why not aiohttp for those: importing it costs a new process about 0.2 s (its connector
builds an SSL context at import), more than the rest of a first read; a DataLoader
worker or a short script pays that before its first byte. This needs nothing beyond
asyncio, which the client imports anyway. aiohttp stays the client for everything else
(writes, jobs, admin calls; see :mod:`shoal.proto.master_api`).

What it does: keep-alive connections per (scheme, host, port), reused LIFO, with one
retry on a fresh connection when a reused one turns out to have been closed by the
server before it answered (idempotent methods only); bodies delimited by
Content-Length, chunked transfer coding, or the connection's close; TLS with the
caller's context (the cluster's CA) or the system's CAs; a connect timeout and a total
one. What it does not: redirects, proxies, cookies, compression (it asks for
``identity``), request bodies beyond a few bytes of JSON, HTTP/2.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator, Mapping
from urllib.parse import urlencode, urlsplit

from shoal.core.records import record

__all__ = ["BadResponse", "ConnectError", "Headers", "LightHTTP", "Reply"]

#: the largest body accepted (a large dataset's manifest is tens of MB)
MAX_BODY = 1 << 30
#: header lines and bytes accepted in one answer
MAX_HEADERS = 128
MAX_HEAD_BYTES = 64 << 10
#: idle connections kept per (scheme, host, port)
KEEP_IDLE = 4
#: seconds close() waits for its connections to be closed
CLOSE_WAIT = 1.0
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})

#: connections inherited through fork, kept so that no finalizer ever closes them here
_DISOWNED: list[object] = []


class ConnectError(OSError):
    """Nothing was sent: the address did not resolve, refused, failed the TLS handshake
    for another reason than an untrusted certificate, or did not answer in time."""


class BadResponse(Exception):
    """The server's answer is not HTTP/1.x, exceeds a limit, or stopped short."""


class Headers(Mapping[str, str]):
    """An answer's headers, looked up case-insensitively (repeated ones joined with ", ")."""

    def __init__(self, items: dict[str, str]) -> None:
        self._items = items  # lower-case names

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@record(slots=False)
class Reply:
    status: int
    body: bytes
    headers: Headers


@record(slots=False, frozen=False)
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class _Stale(Exception):
    """A reused connection closed before any byte of the answer (the server timed it out)."""


class LightHTTP:
    """Requests over pooled keep-alive connections. ``ssl``: the context https servers
    are checked with (None: the system's CAs, loaded on the first https request)."""

    def __init__(
        self, ssl_context: ssl.SSLContext | None = None, total: float = 30.0, connect: float = 5.0
    ) -> None:
        self._ssl = ssl_context
        self.total = total
        self.connect = connect
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}

    async def get(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        total: float | None = None,
    ) -> Reply:
        return await self.request("GET", url, headers, params=params, total=total)

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
        params: Mapping[str, str] | None = None,
        total: float | None = None,
    ) -> Reply:
        """One request. Raises ConnectError when nothing was sent, ssl.SSLCertVerificationError
        for an untrusted certificate, TimeoutError past ``total`` seconds, BadResponse
        for a malformed answer, OSError when the connection failed during the exchange."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {parts.scheme}://{parts.hostname or ''}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        target = parts.path or "/"
        query = "&".join(q for q in (parts.query, urlencode(params or {})) if q)
        if query:
            target += "?" + query
        head = _head(method, target, parts.netloc.rpartition("@")[2], headers or {}, body)
        key = (parts.scheme, parts.hostname, port)
        async with asyncio.timeout(self.total if total is None else total):
            for _ in range(2):
                conn, reused = await self._take(key, tls)
                try:
                    reply, keep = await _exchange(conn, method, head + body, reused)
                except _Stale:
                    conn.close()
                    if method in _IDEMPOTENT:
                        continue  # one more try, on a new connection
                    raise ConnectionResetError("the server closed the connection") from None
                except BaseException:
                    conn.close()
                    raise
                if keep:
                    self._give(key, conn)
                else:
                    conn.close()
                return reply
        raise ConnectionResetError("the server closed the connection")  # pragma: no cover

    async def _take(self, key: tuple[str, str, int], tls: bool) -> tuple[_Conn, bool]:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn, True
            conn.close()
        ctx = self._context() if tls else None
        try:
            async with asyncio.timeout(self.connect):
                r, w = await asyncio.open_connection(
                    key[1], key[2], ssl=ctx, server_hostname=key[1] if ctx else None
                )
        except ssl.SSLCertVerificationError:
            raise
        except (OSError, TimeoutError) as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else str(exc) or repr(exc)
            raise ConnectError(f"cannot connect to {key[1]}:{key[2]}: {why}") from None
        return _Conn(r, w), False

    def _give(self, key: tuple[str, str, int], conn: _Conn) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < KEEP_IDLE:
            idle.append(conn)
        else:
            conn.close()

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    async def close(self) -> None:
        conns = [c for idle in self._idle.values() for c in idle]
        self._idle.clear()
        for c in conns:
            c.close()
        if conns:
            # bounded: a TLS peer that never answers the close_notify holds no one up
            waits = asyncio.gather(*(c.writer.wait_closed() for c in conns), return_exceptions=True)
            try:
                await asyncio.wait_for(waits, CLOSE_WAIT)
            except TimeoutError:
                pass

    def abandon(self) -> None:
        """Forget the connections without closing them (after fork: the parent's)."""
        _DISOWNED.extend(c for idle in self._idle.values() for c in idle)
        self._idle.clear()


def _head(method: str, target: str, host: str, headers: Mapping[str, str], body: bytes) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity"]
    for name, value in headers.items():
        if any(c in name + value for c in "\r\n\0") or ":" in name:
            raise ValueError(f"header {name[:40]!r}: a line break or NUL in it")
        lines.append(f"{name}: {value}")
    if body or method not in _IDEMPOTENT:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _exchange(conn: _Conn, method: str, data: bytes, reused: bool) -> tuple[Reply, bool]:
    """Send ``data``; the answer and whether the connection can carry another request."""
    r = conn.reader
    try:
        conn.writer.write(data)
        await conn.writer.drain()
        line = await r.readline()
    except (ConnectionResetError, BrokenPipeError):
        if reused:
            raise _Stale from None
        raise
    except ValueError:  # readline's limit
        raise BadResponse("a status line longer than the limit") from None
    if not line:
        if reused:
            raise _Stale
        raise BadResponse("the server closed the connection without an answer")
    while True:
        status, version = _status(line)
        headers = await _headers(r)
        if not 100 <= status < 200 or status == 101:
            break
        try:
            line = await r.readline()  # an interim answer (100 Continue): the real one follows
        except ValueError:
            raise BadResponse("a status line longer than the limit") from None
    h = Headers(headers)
    keep = version == "HTTP/1.1" and "close" not in h.get("connection", "").lower()
    if method == "HEAD" or status in (101, 204, 304):
        return Reply(status, b"", h), keep and status != 101
    try:
        if "chunked" in h.get("transfer-encoding", "").lower():
            body = await _chunked(r)
        elif "content-length" in h:
            n = _int(h["content-length"], 10, "Content-Length")
            body = await r.readexactly(n)
        else:
            body = await r.read(MAX_BODY + 1)  # delimited by the close
            keep = False
            if len(body) > MAX_BODY:
                raise BadResponse(f"an answer of more than {MAX_BODY} bytes")
    except asyncio.IncompleteReadError as exc:
        raise BadResponse(f"the connection closed {len(exc.partial)} bytes into a body") from None
    except asyncio.LimitOverrunError:
        raise BadResponse("a chunk header longer than the limit") from None
    return Reply(status, body, h), keep


def _status(line: bytes) -> tuple[int, str]:
    parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1].isdigit():
        raise BadResponse(f"not an HTTP/1.x status line: {line[:60]!r}")
    return int(parts[1]), parts[0]


async def _headers(r: asyncio.StreamReader) -> dict[str, str]:
    out: dict[str, str] = {}
    size = 0
    for _ in range(MAX_HEADERS + 1):
        try:
            line = await r.readline()
        except (asyncio.LimitOverrunError, ValueError):
            raise BadResponse("a header line longer than the limit") from None
        size += len(line)
        if size > MAX_HEAD_BYTES:
            raise BadResponse(f"headers of more than {MAX_HEAD_BYTES} bytes")
        if line in (b"\r\n", b"\n"):
            return out
        if not line:
            raise BadResponse("the connection closed in the headers")
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise BadResponse(f"a malformed header line: {line[:60]!r}")
        k, v = name.strip().lower(), value.strip()
        out[k] = f"{out[k]}, {v}" if k in out else v
    raise BadResponse(f"more than {MAX_HEADERS} header lines")


async def _chunked(r: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        line = await r.readline()
        if not line:
            raise asyncio.IncompleteReadError(b"", None)
        n = _int(line.split(b";", 1)[0].strip().decode("latin-1"), 16, "chunk size")
        if n == 0:
            await _headers(r)  # trailers, ignored
            return b"".join(chunks)
        total += n
        if total > MAX_BODY:
            raise BadResponse(f"an answer of more than {MAX_BODY} bytes")
        chunks.append(await r.readexactly(n))
        if await r.readexactly(2) != b"\r\n":
            raise BadResponse("a chunk not followed by CRLF")


def _int(text: str, base: int, what: str) -> int:
    digits = "0123456789" if base == 10 else "0123456789abcdefABCDEF"
    if not text or len(text) > 16 or any(c not in digits for c in text):
        raise BadResponse(f"a malformed {what}: {text[:20]!r}")
    n = int(text, base)
    if n > MAX_BODY:
        raise BadResponse(f"a {what} out of range: {n}")
    return n

"""What a new sync client learns from the master before it has an event loop: the
ring and a dataset's definition, over blocking HTTP GETs on the caller's thread
(:mod:`shoal.client.direct`), and how a ring answer is read (shared with the async
control plane, :mod:`shoal.client.control`).

Not :mod:`shoal.proto.lighthttp` (asyncio streams: the import and the loop thread this
path exists to avoid) nor ``http.client`` (it imports ``ssl`` and ``email``, tens of
milliseconds of a new process). Deliberately small: plain ``http://`` masters only, one GET per connection
(``Connection: close``), answers delimited by Content-Length, chunked coding or the
connection's end. Anything else -- https, credentials in the URL, an answer that is
not a 200 with JSON -- raises :class:`NotPlain`, and the caller leaves the request to
the async client (:class:`~shoal.proto.master_api.MasterAPI`), which handles TLS,
redirects of masters and error answers in its own words.
"""

from __future__ import annotations

import json
import socket
from typing import Any
from urllib.parse import urlsplit

from shoal.client.cache import WorkerAddr
from shoal.core.ring import Ring
from shoal.errors import ProtocolError
from shoal.proto import control as api

#: the most a master's answer may be here (a ring, a definition: a few KB)
_MAX_ANSWER = 16 << 20


class NotPlain(Exception):
    """Not for this path: the async client's to ask."""


def parse_ring(body: Any) -> tuple[Ring, dict[str, WorkerAddr], int | None]:
    """A ``GET /api/v1/ring`` answer: the ring, its workers' addresses and the datasets
    generation it was answered at (None from a master that does not say)."""
    if not isinstance(body, dict) or not isinstance(body.get("workers"), list):
        raise ProtocolError("master sent a ring answer without epoch and workers")
    if "epoch" not in body:
        raise ProtocolError("master sent a ring answer without epoch and workers")
    ring = api.ring_from_response(body)  # type: ignore[arg-type]  # checked above
    try:
        workers = {
            w["id"]: WorkerAddr(
                w["id"],
                w["host"],
                int(w["port"]),
                w.get("uds") or "",
                w.get("node") or "",
                tls if isinstance(tls := w.get("tls"), bool) else None,
            )
            for w in body["workers"]
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed ring answer from the master: {exc!r}") from None
    gen = body.get("datasets_generation")
    return ring, workers, gen if isinstance(gen, int) else None


def master_get(master: str, paths: list[str], token: str | None) -> list[Any]:
    """The JSON answers of GETs of ``paths`` to the master, sent at once on a
    connection each (to the first address that takes them); NotPlain for anything
    but plain HTTP and 200 answers."""
    for url in (m.strip().rstrip("/") for m in master.split(",")):
        if not url:
            continue
        u = urlsplit(url)
        if u.scheme != "http" or "@" in u.netloc or not u.hostname:
            raise NotPlain  # TLS, credentials in the URL: the async path's
        socks: list[socket.socket] = []
        try:
            try:
                for _ in paths:
                    socks.append(_connect(u.hostname, u.port or 80))
            except OSError:
                continue  # nothing sent: the next address may take them
            for sock, path in zip(socks, paths, strict=True):
                sock.settimeout(30)
                _send_get(sock, u.netloc, u.path + path, token)
            return [_answer(sock) for sock in socks]
        finally:
            for sock in socks:
                sock.close()
    raise NotPlain


def _connect(host: str, port: int) -> socket.socket:
    """A TCP connection to ``host``; an address literal without ``getaddrinfo``, whose
    first call costs a new process about a millisecond (the idna codec's import)."""
    for fam in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(fam, host)
        except OSError:
            continue
        sock = socket.socket(fam, socket.SOCK_STREAM)
        sock.settimeout(5)
        try:
            sock.connect((host, port))
        except OSError:
            sock.close()
            raise
        return sock
    return socket.create_connection((host, port), timeout=5)


def _send_get(sock: socket.socket, host: str, target: str, token: str | None) -> None:
    """One ``GET`` on ``sock``, whose answer ends the connection."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(
        f"GET {target} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n"
        f"Accept-Encoding: identity\r\nConnection: close\r\n{auth}\r\n".encode("latin-1")
    )


def _answer(sock: socket.socket) -> Any:
    """The JSON of the answer on ``sock`` (read to its end); NotPlain unless a 200."""
    parts: list[bytes] = []
    got = 0
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
        if got > _MAX_ANSWER:
            raise NotPlain
    raw = b"".join(parts)
    head, sep, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if not sep or len(status) < 2 or not status[0].startswith("HTTP/1.") or status[1] != "200":
        raise NotPlain  # an error answer: the async path raises it in its own words
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _unchunk(body)
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if len(body) < n:
            raise NotPlain  # cut short
        body = body[:n]
    return json.loads(body)


def _unchunk(body: bytes) -> bytes:
    out: list[bytes] = []
    pos = 0
    while True:
        eol = body.index(b"\r\n", pos)
        n = int(body[pos:eol].split(b";", 1)[0], 16)
        if n == 0:
            return b"".join(out)
        start = eol + 2
        if len(body) < start + n:
            raise NotPlain
        out.append(body[start : start + n])
        pos = start + n + 2

"""TLS for the worker's TCP port (and the master's API): the server's context from a
certificate and key file, the client's from a CA file (``ClientSettings.tls_ca``,
``SHOAL_TLS_CA``). The Unix socket stays plain: only this host's users reach it, and it
hands over descriptors, which TLS could not carry.

Over TLS a worker cannot ``sendfile`` (the bytes must be encrypted in user space): it
writes pages from its files instead, and a client reads through the TLS layer.
"""

from __future__ import annotations

import functools
import ssl

from shoal.errors import InvalidArgument, Unauthenticated

#: what to pass when a worker's certificate is not trusted
WHAT_TO_PASS = "pass the cluster's CA: ClientSettings(tls_ca=PATH) or SHOAL_TLS_CA=PATH"


def server_context(cert: str | None, key: str | None, what: str = "") -> ssl.SSLContext | None:
    """The context a server speaks TLS with (None: neither file given: plain TCP)."""
    if not cert and not key:
        return None
    if not cert or not key:
        raise InvalidArgument(f"{what}--tls-cert and --tls-key go together")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgument(f"{what}cannot load TLS certificate {cert}: {exc}") from None
    return ctx


class TLSRefused(Unauthenticated):
    """A TLS worker's certificate is not trusted (or a plain client met a TLS worker,
    or a TLS client a plain one): raised as is, never a reason to fall back."""


@functools.lru_cache(maxsize=8)
def client_context(ca: str | None) -> ssl.SSLContext | None:
    """The context a client checks servers' certificates with, trusting ``ca`` only (a
    PEM file: the cluster's CA, or a self-signed certificate); None: plain TCP. One
    context per CA file, shared by every connection."""
    if not ca:
        return None
    try:
        return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgument(f"cannot load the TLS CA {ca}: {exc}") from None


def looks_like_tls(head: bytes) -> bool:
    """Whether bytes a plain client received are a TLS record (a handshake or an
    alert, TLS 1.0-1.3): a worker that speaks TLS answering a plain HELLO."""
    return len(head) >= 3 and head[0] in (0x15, 0x16) and head[1] == 0x03 and head[2] <= 0x04

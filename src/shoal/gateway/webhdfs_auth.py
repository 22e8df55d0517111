"""Who a WebHDFS request is, and what it may do.

Two ways in, over the gateway's credentials file (shoal.gateway.auth):

- ``delegation=<token>``: authentication. A token is ``<access key>.<expiry>.<mac>``,
  ``mac`` the base64url HMAC-SHA256 under the access key's secret of
  ``shoal-webhdfs-v1\\n<access key>\\n<expiry>`` (expiry in Unix seconds). It is made
  without asking the gateway (:func:`make_token`, ``shoal gateway webhdfs
  --make-token KEY``), expires, and proves the secret without carrying it, so it can be
  handed to a job as Hadoop hands out delegation tokens. fsspec (``token=``), HdfsCLI
  (``TokenClient``) and curl pass it as is.
- ``user.name=<name>``: Hadoop's "simple" authentication, an assertion anyone can
  make. It is honoured (mapped to the credentials file's user of that name) only when
  the gateway runs with ``--trust-user-name``, i.e. on a network where Hadoop's own
  security would also be off; Hadoop's WebHdfsFileSystem (and so Spark) sends only
  this when Kerberos is off. Otherwise it is ignored and the request is anonymous.

An anonymous request reads public datasets (the credentials file's ``public`` list), or
every dataset when the gateway runs with ``--allow-anonymous``. Writes need a known
identity allowed to write the dataset *and* the dataset named by ``--writable``.
Errors never carry a token, a secret or a MAC.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass

from shoal.errors import CredentialsError, PermissionDenied
from shoal.gateway.auth import Credentials, Identity

__all__ = ["Access", "Who", "make_token"]

_CONTEXT = b"shoal-webhdfs-v1"
#: longest token accepted (an access key, an expiry and a 43-character MAC)
MAX_TOKEN = 512
#: longest life a token may claim
MAX_TTL = 30 * 86400


def _mac(secret: str, access_key: str, expiry: int) -> str:
    msg = b"\n".join((_CONTEXT, access_key.encode(), str(expiry).encode()))
    digest = hmac.new(secret.encode(), msg, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def make_token(access_key: str, secret: str, ttl: float, now: float | None = None) -> str:
    """A delegation token for ``access_key`` valid for ``ttl`` seconds."""
    if not 0 < ttl <= MAX_TTL:
        raise CredentialsError(f"token lifetime must be 1..{MAX_TTL} seconds")
    expiry = int((time.time() if now is None else now) + ttl)
    return f"{access_key}.{expiry}.{_mac(secret, access_key, expiry)}"


@dataclass(frozen=True, slots=True)
class Who:
    """A request's identity: ``identity`` None is anonymous."""

    identity: Identity | None

    @property
    def name(self) -> str:
        return self.identity.name if self.identity is not None else "anonymous"


class Access:
    """The gateway's policy over its credentials (None: no credentials file)."""

    def __init__(
        self,
        credentials: Credentials | None,
        *,
        allow_anonymous: bool = False,
        trust_user_name: bool = False,
        writable: frozenset[str] = frozenset(),
    ) -> None:
        self.credentials = credentials
        self.allow_anonymous = allow_anonymous
        self.trust_user_name = trust_user_name
        self.writable = writable

    def who(self, params: Mapping[str, str], now: float | None = None) -> Who:
        token = params.get("delegation")
        if token:
            return Who(self._verify(token, time.time() if now is None else now))
        user = params.get("user.name")
        if user and self.trust_user_name and self.credentials is not None:
            ident = self.credentials.by_user(user)
            if ident is not None:
                return Who(ident)
        return Who(None)

    def _verify(self, token: str, now: float) -> Identity:
        parts = token.rsplit(".", 2) if len(token) <= MAX_TOKEN else []
        if len(parts) != 3 or not parts[1].isdigit() or self.credentials is None:
            raise CredentialsError("invalid delegation token")
        key, expiry_s, mac = parts
        secret = self.credentials.secret_for(key)
        ident = self.credentials.identity(key)
        expected = _mac(secret or "", key, int(expiry_s))
        if secret is None or ident is None or not hmac.compare_digest(expected, mac):
            raise CredentialsError("invalid delegation token")
        if int(expiry_s) < now:
            raise CredentialsError("delegation token expired")
        if int(expiry_s) > now + MAX_TTL:
            raise CredentialsError("delegation token lives too long")
        return ident

    def _public(self, ds: str) -> bool:
        return self.credentials is not None and self.credentials.is_public(ds)

    def can_list(self, who: Who, ds: str) -> bool:
        if who.identity is None:
            return self.allow_anonymous or self._public(ds)
        return who.identity.can_list(ds) or who.identity.can_read(ds) or self._public(ds)

    def check_read(self, who: Who, ds: str) -> None:
        if who.identity is None:
            if self.allow_anonymous or self._public(ds):
                return
            raise PermissionDenied(f"Permission denied: anonymous may not read dataset {ds}")
        if not (who.identity.can_read(ds) or self._public(ds)):
            raise PermissionDenied(f"Permission denied: user {who.name} may not read dataset {ds}")

    def check_write(self, who: Who, ds: str) -> None:
        if ds not in self.writable:
            raise PermissionDenied(f"Permission denied: dataset {ds} is read-only here")
        if who.identity is None or not who.identity.can_write(ds):
            raise PermissionDenied(f"Permission denied: user {who.name} may not write {ds}")

    def is_writable(self, ds: str) -> bool:
        return ds in self.writable

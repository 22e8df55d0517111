"""Gateway credentials: users, their access keys, roles and datasets, and the public
datasets; shared by the S3 and WebHDFS gateways (``--credentials FILE``).

The file is TOML (or JSON, by a ``.json`` suffix, same structure)::

    public = ["mnist"]                # datasets anonymous requests may read

    [users.alice]
    role = "write"                    # read | write | admin
    datasets = ["imagenet", "coco"]   # or "*" for every dataset
    keys = [
      { access_key = "AKIAALICE0001", secret_env = "SHOAL_ALICE_SECRET" },
      { access_key = "AKIAALICE0002", secret_file = "/run/secrets/alice" },
    ]

    [users.trainer]
    role = "read"
    datasets = "*"
    keys = [{ access_key = "trainer", secret = "inline, so chmod 600 this file" }]

A key's secret is given inline (``secret``), by environment variable (``secret_env``) or
by file (``secret_file``, trailing newline dropped), exactly one of them; references
are resolved once, at load. A file with an inline secret that others may read
(``chmod o+r``) is refused; a ``secret_file`` that others may read is warned about. A
user without keys exists for WebHDFS only (its ``user.name``). Unknown fields are
errors, and every error is one line naming the file and the field, never a secret.

Roles: ``read`` reads and lists its datasets; ``write`` also writes them; ``admin``
also may administer. Everyone, anonymous included, may read and list public datasets.
With no credentials file a gateway should refuse to start unless asked for open access
explicitly (``--allow-anonymous``): then :meth:`Credentials.open_access` lets anonymous
requests read every dataset and knows no keys.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
import stat
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.errors import InvalidArgument

__all__ = ["ANONYMOUS", "ROLES", "Credentials", "CredentialsFileError", "Identity"]

log = logging.getLogger("shoal.gateway.auth")

ROLES = ("read", "write", "admin")
#: the name of the identity of unsigned requests (reserved: no user may take it)
ANONYMOUS = "anonymous"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")
_ACCESS_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~+=@-]{0,127}")
_USER_FIELDS = {"role", "datasets", "keys"}
_KEY_FIELDS = {"access_key", "secret", "secret_env", "secret_file"}


class CredentialsFileError(InvalidArgument):
    """The gateway's credentials file is unusable."""


@dataclass(frozen=True)
class Identity:
    """Who a request is. ``datasets`` None means every dataset; ``public`` are the
    datasets anyone may read."""

    name: str
    access_key: str | None
    role: str
    datasets: frozenset[str] | None
    public: frozenset[str] = field(default=frozenset())

    def _scoped(self, ds: str) -> bool:
        return self.datasets is None or ds in self.datasets

    def can_read(self, ds: str) -> bool:
        return ds in self.public or self._scoped(ds)

    def can_list(self, ds: str) -> bool:
        """May see the dataset (in a listing of datasets) and list its contents."""
        return self.can_read(ds)

    def can_write(self, ds: str) -> bool:
        return self.role in ("write", "admin") and self._scoped(ds)

    def can_admin(self) -> bool:
        return self.role == "admin"

    @property
    def anonymous(self) -> bool:
        return self.access_key is None and self.name == ANONYMOUS


@dataclass(frozen=True)
class _User:
    role: str
    datasets: frozenset[str] | None


class Credentials:
    """The gateway's users, access keys and public datasets. Build with :meth:`load`
    (a file), :meth:`from_dict` (the file's structure, in memory) or
    :meth:`open_access`. Its repr never shows a secret."""

    def __init__(
        self,
        users: Mapping[str, tuple[str, frozenset[str] | None]],
        keys: Mapping[str, tuple[str, str]],
        public: Iterable[str] = (),
        *,
        open_access: bool = False,
    ) -> None:
        """``users``: name -> (role, datasets or None); ``keys``: access key ->
        (user name, secret). Prefer :meth:`from_dict`, which validates."""
        self._users = {n: _User(r, d) for n, (r, d) in users.items()}
        self._secrets = {k: s for k, (_, s) in keys.items()}
        self._owner = {k: u for k, (u, _) in keys.items()}
        for key, user in self._owner.items():
            if user not in self._users:
                raise CredentialsFileError(f"access key {key!r} belongs to no user")
        self._public = frozenset(public)
        self._open = open_access

    @classmethod
    def load(cls, path: str | Path) -> Credentials:
        """Read a credentials file (TOML, or JSON by a ``.json`` suffix)."""
        path = Path(path)
        where = str(path)
        try:
            raw = path.read_bytes()
            mode = path.stat().st_mode
        except OSError as exc:
            raise CredentialsFileError(
                f"credentials file {where}: cannot read it ({exc.strerror})"
            ) from None
        try:
            if path.suffix.lower() == ".json":
                data = json.loads(raw)
            else:
                data = tomllib.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            # TOML and JSON errors name the line and column, never the content
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CredentialsFileError(f"credentials file {where}: {msg}") from None
        creds = cls.from_dict(data, source=where, _world_readable=bool(mode & stat.S_IROTH))
        return creds

    @classmethod
    def from_dict(
        cls, data: Any, *, source: str = "credentials", _world_readable: bool = False
    ) -> Credentials:
        """Validate the file's structure given as a mapping (tests, embedding)."""

        def bad(what: str) -> CredentialsFileError:
            return CredentialsFileError(f"credentials file {source}: {what}")

        if not isinstance(data, Mapping):
            raise bad("the top level must be a table")
        unknown = sorted(set(data) - {"public", "users"})
        if unknown:
            raise bad(f"unknown field {unknown[0]!r} (expected public, users)")
        public = data.get("public", [])
        if not isinstance(public, list) or not all(_is_name(p) for p in public):
            raise bad("public must be a list of dataset names")
        users_in = data.get("users", {})
        if not isinstance(users_in, Mapping):
            raise bad("users must be a table of users")
        users: dict[str, tuple[str, frozenset[str] | None]] = {}
        keys: dict[str, tuple[str, str]] = {}
        for name, spec in users_in.items():
            at = f"users.{name}"
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise bad(f"{at}: a user name is letters, digits and . _ @ - (at most 128)")
            if name == ANONYMOUS:
                raise bad(f"{at}: the name {ANONYMOUS!r} is reserved for unsigned requests")
            if not isinstance(spec, Mapping):
                raise bad(f"{at} must be a table")
            unknown = sorted(set(spec) - _USER_FIELDS)
            if unknown:
                raise bad(f"{at}: unknown field {unknown[0]!r} (expected role, datasets, keys)")
            role = spec.get("role")
            if role not in ROLES:
                raise bad(f"{at}.role must be one of {', '.join(ROLES)}")
            users[name] = (role, _datasets(spec.get("datasets"), f"{at}.datasets", bad))
            key_list = spec.get("keys", [])
            if not isinstance(key_list, list):
                raise bad(f"{at}.keys must be a list of tables")
            for i, key in enumerate(key_list):
                access_key, secret = _key(key, f"{at}.keys[{i}]", bad, _world_readable)
                if access_key in keys:
                    raise bad(f"{at}.keys[{i}]: access key {access_key!r} is given twice")
                keys[access_key] = (name, secret)
        return cls(users, keys, public)

    @classmethod
    def open_access(cls) -> Credentials:
        """No credentials file, started with explicit open access: anonymous requests
        read and list every dataset; no access key is known (signed requests fail)."""
        return cls({}, {}, open_access=True)

    @property
    def is_open(self) -> bool:
        return self._open

    def secret_for(self, access_key: str) -> str | None:
        return self._secrets.get(access_key)

    def identity(self, access_key: str) -> Identity | None:
        user = self._owner.get(access_key)
        if user is None:
            return None
        u = self._users[user]
        return Identity(user, access_key, u.role, u.datasets, self._public)

    def check_secret(self, access_key: str, secret: str) -> Identity | None:
        """The key's identity when ``secret`` is its secret (constant time), else None:
        for gateways that take a key and secret directly (HTTP Basic)."""
        known = self._secrets.get(access_key)
        if known is None or not hmac.compare_digest(known.encode(), secret.encode()):
            return None
        return self.identity(access_key)

    def by_user(self, name: str) -> Identity | None:
        """The user's identity (access_key None), e.g. for WebHDFS ``user.name``."""
        u = self._users.get(name)
        if u is None:
            return None
        return Identity(name, None, u.role, u.datasets, self._public)

    def anonymous(self) -> Identity:
        """Unsigned requests: read public datasets only (every one under open access)."""
        return Identity(ANONYMOUS, None, "read", None if self._open else frozenset(), self._public)

    def is_public(self, ds: str) -> bool:
        return self._open or ds in self._public

    def __repr__(self) -> str:
        mode = ", open access" if self._open else ""
        return (
            f"Credentials({len(self._users)} users, {len(self._secrets)} keys, "
            f"public={sorted(self._public)}{mode})"
        )


def _is_name(value: object) -> bool:
    return isinstance(value, str) and bool(value) and "/" not in value and value.strip() == value


def _datasets(value: object, at: str, bad: Any) -> frozenset[str] | None:
    if value == "*":
        return None
    if not isinstance(value, list) or not all(_is_name(d) for d in value):
        raise bad(f'{at} must be "*" or a list of dataset names')
    return frozenset(value)


def _key(spec: object, at: str, bad: Any, world_readable: bool) -> tuple[str, str]:
    if not isinstance(spec, Mapping):
        raise bad(f"{at} must be a table")
    unknown = sorted(set(spec) - _KEY_FIELDS)
    if unknown:
        raise bad(
            f"{at}: unknown field {unknown[0]!r} "
            "(expected access_key and one of secret, secret_env, secret_file)"
        )
    access_key = spec.get("access_key")
    if not isinstance(access_key, str) or not _ACCESS_KEY.fullmatch(access_key):
        raise bad(f"{at}.access_key must be letters, digits and . _ ~ + = @ - (at most 128)")
    given = [f for f in ("secret", "secret_env", "secret_file") if f in spec]
    if len(given) != 1:
        raise bad(f"{at}: give exactly one of secret, secret_env, secret_file")
    how = given[0]
    ref = spec[how]
    if not isinstance(ref, str) or not ref:
        raise bad(f"{at}.{how} must be a non-empty string")
    if how == "secret":
        if world_readable:
            raise bad(
                f"{at}: an inline secret in a file others may read; chmod o-r the file "
                "or use secret_env / secret_file"
            )
        return access_key, ref
    if how == "secret_env":
        secret = os.environ.get(ref, "")
        if not secret:
            raise bad(f"{at}.secret_env: environment variable {ref} is not set or empty")
        return access_key, secret
    try:
        path = Path(ref)
        secret = path.read_text("utf-8").rstrip("\r\n")
        if path.stat().st_mode & stat.S_IROTH:
            log.warning("secret file %s of %s can be read by others (chmod o-r)", ref, at)
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise bad(f"{at}.secret_file: cannot read {ref} ({why})") from None
    if not secret:
        raise bad(f"{at}.secret_file: {ref} is empty")
    return access_key, secret

"""Cluster tokens: who is talking, in which role, for which datasets.

A cluster has one secret (32 random bytes in a file only the cluster's processes can
read). Every token is a JWT signed with it (HS256, PyJWT; the algorithm is pinned on
verify, so a token cannot choose its own). Claims:

=======  ===============================================================
``sub``  a name for the holder (shown in logs and refusals; not secret)
``role`` ``admin`` (everything), ``worker`` (register, heartbeat, tasks, and read
         metadata), or ``reader`` (read data and metadata)
``ds``   the datasets a reader may use (absent: all)
``exp``  expiry, seconds since the epoch (absent: none)
``iss``  always ``shoal``
=======  ===============================================================

A token is never logged, stored in state or put in an error message; what the
master logs for a refused request is the reason and the holder's ``sub``.

Workers given the same secret check the token a client sends in its data-path HELLO,
once per connection (see shoal.proto.wire): every role may read data (workers read
pages from their peers with their worker token), a reader token limited to datasets
only those.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import jwt

from shoal.errors import InvalidArgument, PermissionDenied, Unauthenticated

ADMIN, WORKER, READER = "admin", "worker", "reader"
ROLES = (ADMIN, WORKER, READER)
ISSUER = "shoal"
_ALG = "HS256"
SECRET_BYTES = 32


@dataclass(frozen=True)
class Claims:
    """What a verified token grants."""

    name: str
    role: str
    #: datasets the holder may use; None: every dataset
    datasets: frozenset[str] | None = None
    expires: float | None = None

    def may_use(self, dataset: str) -> bool:
        return self.datasets is None or dataset in self.datasets

    def require_dataset(self, dataset: str) -> None:
        if not self.may_use(dataset):
            raise PermissionDenied(f"token {self.name!r} does not grant dataset {dataset!r}")

    def require_role(self, *roles: str) -> None:
        if self.role != ADMIN and self.role not in roles:
            want = " or ".join(roles) if roles else ADMIN
            raise PermissionDenied(
                f"token {self.name!r} ({self.role}) may not do this: needs {want}"
            )


def mint(
    secret: bytes,
    name: str,
    role: str,
    datasets: list[str] | None = None,
    ttl: float | None = None,
    now: float | None = None,
) -> str:
    """A token for ``name`` in ``role``, limited to ``datasets`` and ``ttl`` seconds."""
    if role not in ROLES:
        raise InvalidArgument(f"role {role!r}: choose one of {', '.join(ROLES)}")
    if not name or len(name) > 200:
        raise InvalidArgument("a token needs a name of 1-200 characters")
    if ttl is not None and not ttl > 0:
        raise InvalidArgument("a token's lifetime must be positive")
    claims: dict[str, object] = {"sub": name, "role": role, "iss": ISSUER}
    if datasets is not None:
        if role != READER:
            raise InvalidArgument("only reader tokens are limited to datasets")
        claims["ds"] = sorted(set(datasets))
    if ttl is not None:
        claims["exp"] = int((time.time() if now is None else now) + ttl)
    return jwt.encode(claims, secret, algorithm=_ALG)


def verify(secret: bytes, token: str, now: float | None = None) -> Claims:
    """The claims of a token this cluster signed; Unauthenticated for anything else
    (garbage, another cluster's, expired, tampered). Never echoes the token."""
    if not token or len(token) > 8192:
        raise Unauthenticated("malformed token")
    try:
        raw = jwt.decode(
            token,
            secret,
            algorithms=[_ALG],
            issuer=ISSUER,
            options={"require": ["sub", "role", "iss"]},
            leeway=0,
        )
    except jwt.ExpiredSignatureError:
        raise Unauthenticated("token expired") from None
    except jwt.InvalidSignatureError:
        raise Unauthenticated("token not signed by this cluster") from None
    except jwt.PyJWTError:
        raise Unauthenticated("malformed token") from None
    role = raw.get("role")
    if role not in ROLES:
        raise Unauthenticated("token has no valid role")
    ds = raw.get("ds")
    if ds is not None and not (isinstance(ds, list) and all(isinstance(d, str) for d in ds)):
        raise Unauthenticated("token has a malformed dataset list")
    exp = raw.get("exp")
    if exp is not None and now is not None and now >= float(exp):
        raise Unauthenticated("token expired")
    return Claims(
        str(raw["sub"]),
        str(role),
        frozenset(ds) if ds is not None else None,
        float(exp) if exp is not None else None,
    )


#: why a token was refused, as refusals are counted (bounded labels), by verify's message
_REASONS = {
    "token expired": "expired",
    "token not signed by this cluster": "bad_signature",
}
#: the reason of a refusal for lack of any token, and for a token scoped elsewhere
MISSING, DATASET = "missing", "dataset"
REASONS = (MISSING, "expired", "bad_signature", "malformed", DATASET)


def reason(exc: Unauthenticated) -> str:
    """The label a refusal by :func:`verify` is counted under: expired, bad_signature
    or malformed."""
    return _REASONS.get(exc.message, "malformed")


def claimed_name(token: str) -> str:
    """The ``sub`` a token claims, read without checking its signature, for a refusal's
    log line (never the token itself; at most 64 characters, repr-quoted since anyone
    can write it); "?" when it has none."""
    try:
        raw = jwt.decode(token, options={"verify_signature": False, "verify_exp": False})
    except jwt.PyJWTError:
        return "?"
    sub = raw.get("sub") if isinstance(raw, dict) else None
    return repr(sub[:64]) if isinstance(sub, str) else "?"


def new_secret(path: Path) -> bytes:
    """Write a new cluster secret to ``path`` (mode 0600, never over an existing one)."""
    raw = secrets.token_bytes(SECRET_BYTES)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(raw.hex().encode() + b"\n")
    return raw


def secret_from_text(text: str, where: str) -> bytes:
    """A cluster secret written as hex (``shoal up``), or as any text of at least 32
    characters (a Kubernetes Secret from Helm's ``randAlphaNum``)."""
    text = text.strip()
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = text.encode()
        if len(raw) < 32:
            raise InvalidArgument(
                f"cluster secret {where} is too short: 32 characters or 16 hex bytes at least"
            ) from None
    if len(raw) < 16:
        raise InvalidArgument(f"cluster secret {where} is too short (16 bytes at least)")
    return raw


def load_secret(path: str | Path) -> bytes:
    """The cluster secret in ``path``; refuses a file others may read."""
    p = Path(path)
    try:
        st = p.stat()
        text = p.read_text().strip()
    except FileNotFoundError:
        raise InvalidArgument(f"no cluster secret at {path}") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot read the cluster secret {path}: {exc.strerror}") from None
    if st.st_mode & 0o077:
        raise InvalidArgument(f"cluster secret {path} is readable by others: chmod 600 it")
    return secret_from_text(text, str(path))


def write_token(path: Path, token: str) -> None:
    """Store a token where its holder finds it (mode 0600, replaced atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)

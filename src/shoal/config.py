"""Typed settings per subsystem: defaults < explicit arguments.

Every field has a docstring-style comment; every settings class validates itself where it
is built (``__post_init__``), so a bad value raises InvalidArgument with a one-line
message, never an ``assert`` and never later, deep in a server. The environment is read
in exactly these places: :func:`master_from_env` (``SHOAL_MASTER``), :func:`node_name`
(``SHOAL_NODE``), :func:`shoal_home` (``SHOAL_HOME``), :func:`token_for`
(``SHOAL_TOKEN``, ``SHOAL_TOKEN_FILE``), :func:`tls_ca_for` (``SHOAL_TLS_CA``) and :func:`cluster_secret` (``SHOAL_SECRET``); the CLI maps its flags onto these classes.
"""

from __future__ import annotations

import json
import math
import os
import socket
from dataclasses import field, replace
from typing import TYPE_CHECKING

from shoal.core.records import record
from shoal.core.types import TIERS, parse_size
from shoal.errors import InvalidArgument

if TYPE_CHECKING:
    from pathlib import Path

ENV_MASTER = "SHOAL_MASTER"
ENV_HOME = "SHOAL_HOME"
ENV_TOKEN = "SHOAL_TOKEN"
ENV_TOKEN_FILE = "SHOAL_TOKEN_FILE"
#: the CA file a client checks TLS workers and an https master with
ENV_TLS_CA = "SHOAL_TLS_CA"
#: the cluster secret itself (a Kubernetes Secret as an environment variable): the
#: master checks tokens with it, every other role mints its own admin token from it
ENV_SECRET = "SHOAL_SECRET"
#: tokens by master URL, written by ``shoal up`` (mode 0600)
CREDENTIALS_FILE = "credentials.json"


@record(slots=False)
class TierSpec:
    """One cache tier of a worker: ``mem:/dev/shm/shoal:1GiB`` or ``ssd:/var/cache/shoal:100GiB``."""

    #: mem, ssd or hdd
    name: str
    #: directory holding the tier's segments, data files and index
    path: str
    #: bytes the tier may use
    capacity: int
    #: eviction starts above this fraction of capacity...
    high_watermark: float = 0.95
    #: ...and stops below this one
    low_watermark: float = 0.80
    #: lru, lfu or fifo
    eviction: str = "lru"

    def __post_init__(self) -> None:
        if self.name not in TIERS:
            raise InvalidArgument(f"invalid tier {self.name!r}: use mem, ssd or hdd")
        if self.capacity <= 0:
            raise InvalidArgument(f"tier {self.name}: capacity must be positive")
        if not 0 < self.low_watermark < self.high_watermark <= 1:
            raise InvalidArgument(f"tier {self.name}: need 0 < low < high <= 1 watermarks")
        if self.eviction not in ("lru", "lfu", "fifo"):
            raise InvalidArgument(f"tier {self.name}: eviction must be lru, lfu or fifo")

    @classmethod
    def parse(cls, text: str) -> TierSpec:
        """``NAME:PATH:SIZE[:HIGH:LOW]`` as given on the command line (the watermarks as
        fractions of SIZE, e.g. ``ssd:/cache:10GiB:0.9:0.75``)."""
        parts = text.split(":")
        if len(parts) not in (3, 5):
            raise InvalidArgument(
                f"invalid tier {text!r}: expected NAME:PATH:SIZE[:HIGH:LOW], "
                "e.g. ssd:/cache:10GiB or ssd:/cache:10GiB:0.9:0.75"
            )
        tier = cls(name=parts[0], path=parts[1], capacity=parse_size(parts[2]))
        if len(parts) == 3:
            return tier
        try:
            high, low = float(parts[3]), float(parts[4])
        except ValueError:
            raise InvalidArgument(
                f"invalid tier {text!r}: the watermarks must be fractions like 0.9:0.75"
            ) from None
        return replace(tier, high_watermark=high, low_watermark=low)


def _port(what: str, port: int) -> None:
    if not 0 <= port <= 65535:
        raise InvalidArgument(f"{what}: port must be 0..65535 (0 picks a free port), got {port}")


def _positive(what: str, field_name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{what}: {field_name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidArgument(f"{what}: {field_name} must be a positive number, got {value}")


def shoal_home() -> Path:
    """Where ``shoal up``'s cluster and the mounts keep their state: ``SHOAL_HOME``, else
    ``~/.shoal``."""
    from pathlib import Path

    return Path(_home())


def _home() -> str:
    # os.path, not pathlib: a new client reads credentials.json through here, and
    # pathlib (with urllib.parse, fnmatch) is a few ms of its start-up otherwise
    return os.environ.get(ENV_HOME) or os.path.join(os.path.expanduser("~"), ".shoal")


def _saved_credentials() -> str:
    """What ``shoal up`` stored (``<shoal home>/credentials.json``); OSError if none."""
    with open(os.path.join(_home(), CREDENTIALS_FILE), encoding="utf-8") as f:
        return f.read()


def node_name() -> str:
    """This host's identity for short-circuit decisions (Kubernetes: the node name)."""
    return os.environ.get("SHOAL_NODE") or socket.gethostname()


@record(slots=False)
class MasterSettings:
    #: interface to bind; 127.0.0.1 unless deploying
    host: str = "127.0.0.1"
    #: 0 picks a free port
    port: int = 0
    #: directory for the SQLite state
    state_dir: str = ".shoal/master"
    #: seconds between worker heartbeats
    heartbeat_interval: float = 2.0
    #: a worker missing heartbeats this long leaves the ring
    worker_expiry: float = 10.0
    #: when set, the master writes its URL here once it listens
    url_file: str | None = None
    #: directories file:// mounts may read (resolved); empty: file:// mounts are refused
    file_roots: tuple[str, ...] = ()
    #: the cluster secret (see shoal.core.tokens); None: the API is open to anyone
    secret_file: str | None = None
    #: serve the API over https with this certificate and key (PEM files)
    tls_cert: str | None = None
    tls_key: str | None = None
    #: another master serves state_dir: wait and take over when it stops, instead of
    #: refusing to start (see shoal.master.lease)
    standby: bool = False

    def __post_init__(self) -> None:
        _port("master", self.port)
        _positive("master", "heartbeat_interval", self.heartbeat_interval)
        _positive("master", "worker_expiry", self.worker_expiry)
        if self.worker_expiry <= self.heartbeat_interval:
            raise InvalidArgument(
                "master: worker_expiry must be longer than heartbeat_interval "
                f"({self.worker_expiry} <= {self.heartbeat_interval})"
            )


@record(slots=False)
class WorkerSettings:
    master: str
    host: str = "127.0.0.1"
    port: int = 0
    #: working directory: identity, Unix socket, local copy of dataset definitions
    work_dir: str = ".shoal/worker"
    tiers: tuple[TierSpec, ...] = ()
    #: Unix socket for same-host clients ("" = <work_dir>/worker.sock)
    uds: str = ""
    node: str = field(default_factory=node_name)
    #: address other hosts use to reach this worker ("" = host)
    advertise_host: str = ""
    #: concurrent under-storage requests
    ufs_concurrency: int = 32
    #: when set, the worker writes "<host>:<port>" here once it listens
    url_file: str | None = None
    #: the cluster secret its clients' tokens are checked with (else SHOAL_SECRET);
    #: see :func:`worker_secret` for a worker that has none
    secret_file: str | None = None
    #: serve the data path without checking tokens (no secret needed)
    no_auth: bool = False
    #: TLS on the TCP port with this certificate and key (PEM; the Unix socket stays plain)
    tls_cert: str | None = None
    tls_key: str | None = None
    #: on SIGTERM, first hand the cached files to their next owners for at most this
    #: many seconds (0: stop at once; shoal.worker.drain)
    drain_timeout: float = 0.0

    def __post_init__(self) -> None:
        if not self.master:
            raise InvalidArgument("worker: a master URL is required")
        if self.drain_timeout != 0:
            _positive("worker", "drain_timeout", self.drain_timeout)
        if self.no_auth and self.secret_file:
            raise InvalidArgument("worker: pass --secret-file or --no-auth, not both")
        _port("worker", self.port)
        if isinstance(self.ufs_concurrency, bool) or not isinstance(self.ufs_concurrency, int):
            raise InvalidArgument("worker: ufs_concurrency must be an integer")
        if self.ufs_concurrency < 1:
            raise InvalidArgument(
                f"worker: ufs_concurrency must be at least 1, got {self.ufs_concurrency}"
            )
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"worker: each tier may be given once, got {', '.join(names)}")


@record(slots=False)
class ClientSettings:
    master: str
    #: seconds between background ring refreshes
    ring_refresh: float = 10.0
    #: connections kept per worker
    pool_size: int = 8
    #: seconds before a worker request is abandoned and the next owner is tried
    request_timeout: float = 30.0
    #: use Unix sockets and fd passing for workers on this host
    short_circuit: bool = True
    #: fall back to reading under storage when no worker can serve
    ufs_fallback: bool = True
    node: str = field(default_factory=node_name)
    #: token for the master's API (None: shoal.config.token_for finds one); never shown
    token: str | None = field(default=None, repr=False)
    #: the CA (PEM) that workers' TLS certificates (and an https master's) are checked
    #: with; set, workers are reached over TLS on TCP. None: $SHOAL_TLS_CA, else plain
    tls_ca: str | None = None

    def __post_init__(self) -> None:
        if not self.master:
            raise InvalidArgument(f"client: no master URL (set {ENV_MASTER} or pass master=...)")
        _positive("client", "ring_refresh", self.ring_refresh)
        _positive("client", "request_timeout", self.request_timeout)
        if isinstance(self.pool_size, bool) or not isinstance(self.pool_size, int):
            raise InvalidArgument(f"client: pool_size must be an integer, got {self.pool_size!r}")
        if self.pool_size < 1:
            raise InvalidArgument(f"client: pool_size must be at least 1, got {self.pool_size}")


def cluster_secret(secret_file: str | None) -> bytes | None:
    """The cluster secret: from ``secret_file``, else ``SHOAL_SECRET``; None: no auth."""
    text = "" if secret_file else os.environ.get(ENV_SECRET, "")
    if not secret_file and not text.strip():
        # every new client asks (token_for): an open cluster's must not pay for
        # importing PyJWT and cryptography (tens of ms before its first byte)
        return None
    from shoal.core.tokens import load_secret, secret_from_text

    if secret_file:
        return load_secret(secret_file)
    return secret_from_text(text, f"${ENV_SECRET}")


def worker_secret(
    settings: WorkerSettings, has_token: bool, master_auth: bool | None = None
) -> bytes | None:
    """The secret a worker checks its clients' tokens with (None: it serves unchecked).

    ``--secret-file``, else ``SHOAL_SECRET``. A worker with neither serves without
    checks only when started with ``--no-auth``, or in an open cluster: one whose master
    says it needs no tokens (``master_auth`` False, from its health answer) or, with
    the master not reachable at start (None), one where the worker holds no token of
    its own (``has_token``: SHOAL_TOKEN, SHOAL_TOKEN_FILE or credentials.json). In a
    cluster with auth it refuses to start, with a one-line error."""
    if settings.no_auth:
        return None
    secret = cluster_secret(settings.secret_file)
    if secret is not None:
        return secret
    needs = master_auth if master_auth is not None else has_token
    if needs:
        raise InvalidArgument(
            "worker: this cluster requires tokens, but the worker has no cluster secret "
            "to check its clients' tokens with: pass --secret-file FILE or set "
            f"{ENV_SECRET} (or --no-auth to serve the data path unchecked)"
        )
    return None


def tls_ca_for(explicit: str | None, master: str | None = None) -> str | None:
    """The CA file a client trusts: ``explicit`` (ClientSettings.tls_ca), else
    ``SHOAL_TLS_CA``, else the CA ``shoal up --tls`` recorded for ``master`` in
    ``<shoal home>/credentials.json``; None: no CA (workers in plain TCP)."""
    found = explicit or os.environ.get(ENV_TLS_CA)
    if found or not master:
        return found or None
    try:
        saved = json.loads(_saved_credentials()).get("tls_ca")
    except (OSError, ValueError, AttributeError):
        return None
    for url in master.split(","):
        ca = saved.get(url.strip().rstrip("/")) if isinstance(saved, dict) else None
        if isinstance(ca, str) and ca:
            return ca
    return None


def token_for(master: str) -> str | None:
    """The token to present to ``master``: ``SHOAL_TOKEN``, else the file named by
    ``SHOAL_TOKEN_FILE``, else an admin token minted from ``SHOAL_SECRET`` (the
    cluster's own processes on Kubernetes), else what ``shoal up`` stored for that master URL in
    ``<shoal home>/credentials.json``; None when there is none (an open cluster)."""
    token = os.environ.get(ENV_TOKEN, "").strip()
    if token:
        return token
    path = os.environ.get(ENV_TOKEN_FILE)
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip() or None
        except OSError as exc:
            raise InvalidArgument(f"{ENV_TOKEN_FILE}={path}: {exc.strerror}") from None
    secret = cluster_secret(None)
    if secret is not None:
        from shoal.core.tokens import ADMIN, mint

        return mint(secret, node_name(), ADMIN)
    try:
        saved = json.loads(_saved_credentials())
    except (OSError, ValueError):
        return None
    for url in master.split(","):
        found = saved.get(url.strip().rstrip("/")) if isinstance(saved, dict) else None
        if isinstance(found, str) and found:
            return found
    return None


def master_from_env(explicit: str | None, hint: str = "pass master=URL") -> str:
    """The master's URL: *explicit*, else ``SHOAL_MASTER``; *hint* says how the caller's
    user passes one (the CLI says ``--master URL``, the library ``master=URL``)."""
    url = explicit or os.environ.get(ENV_MASTER)
    if not url:
        raise InvalidArgument(f"no master: set {ENV_MASTER} or {hint}")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url.rstrip("/")

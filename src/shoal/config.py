"""Typed settings per subsystem: defaults < environment (SHOAL_*) < explicit arguments.

Every field has a docstring-style comment; invalid values raise InvalidArgument, never
``assert``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from shoal.core.types import TIERS, parse_size
from shoal.errors import InvalidArgument

ENV_MASTER = "SHOAL_MASTER"


@dataclass(frozen=True)
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
        """``NAME:PATH:SIZE`` as given on the command line."""
        parts = text.split(":")
        if len(parts) != 3:
            raise InvalidArgument(
                f"invalid tier {text!r}: expected NAME:PATH:SIZE, e.g. ssd:/cache:10GiB"
            )
        return cls(name=parts[0], path=parts[1], capacity=parse_size(parts[2]))


def node_name() -> str:
    """This host's identity for short-circuit decisions (Kubernetes: the node name)."""
    return os.environ.get("SHOAL_NODE") or socket.gethostname()


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


def master_from_env(explicit: str | None) -> str:
    url = explicit or os.environ.get(ENV_MASTER)
    if not url:
        raise InvalidArgument(f"no master: pass --master URL or set {ENV_MASTER}")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url.rstrip("/")

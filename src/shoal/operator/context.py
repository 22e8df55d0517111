"""The operator's settings and the state its handlers share (kopf's ``memo``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import kopf

from shoal.client import AsyncClient
from shoal.config import ClientSettings
from shoal.errors import InvalidArgument
from shoal.operator.crds import SECRETS_ROOT
from shoal.operator.kube import Kube


@dataclass(frozen=True)
class OperatorSettings:
    #: the shoal master's API URL
    master: str
    #: seconds between status refreshes (Datasets, Runtimes, DataLoads) and label passes
    interval: float = 10.0
    #: how long a Dataset's finalizer waits for the free job before deleting anyway
    free_timeout: float = 300.0
    #: where the chart mounts Secrets that mounts reference
    secrets_root: str = SECRETS_ROOT
    #: namespaces to watch; empty: the whole cluster
    namespaces: tuple[str, ...] = ()
    #: the admission webhook's HTTPS port (0: any free port); None: no webhook
    webhook_port: int | None = None
    webhook_host: str = "0.0.0.0"
    tls_cert: str | None = None
    tls_key: str | None = None
    #: credentials for the API server; None: the service account, else kubeconfig
    connection: kopf.ConnectionInfo | None = None

    def __post_init__(self) -> None:
        if not self.master.startswith(("http://", "https://")):
            raise InvalidArgument(f"invalid master URL {self.master!r}: expected http://HOST:PORT")
        if not self.interval > 0:
            raise InvalidArgument(f"invalid interval {self.interval}: must be > 0")
        if self.webhook_port is not None and not (self.tls_cert and self.tls_key):
            raise InvalidArgument("the admission webhook needs --tls-cert and --tls-key")


@dataclass
class Context:
    """kopf's memo: one master client, one Kubernetes session, one cached report."""

    settings: OperatorSettings
    client: AsyncClient = field(init=False)
    kube: Kube = field(default_factory=Kube)
    #: (namespace, name) of every Dataset seen: the webhook's view
    datasets: set[tuple[str, str]] = field(default_factory=set)
    #: DataLoad uid -> the job or schedule id it submitted, until its status says so
    submitted: dict[str, str] = field(default_factory=dict)
    #: Datasets whose finalizer has started (uid)
    deleting: set[str] = field(default_factory=set)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    _report: tuple[float, dict[str, Any]] | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.client = AsyncClient(ClientSettings(master=self.settings.master))

    async def report(self) -> dict[str, Any]:
        """The master's report, fetched at most once per half interval (every Dataset's
        timer reads the same one)."""
        async with self._lock:
            now = time.monotonic()
            if self._report is None or now - self._report[0] > self.settings.interval / 2:
                self._report = (now, await self.client.report())
            return self._report[1]

    def lock(self, uid: str) -> asyncio.Lock:
        """One lock per object: its change handlers and its timer never overlap."""
        return self._locks.setdefault(uid, asyncio.Lock())

    def forget(self, uid: str) -> None:
        # ``deleting`` keeps the uid: a pass still waiting on the old lock must see it
        self._locks.pop(uid, None)
        self.submitted.pop(uid, None)

    def forget_report(self) -> None:
        self._report = None

    async def close(self) -> None:
        await self.client.close()
        await self.kube.close()

    def __copy__(self) -> Context:
        # kopf shallow-copies the memo per object: every object shares this one
        return self

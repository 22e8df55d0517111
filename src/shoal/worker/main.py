"""The worker process: wires store, loader and servers together, registers with the
master and heartbeats. Runs on with its last known datasets while the master is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import logging
import os
import secrets
import signal
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

import shoal
from shoal.config import WorkerSettings, cluster_secret, tls_ca_for, worker_secret
from shoal.core.tls import client_context, server_context
from shoal.core.types import Dataset
from shoal.errors import InvalidArgument, ShoalError
from shoal.proto import control, wire
from shoal.proto.master_api import MasterAPI
from shoal.store.tiered import TieredStore
from shoal.worker import metrics
from shoal.worker.datasets import DatasetTable
from shoal.worker.drain import Elastic
from shoal.worker.loader import Loader
from shoal.worker.peers import Peers
from shoal.worker.server import Conn, DataService
from shoal.worker.stats import Stats
from shoal.worker.tasks import TaskRunner

log = logging.getLogger("shoal.worker")

#: Unix socket paths longer than this do not fit sockaddr_un
_UDS_MAX = 100


#: directory entries the reclaim walk looks at per slice, and the pause between slices
RECLAIM_SLICE = 256
RECLAIM_PAUSE = 0.01
#: the group (name or id) that may connect to the Unix socket besides the service user
#: (default: the service user's own group); any other local user gets no access
ENV_SOCKET_GROUP = "SHOAL_SOCKET_GROUP"


def _socket_group() -> int:
    """The gid from SHOAL_SOCKET_GROUP (InvalidArgument if unknown), else our own."""
    name = os.environ.get(ENV_SOCKET_GROUP, "").strip()
    if not name:
        return os.getegid()
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise InvalidArgument(f"{ENV_SOCKET_GROUP}={name!r}: no such group") from None


def _private_socket(path: str, gid: int) -> None:
    """Same-host readers get descriptors of cached data over this socket: 0660, owned
    by the service user and the socket group (see ENV_SOCKET_GROUP)."""
    if gid != os.getegid():
        try:
            os.chown(path, -1, gid)
        except OSError as exc:
            raise InvalidArgument(f"cannot give {path} to group {gid}: {exc}") from None
    os.chmod(path, 0o660)


def _identity(work_dir: Path) -> str:
    """A stable worker id: the same worker keeps its ring position across restarts."""
    f = work_dir / "id"
    try:
        return f.read_text().strip()
    except FileNotFoundError:
        wid = "w-" + uuid.uuid4().hex[:12]
        tmp = f.with_suffix(".tmp")
        tmp.write_text(wid)
        os.replace(tmp, f)
        return wid


def _identity_key(work_dir: Path) -> str:
    """The secret this worker's id is bound to on the master (``<work_dir>/key``, 0600):
    a restarted worker presents it again; another process cannot take over the id."""
    f = work_dir / "key"
    try:
        return f.read_text().strip()
    except FileNotFoundError:
        key = secrets.token_hex(32)
        tmp = f.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(key)
        os.replace(tmp, f)
        return key


def _uds_path(settings: WorkerSettings, work_dir: Path, wid: str) -> str:
    path = settings.uds or str(work_dir / "worker.sock")
    if len(path) > _UDS_MAX:
        path = f"/tmp/shoal-{wid}.sock"
    return path


class Worker:
    def __init__(self, settings: WorkerSettings) -> None:
        if not settings.tiers:
            raise InvalidArgument("a worker needs at least one --tier NAME:PATH:SIZE")
        self.settings = settings
        self._socket_gid = _socket_group()
        self.work_dir = Path(settings.work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.id = _identity(self.work_dir)
        self._key = _identity_key(self.work_dir)
        self.store = TieredStore.from_specs(list(settings.tiers))
        self._started = time.monotonic()
        self.table = DatasetTable(self.work_dir / "datasets.json")
        self.stats = Stats()
        self.loader = Loader(self.store, self.table, settings.ufs_concurrency)
        self.service = DataService(self.loader, self.stats, self.id, settings.node)
        self.uds = _uds_path(settings, self.work_dir, self.id)
        self.port = 0
        self.metrics_port = 0
        self.tls = False
        self._servers: list[asyncio.AbstractServer] = []
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self.master = MasterAPI(settings.master, self._session)
        # moved files come from their previous owners (shoal.worker.peers, .drain)
        self.peers = Peers(self.id, self.master.token)
        self.loader.peers = self.peers
        self.elastic = Elastic(self.id, self.master, self.loader, self.peers)
        self._tasks: list[asyncio.Task[None]] = []
        self.registered = asyncio.Event()
        self.runner: TaskRunner | None = None
        self._last_refresh = 0.0
        self._refresh_task: asyncio.Task[None] | None = None
        self.service.refresh_datasets = self._refresh_on_miss

    # -- lifecycle ------------------------------------------------------------------

    async def _check_tokens(self) -> None:
        """Take the cluster secret clients' tokens are checked with (shoal.config.
        worker_secret: refuses to start without one in a cluster with auth)."""
        s = self.settings
        master_auth: bool | None = None
        if not s.no_auth and cluster_secret(s.secret_file) is None:
            try:  # does this cluster use tokens? (not reachable: judge by our own token)
                async with aiohttp.ClientSession() as http, asyncio.timeout(3):
                    health = await MasterAPI(s.master, lambda: http).health()
                    master_auth = bool(health.get("auth"))
            except (ShoalError, OSError, TimeoutError):
                pass
        self.service.secret = worker_secret(s, self.master.token is not None, master_auth)
        if self.service.secret is None:
            log.warning("data path open: clients' tokens are not checked (no cluster secret)")

    async def start(self) -> None:
        await self._check_tokens()
        loop = asyncio.get_running_loop()
        s = self.settings
        tls = server_context(s.tls_cert, s.tls_key, "worker: ")
        self.tls = tls is not None
        # peers that speak TLS: checked with the cluster's CA (else our own certificate)
        self.peers.ssl = client_context(tls_ca_for(None) or (s.tls_cert if self.tls else None))
        self.peers.serves_tls = self.tls
        tcp = await loop.create_server(
            lambda: Conn(self.service, False),
            s.host,
            s.port,
            ssl=tls,
            ssl_handshake_timeout=wire.HELLO_TIMEOUT if tls is not None else None,
        )
        self.port = tcp.sockets[0].getsockname()[1]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.uds)
        uds = await loop.create_unix_server(lambda: Conn(self.service, True), self.uds)
        _private_socket(self.uds, self._socket_gid)
        self._servers = [tcp, uds]
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, s.host, 0)
        await site.start()
        self.metrics_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        self._tasks.append(loop.create_task(self._heartbeat_loop()))
        self._tasks.append(loop.create_task(self._flush_loop()))
        self._tasks.append(loop.create_task(self._reclaim_loop()))
        self.runner = TaskRunner(
            self.master,
            self.id,
            self.loader,
            self.table,
            self._refresh_on_miss,
            lambda: self._refresh_datasets(self.table.generation),
        )
        self._tasks.append(loop.create_task(self.runner.run()))
        log.info("worker %s serving on %s:%d%s and %s", self.id, s.host, self.port, " (TLS)" if self.tls else "", self.uds)  # fmt: skip

    def _session(self) -> aiohttp.ClientSession:
        assert self._http is not None
        return self._http

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for srv in self._servers:
            srv.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()
        await self.loader.close()
        await self.elastic.close()
        await self.table.close()
        self.store.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.uds)

    def address(self) -> dict[str, Any]:
        host = self.settings.advertise_host or self.settings.host
        return {
            "id": self.id,
            "host": host,
            "port": self.port,
            "uds": self.uds,
            "node": self.settings.node,
            "metrics_port": self.metrics_port,
            # its TCP port speaks TLS (clients need the CA: ClientSettings.tls_ca)
            "tls": self.tls,
        }

    # -- master ---------------------------------------------------------------------

    async def _register(self) -> control.RegisterResponse:
        body = dict(self.address())
        body["key"] = self._key
        body["tiers"] = [
            {"name": t.name, "path": t.path, "capacity": t.capacity} for t in self.settings.tiers
        ]
        return await self.master.register(body)

    async def _refresh_datasets(self, generation: int) -> None:
        new = [Dataset.from_dict(dict(d)) for d in await self.master.datasets()]
        old = {n: self.table.get(n) for n in self.table.names()}
        gone = self.table.replace(new, generation)
        for name in gone:
            log.info("dataset %s deleted: dropping its cache", name)
            self.store.delete(dataset=name)
            self.loader.forget(name)
            self.stats.forget(name)
        for ds in new:
            prev = old.get(ds.name)
            if prev is not None and prev.generation != ds.generation:
                # a policy change or a new manifest (sync): cached metadata may be stale
                self.loader.forget(ds.name)
                # a new page size keeps the cache: old-layout pages are misses and age
                # out (shoal.worker.loader); new mounts are other data altogether
                if prev.mounts != ds.mounts:
                    self.store.delete(dataset=ds.name)
            have = self.loader.manifests.get(ds.name)
            if ds.manifest and (have is None or have[0] != ds.manifest):
                await self._fetch_manifest(ds.name)

    async def _fetch_manifest(self, name: str) -> None:
        got = await self.master.manifest(name)
        if got is None:
            return
        self.loader.manifests[name] = got
        log.info("manifest %s of %s: %d files", got[0], name, len(got[1]))

    async def _refresh_on_miss(self) -> bool:
        """A client named a dataset we do not know: ask the master once for all waiters,
        at most 5 times a second (later callers wait for the next one). True when the caller
        should look again."""
        task = self._refresh_task
        if task is None or task.done():
            # a refresh moments ago may predate the dataset this client names: wait out
            # the rate limit and refresh again rather than answer "not found"
            wait = self._last_refresh + 0.2 - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                task = self._refresh_task  # another waiter may have started one meanwhile
        if task is None or task.done():
            self._last_refresh = time.monotonic()
            task = self._refresh_task = asyncio.get_running_loop().create_task(
                self._refresh_datasets(self.table.generation)
            )
        try:
            await asyncio.shield(task)
        except (ShoalError, OSError) as exc:
            log.warning("cannot refresh datasets from the master: %s", exc)
            return False
        return True

    async def _flush_loop(self) -> None:
        """Commit the store's index a few times a second (it batches writes)."""
        while True:
            await asyncio.sleep(0.2)
            self.store.flush()

    async def _reclaim_loop(self) -> None:
        """Unlink cache data files the store's index does not track (a lost index, a
        crash before a commit), a slice at a time after start: never a blocking scan."""
        while self.store.reclaim(RECLAIM_SLICE):
            await asyncio.sleep(RECLAIM_PAUSE)

    async def _heartbeat_loop(self) -> None:
        interval = 2.0
        known = False
        while True:
            try:
                if not known:
                    reg = await self._register()
                    interval = float(reg.get("heartbeat_interval", interval))
                    reply: Mapping[str, Any] = reg
                    known = True
                else:
                    beat = await self.master.heartbeat(self.id, self.snapshot())
                    known = bool(beat.get("known", True))
                    reply = beat
                self.service.epoch = int(reply.get("epoch", self.service.epoch))
                gen = int(reply.get("datasets_generation", -1))
                if gen != self.table.generation:
                    await self._refresh_datasets(gen)
                await self.elastic.after_heartbeat(reply)
                self.registered.set()
            except (ShoalError, OSError) as exc:
                log.warning("master call failed (%s); serving on with known datasets", exc)
            self.store.expire(time.time())
            await asyncio.sleep(interval if known else min(interval, 1.0))

    # -- reporting ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        usage = self.store.usage()
        datasets = self.stats.to_dict()
        for name, du in usage.by_dataset.items():
            d = datasets.setdefault(
                name,
                {"hits": 0, "misses": 0, "bytes_by_source": {"local": 0, "remote": 0, "ufs": 0}},
            )
            d["cached_files"] = du.files
            d["cached_bytes"] = du.bytes
        tiers: list[dict[str, Any]] = []
        for tier, (name, u) in zip(self.store.tiers, self.store.tier_usage(), strict=True):
            row: dict[str, Any] = {
                "name": name,
                "capacity": u.capacity,
                "used": u.used,
                "pages": u.pages,
                "evicted_bytes": u.evicted_bytes,
            }
            spec = getattr(tier, "spec", None)  # a disk tier: its watermarks and health
            if spec is not None:
                row["high_watermark"] = spec.high_watermark
                row["low_watermark"] = spec.low_watermark
            health = getattr(tier, "health", None)
            if isinstance(health, str):
                row["health"] = health
            tiers.append(row)
        return {
            "tiers": tiers,
            "datasets": datasets,
            "corrupt_pages": usage.corrupt_pages,
            "refused_drops": self.stats.refused_drops,
            "ufs_requests": self.loader.ufs_gets,
            **self.elastic.stats(),
            "version": shoal.__version__,
            "uptime_s": round(time.monotonic() - self._started, 1),
        }

    async def _metrics(self, request: web.Request) -> web.Response:
        body = metrics.render(self.snapshot)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, **self.address()})


async def serve(
    settings: WorkerSettings, stop: asyncio.Event, drain: asyncio.Event | None = None
) -> None:
    """Serve until ``stop``, or until drained and gone (``shoal worker drain``); a set
    ``drain`` (SIGTERM with a drain timeout) first hands the cached files over, for at
    most ``settings.drain_timeout`` seconds (shoal.worker.drain)."""
    worker = Worker(settings)
    await worker.start()
    if settings.url_file:
        tmp = settings.url_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(worker.address(), f)
        os.replace(tmp, settings.url_file)
    try:
        # until told to stop, or drained and gone from the cluster (shoal worker drain)
        events = (stop, worker.elastic.left, *((drain,) if drain is not None else ()))
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if (
            drain is not None
            and drain.is_set()
            and not (stop.is_set() or worker.elastic.left.is_set())
        ):
            await worker.elastic.drain_self(worker._key, settings.drain_timeout, stop)
    finally:
        await worker.stop()


def run_worker(settings: WorkerSettings) -> None:
    """Run a worker until SIGTERM or SIGINT. With ``settings.drain_timeout`` > 0 a
    SIGTERM first hands the worker's cached files to their next owners (at most that
    many seconds; a second SIGTERM, or SIGINT, stops at once)."""
    import uvloop

    async def main() -> None:
        stop = asyncio.Event()
        drain = asyncio.Event() if settings.drain_timeout > 0 else None
        loop = asyncio.get_running_loop()

        def term() -> None:
            if drain is None or drain.is_set():
                stop.set()
            else:
                drain.set()

        loop.add_signal_handler(signal.SIGTERM, term)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        await serve(settings, stop, drain)

    uvloop.run(main())

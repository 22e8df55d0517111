"""The master's HTTP JSON API (aiohttp) and its process entry points.

Routes are the constants in :mod:`shoal.proto.control`; handlers only decode the
request, call :class:`~shoal.master.service.MasterService` and encode the answer.
Errors leave as ``{"error": {"code", "message"}}`` with the status from
:func:`shoal.proto.control.http_status`; unexpected exceptions are logged here and
answered with a generic 500.

- :func:`start_master` binds (port 0 picks a free port) and returns a running
  :class:`MasterServer`; ``await server.stop()`` shuts it down.
- :func:`run_master` runs one master on uvloop until SIGTERM or SIGINT, publishing its
  URL in ``settings.url_file`` once it listens; with ``settings.standby`` it first
  waits for the master serving the same state directory to stop (shoal.master.lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import tempfile
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

import shoal
from shoal.config import MasterSettings, cluster_secret
from shoal.core.tls import server_context
from shoal.core.tokens import ADMIN
from shoal.errors import InvalidArgument, NotFound, ShoalError, Unavailable
from shoal.master import validate
from shoal.master.adminroutes import add_admin_routes
from shoal.master.auth import Gate, claims_of, visible
from shoal.master.jobroutes import add_job_routes
from shoal.master.lease import StateLock, describe, holder
from shoal.master.loopclock import LoopClock
from shoal.master.metrics import make_registry, render
from shoal.master.service import MasterService
from shoal.master.state import MasterState
from shoal.master.ui import add_ui_routes
from shoal.proto import control

log = logging.getLogger("shoal.master.server")

_SERVICE: web.AppKey[MasterService] = web.AppKey("service", MasterService)
_GATE: web.AppKey[Gate] = web.AppKey("gate", Gate)
#: largest request body the master accepts
MAX_BODY = 1 << 30

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(exc: BaseException) -> web.Response:
    return web.json_response(control.error_body(exc), status=control.http_status(exc))


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ShoalError as exc:
        if control.http_status(exc) >= 500:
            log.error("%s %s failed: %s", request.method, request.path, exc, exc_info=exc)
        return _error(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # unknown route, wrong method, body too large: same JSON shape as every other error
        err: ShoalError
        if exc.status == 404:
            err = NotFound(f"no route {request.method} {request.path}")
        else:
            err = InvalidArgument(f"{request.method} {request.path}: {exc.reason}")
        return web.json_response(control.error_body(err), status=exc.status)
    except ConnectionResetError:
        raise  # the client went away; nothing to answer
    except Exception as exc:
        log.exception("%s %s failed", request.method, request.path)
        return _error(exc)


async def _body(request: web.Request) -> Any:
    """The decoded JSON body; None when empty; InvalidArgument when malformed."""
    raw = await request.read()
    if not raw.strip():
        return None
    return validate.parse_json(raw)


def _service(request: web.Request) -> MasterService:
    return request.app[_SERVICE]


async def _health(request: web.Request) -> web.Response:
    gate = request.app[_GATE]
    body: control.HealthResponse = {"ok": True, "version": shoal.__version__, "auth": gate.on}
    return web.json_response(body)


async def _create_dataset(request: web.Request) -> web.Response:
    ds = _service(request).create_dataset(await _body(request))
    return web.json_response(ds.to_dict(), status=201)


async def _list_datasets(request: web.Request) -> web.Response:
    found = visible(request, _service(request).list_datasets(), lambda d: d.name)
    return web.json_response({"datasets": [d.to_dict() for d in found]})


async def _get_dataset(request: web.Request) -> web.Response:
    return web.json_response(_service(request).get_dataset(request.match_info["name"]).to_dict())


async def _patch_dataset(request: web.Request) -> web.Response:
    ds = _service(request).update_dataset(request.match_info["name"], await _body(request))
    return web.json_response(ds.to_dict())


async def _delete_dataset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    _service(request).delete_dataset(name)
    body: control.DeleteDatasetResponse = {"deleted": name}
    return web.json_response(body)


async def _register(request: web.Request) -> web.Response:
    return web.json_response(_service(request).register(await _body(request)))


async def _heartbeat(request: web.Request) -> web.Response:
    body = await _body(request)
    return web.json_response(_service(request).heartbeat(request.match_info["id"], body))


async def _drain(request: web.Request) -> web.Response:
    admin = claims_of(request).role == ADMIN
    body = await _body(request)
    return web.json_response(_service(request).drain(request.match_info["id"], body, admin))


async def _ring(request: web.Request) -> web.Response:
    return web.json_response(_service(request).ring_body())


async def _report(request: web.Request) -> web.Response:
    report = _service(request).report()
    report["datasets"] = visible(request, report["datasets"], lambda d: d["name"])
    return web.json_response(report)


def make_app(service: MasterService, gate: Gate | None = None) -> web.Application:
    """The aiohttp application serving ``service`` (no socket bound yet); ``gate``
    checks tokens (see shoal.master.auth; None: an open API)."""
    gate = gate or Gate(None)
    # listing results of a million files arrive in one task report (~70 MB of msgpack)
    app = web.Application(middlewares=[_errors, gate.middleware], client_max_size=MAX_BODY)
    app[_SERVICE] = service
    app[_GATE] = gate
    registry = make_registry(service.snapshot)

    async def metrics(request: web.Request) -> web.Response:
        resp = web.Response(body=render(registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    app.router.add_get(control.HEALTH, _health)
    app.router.add_post(control.DATASETS, _create_dataset)
    app.router.add_get(control.DATASETS, _list_datasets)
    app.router.add_get(control.DATASET, _get_dataset)
    app.router.add_patch(control.DATASET, _patch_dataset)
    app.router.add_delete(control.DATASET, _delete_dataset)
    app.router.add_post(control.WORKER_REGISTER, _register)
    app.router.add_post(control.WORKER_HEARTBEAT, _heartbeat)
    app.router.add_get(control.RING, _ring)
    app.router.add_post(control.WORKER_DRAIN, _drain)
    app.router.add_get(control.REPORT, _report)
    app.router.add_get(control.METRICS, metrics)
    add_job_routes(app, service.jobs)
    add_ui_routes(app, service, visible)
    add_admin_routes(app, service, gate)
    return app


class MasterServer:
    """A running master: HTTP site plus the periodic expiry/flush task."""

    def __init__(
        self, settings: MasterSettings, service: MasterService, lock: StateLock | None = None
    ) -> None:
        self.settings = settings
        self.service = service
        #: the state directory's lock (released by stop())
        self.lock = lock
        #: set when another master took the state directory over (see master.lease)
        self.deposed = asyncio.Event()
        secret = cluster_secret(settings.secret_file)
        if secret is None:
            log.warning(
                "authentication is off: anyone who reaches this port may change the cluster"
            )
        self._runner = web.AppRunner(make_app(service, Gate(secret)), access_log=None)
        #: https with --tls-cert/--tls-key (clients trust it with tls_ca / SHOAL_TLS_CA)
        self._tls = server_context(settings.tls_cert, settings.tls_key, "master: ")
        self._ticker: asyncio.Task[None] | None = None
        self._port = 0

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        host = self.settings.host
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{host}:{self._port}"

    async def _start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.settings.host, self.settings.port, ssl_context=self._tls
        )
        await site.start()
        self._port = int(self._runner.addresses[0][1])
        self._ticker = asyncio.create_task(self._tick_loop(), name="shoal-master-tick")
        if self.lock is not None:
            self.lock.publish(self.url)
        log.info("master listening on %s (state %s)", self.url, self.service.state.path)

    async def _tick_loop(self) -> None:
        interval = tick_interval(self.settings)
        while True:
            await asyncio.sleep(interval)
            if self.lock is not None and not self.lock.still_ours():
                log.error(
                    "another master took over %s (%s): this one stops serving",
                    self.settings.state_dir,
                    describe(holder(self.lock.path)),
                )
                self.deposed.set()
                return
            try:
                self.service.loop_alive()
                self.service.tick()
            except Exception:
                log.exception("membership tick failed; retrying in %.3gs", interval)

    async def stop(self) -> None:
        """Stop serving, write pending heartbeats, close the state file and let the
        state directory go (a standby may take it from here)."""
        try:
            if self._ticker is not None:
                self._ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._ticker
                self._ticker = None
            await self._runner.cleanup()
            self.service.close()
        finally:
            if self.lock is not None:
                self.lock.release()
        log.info("master stopped")


def tick_interval(settings: MasterSettings) -> float:
    """Seconds between membership ticks: half the shorter period, so an expiry is
    noticed within half a period of it."""
    return min(settings.heartbeat_interval, settings.worker_expiry) / 2


async def start_master(settings: MasterSettings, lock: StateLock | None = None) -> MasterServer:
    """Take ``settings.state_dir``'s lock (unless ``lock``, already held, is given;
    InvalidArgument when another master holds it), open the state there, bind and
    start serving."""
    if lock is None:
        lock = StateLock(settings.state_dir)
        lock.acquire()
    try:
        state = MasterState(settings.state_dir)
    except BaseException:
        lock.release()
        raise
    # expiry counts only the time this loop could have read a heartbeat: a tick is
    # due every interval, so two of them missed mean the loop itself stalled
    clock = LoopClock(2 * tick_interval(settings))
    try:
        server = MasterServer(settings, MasterService(settings, state, clock), lock)
    except BaseException:
        state.close()
        lock.release()
        raise
    try:
        await server._start()
    except BaseException:
        await server.stop()
        raise
    return server


def write_url_file(path: str, url: str) -> None:
    """Publish ``url`` at ``path`` atomically: readers see nothing or the whole URL."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".url-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(url + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


async def _standby(settings: MasterSettings, stop: threading.Event) -> StateLock | None:
    """The state directory's lock, once the active master lets it go; None when a
    signal came first."""
    lock = StateLock(settings.state_dir)
    try:
        lock.acquire()
        return lock
    except InvalidArgument:
        pass
    log.info(
        "standby: %s is served by another master (%s); taking over when it stops",
        settings.state_dir,
        describe(holder(lock.path)),
    )
    loop = asyncio.get_running_loop()
    if not await loop.run_in_executor(None, lock.wait, stop):
        return None
    log.info("standby: the active master is gone; taking over %s", settings.state_dir)
    return lock


async def _serve(settings: MasterSettings) -> None:
    stop = asyncio.Event()
    stopped = threading.Event()  # the same, for the standby's waiting thread
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        stop.set()
        stopped.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    lock = None
    if settings.standby:
        lock = await _standby(settings, stopped)
        if lock is None:
            log.info("signal received while standing by")
            return
    server = await start_master(settings, lock)
    try:
        if settings.url_file:
            write_url_file(settings.url_file, server.url)
        done = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(server.deposed.wait())}
        _, pending = await asyncio.wait(done, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if server.deposed.is_set():
            raise Unavailable(
                f"another master took over {settings.state_dir}: this one stopped serving"
            )
        log.info("signal received; shutting down")
    finally:
        await server.stop()
        if settings.url_file:
            # a URL file that outlives the master would point readers at a dead port
            with contextlib.suppress(OSError):
                os.unlink(settings.url_file)


def run_master(settings: MasterSettings) -> None:
    """Run a master in this process until SIGTERM or SIGINT, then return normally."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    uvloop.run(_serve(settings))

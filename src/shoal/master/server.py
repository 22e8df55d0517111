"""The master's HTTP JSON API (aiohttp) and its process entry points.

Routes are the constants in :mod:`shoal.proto.control`; handlers only decode the
request, call :class:`~shoal.master.service.MasterService` and encode the answer.
Errors leave as ``{"error": {"code", "message"}}`` with the status from
:func:`shoal.proto.control.http_status`; unexpected exceptions are logged here and
answered with a generic 500.

- :func:`start_master` binds (port 0 picks a free port) and returns a running
  :class:`MasterServer`; ``await server.stop()`` shuts it down.
- :func:`run_master` runs one master on uvloop until SIGTERM or SIGINT, publishing its
  URL in ``settings.url_file`` once it listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

import shoal
from shoal.config import MasterSettings, cluster_secret
from shoal.core.tls import server_context
from shoal.core.tokens import ADMIN
from shoal.errors import InvalidArgument, NotFound, ShoalError
from shoal.master import validate
from shoal.master.adminroutes import add_admin_routes
from shoal.master.auth import Gate, claims_of, visible
from shoal.master.jobroutes import add_job_routes
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

    def __init__(self, settings: MasterSettings, service: MasterService) -> None:
        self.settings = settings
        self.service = service
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
        log.info("master listening on %s (state %s)", self.url, self.service.state.path)

    async def _tick_loop(self) -> None:
        interval = tick_interval(self.settings)
        while True:
            await asyncio.sleep(interval)
            try:
                self.service.loop_alive()
                self.service.tick()
            except Exception:
                log.exception("membership tick failed; retrying in %.3gs", interval)

    async def stop(self) -> None:
        """Stop serving, write pending heartbeats and close the state file."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        await self._runner.cleanup()
        self.service.close()
        log.info("master stopped")


def tick_interval(settings: MasterSettings) -> float:
    """Seconds between membership ticks: half the shorter period, so an expiry is
    noticed within half a period of it."""
    return min(settings.heartbeat_interval, settings.worker_expiry) / 2


async def start_master(settings: MasterSettings) -> MasterServer:
    """Open the state in ``settings.state_dir``, bind and start serving."""
    state = MasterState(settings.state_dir)
    # expiry counts only the time this loop could have read a heartbeat: a tick is
    # due every interval, so two of them missed mean the loop itself stalled
    clock = LoopClock(2 * tick_interval(settings))
    try:
        server = MasterServer(settings, MasterService(settings, state, clock))
    except BaseException:
        state.close()
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


async def _serve(settings: MasterSettings) -> None:
    server = await start_master(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        if settings.url_file:
            write_url_file(settings.url_file, server.url)
        await stop.wait()
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

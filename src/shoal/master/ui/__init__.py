"""The master's web console, served under ``/ui`` on the API's port.

Pages (server-rendered HTML; one small script refreshes them):

- ``/ui/`` overview: capacity and use per tier, cached bytes, hit ratios, read
  throughput by source and workers up/down, with charts from the master's history;
- ``/ui/datasets`` and ``/ui/datasets/{name}``: sizes, cached %, hit ratio, policy;
  a dataset's mounts, its cache per worker, its jobs and schedules, its throughput;
- ``/ui/jobs``: loads, frees and syncs with progress, rate, ETA and failures, stop and
  resume buttons (they POST to the job API), schedules with their next run;
- ``/ui/workers``: tiers, used/quota, watermarks, evictions/s, corrupt pages, disk
  health, version and uptime of each worker.

JSON for the live parts lives under ``/ui/api/``: ``/ui/api/page/{page}`` answers
``{"data", "parts"}`` (the page's figures and its re-rendered fragments) and
``/ui/api/history?dataset=&minutes=`` the chart series. :func:`add_ui_routes` also
runs the history sampler (:mod:`shoal.master.history`) for as long as the app runs.
Static files come from the package (``static/``); nothing is fetched from elsewhere, so
the console works without internet access.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from importlib import resources
from typing import Any

from aiohttp import web

from shoal.errors import InvalidArgument, NotFound, PermissionDenied, ShoalError
from shoal.master.history import History
from shoal.master.service import MasterService
from shoal.master.ui import data, pages
from shoal.master.ui.fmt import url_part
from shoal.proto import control

log = logging.getLogger("shoal.master.ui")

#: the console's pages only load what the master serves (no CDN, no inline script)
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
#: ``visible(request, items, key)``: the items naming datasets the caller may see
Visible = Callable[[web.Request, list[Any], Callable[[Any], str]], list[Any]]
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}


class Console:
    """The console's state: the service it shows and the history it samples."""

    def __init__(
        self, service: MasterService, history: History, visible: Visible | None = None
    ) -> None:
        self.service = service
        self.history = history
        self.visible = visible
        self.static: dict[str, bytes] = {}
        root = resources.files(__package__).joinpath("static")
        try:
            for entry in root.iterdir():
                if entry.is_file() and any(entry.name.endswith(s) for s in STATIC_TYPES):
                    self.static[entry.name] = entry.read_bytes()
        except OSError as exc:  # an install without the package data: pages still render
            log.error("console static files missing (%s): pages come without style or script", exc)

    def sample(self) -> None:
        snap = self.service.snapshot()
        self.history.sample(snap.records, snap.dataset_names, time.time())

    async def run_sampler(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:
                log.exception("console history sample failed; trying again next period")
            await asyncio.sleep(self.history.interval)


_CTX: web.AppKey[Console] = web.AppKey("console", Console)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Page = tuple[str, Callable[[Mapping[str, Any]], dict[str, str]], str]


def _allowed(request: web.Request) -> data.Allowed:
    visible = request.app[_CTX].visible
    if visible is None:
        return data.everyone
    return lambda name: bool(visible(request, [name], str))


def _page(request: web.Request, page: str, name: str = "") -> tuple[dict[str, Any], Page]:
    console = request.app[_CTX]
    s, h, ok = console.service, console.history, _allowed(request)
    if page == "overview":
        return data.overview(s, h), ("Overview", pages.overview_parts, pages.OVERVIEW)
    if page == "datasets":
        return data.datasets(s, ok), ("Datasets", pages.datasets_parts, pages.DATASETS)
    if page == "dataset":
        d = data.dataset(s, h, name, ok)
        return d, (f"Dataset {name}", pages.dataset_parts, pages.dataset_body(name))
    if page == "jobs":
        return data.jobs(s, ok), ("Jobs", pages.jobs_parts, pages.JOBS)
    if page == "workers":
        return data.workers(s, h), ("Workers", pages.workers_parts, pages.WORKERS)
    raise NotFound(f"no console page {page!r}")


def _headers(resp: web.StreamResponse) -> web.StreamResponse:
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Cache-Control"] = "no-store"
    return resp


def _html(request: web.Request, page: str, name: str = "") -> web.StreamResponse:
    try:
        d, (title, parts, body) = _page(request, page, name)
    except ShoalError as exc:  # a page for people: the message inside the console's frame
        html = pages.error_page(page, control.http_status(exc), exc.message)
        return _headers(web.Response(text=html, content_type="text/html", status=exc.http_status))
    api = f"{pages.PREFIX}/api/page/{page}"
    if name:
        api += f"?name={url_part(name)}"
    html = pages.layout("datasets" if page == "dataset" else page, title, api, parts(d), body)
    return _headers(web.Response(text=html, content_type="text/html"))


async def _overview(request: web.Request) -> web.StreamResponse:
    return _html(request, "overview")


async def _datasets(request: web.Request) -> web.StreamResponse:
    return _html(request, "datasets")


async def _dataset(request: web.Request) -> web.StreamResponse:
    return _html(request, "dataset", request.match_info["name"])


async def _jobs(request: web.Request) -> web.StreamResponse:
    return _html(request, "jobs")


async def _workers(request: web.Request) -> web.StreamResponse:
    return _html(request, "workers")


async def _root(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound(f"{pages.PREFIX}/")


def _json_errors(handler: Handler) -> Handler:
    """Errors as the API's ``{"error": {"code", "message"}}`` body and status."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ShoalError as exc:
            body = control.error_body(exc)
            return _headers(web.json_response(body, status=control.http_status(exc)))

    return wrapped


@_json_errors
async def _api_page(request: web.Request) -> web.StreamResponse:
    page = request.match_info["page"]
    d, (_title, parts, _body) = _page(request, page, request.query.get("name", ""))
    return _headers(web.json_response({"data": d, "parts": parts(d)}))


@_json_errors
async def _api_history(request: web.Request) -> web.StreamResponse:
    console = request.app[_CTX]
    dataset = request.query.get("dataset") or None
    if dataset is not None and not _allowed(request)(dataset):
        raise PermissionDenied(f"this token does not grant dataset {dataset!r}")
    try:
        minutes = float(request.query.get("minutes", "60"))
    except ValueError:
        raise InvalidArgument("minutes must be a number") from None
    if not 0 < minutes <= 24 * 60:
        raise InvalidArgument("minutes must be in (0, 1440]")
    return _headers(web.json_response(console.history.series(dataset, minutes * 60)))


@_json_errors
async def _static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["file"]
    body = request.app[_CTX].static.get(name)
    if body is None:
        raise NotFound(f"no console file {name!r}")
    ctype = next(t for s, t in STATIC_TYPES.items() if name.endswith(s))
    return _headers(web.Response(body=body, content_type=ctype))


def add_ui_routes(
    app: web.Application,
    service: MasterService,
    visible: Visible | None = None,
    history: History | None = None,
) -> None:
    """Serve the console from ``app`` and sample ``history`` while the app runs;
    ``visible`` filters dataset names by the caller's token (None: all are shown)."""
    console = Console(service, history or History(), visible)
    app[_CTX] = console

    async def sampler(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(console.run_sampler(), name="shoal-console-history")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(sampler)
    p = pages.PREFIX
    app.router.add_get(p, _root)
    app.router.add_get(f"{p}/", _overview)
    app.router.add_get(f"{p}/datasets", _datasets)
    app.router.add_get(f"{p}/datasets/{{name}}", _dataset)
    app.router.add_get(f"{p}/jobs", _jobs)
    app.router.add_get(f"{p}/workers", _workers)
    app.router.add_get(f"{p}/static/{{file}}", _static)
    app.router.add_get(f"{p}/api/page/{{page}}", _api_page)
    app.router.add_get(f"{p}/api/history", _api_history)

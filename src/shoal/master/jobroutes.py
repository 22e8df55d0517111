"""HTTP routes for jobs, schedules, worker task claims, manifests and watches.

Workers long-poll ``GET /api/v1/workers/{id}/tasks?wait=S`` for work and report with
``POST /api/v1/tasks/{id}`` (JSON, or msgpack for large listing results). Watchers
long-poll ``GET /api/v1/watch`` (the contract is in :mod:`shoal.proto.control`). A
caller waiting for a job's end long-polls ``GET /api/v1/jobs/{id}?wait=S``: answered
when the job is done, failed or stopped, or after S seconds (30 at most) with its view
then.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack
from aiohttp import web

from shoal.core.jobs import ENDED, JobSpec
from shoal.errors import InvalidArgument
from shoal.master.jobs import JobManager
from shoal.master.jobstate import Job
from shoal.master.validate import parse_json
from shoal.proto import control

JOBS = control.JOBS
JOB = control.JOB
JOB_STOP = f"{control.JOB}/stop"
JOB_RESUME = f"{control.JOB}/resume"
CLAIM = control.CLAIM
TASK = control.TASK
MANIFEST = control.MANIFEST
MSGPACK = control.MSGPACK

_JOBS: web.AppKey[JobManager] = web.AppKey("jobs", JobManager)
_WAKE: web.AppKey[list[asyncio.Event]] = web.AppKey("wake", list)
_CLOSING: web.AppKey[list[bool]] = web.AppKey("closing", list)
_GEN: web.AppKey[list[asyncio.Event]] = web.AppKey("generation", list)
_ENDED: web.AppKey[list[asyncio.Event]] = web.AppKey("ended", list)

T = TypeVar("T")

#: seconds a long-poll may be held at most
MAX_WAIT = 30.0


def _wait_arg(request: web.Request) -> float:
    try:
        wait = float(request.query.get("wait", "0"))
    except ValueError:
        raise InvalidArgument("wait must be a number of seconds") from None
    if not math.isfinite(wait):
        raise InvalidArgument("wait must be a number of seconds")
    return min(MAX_WAIT, max(0.0, wait))


async def _hold(
    request: web.Request,
    events: web.AppKey[list[asyncio.Event]],
    wait: float,
    probe: Callable[[], tuple[bool, T]],
) -> T:
    """What ``probe`` says once it says it is ready, or when ``wait`` seconds have
    passed or the master shuts down (what it says then); looked at again each time
    ``events`` is pulsed (the event is taken before each look, so no pulse is missed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        event = request.app[events][0]
        ready, value = probe()
        left = deadline - loop.time()
        if ready or left <= 0 or request.app[_CLOSING][0]:
            return value
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), left)


def _pulse(app: web.Application, events: web.AppKey[list[asyncio.Event]]) -> None:
    """Wake every long-poll waiting on ``events`` (the next ones wait on a fresh event)."""
    old, app[events][0] = app[events][0], asyncio.Event()
    old.set()


async def _decode(request: web.Request) -> Any:
    raw = await request.read()
    try:
        if request.content_type == MSGPACK:
            return msgpack.unpackb(raw, raw=False)
        return parse_json(raw) if raw.strip() else {}
    except (ValueError, msgpack.ExtraData) as exc:
        raise InvalidArgument(f"malformed body: {exc}") from None


async def _submit(request: web.Request) -> web.Response:
    body = await _decode(request)
    if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
        raise InvalidArgument("job body must be {'spec': {...}, 'schedule': CRON or null}")
    schedule = body.get("schedule")
    if schedule is not None and not isinstance(schedule, str):
        raise InvalidArgument("schedule must be a cron expression string")
    view = request.app[_JOBS].submit(JobSpec.from_dict(body["spec"]), schedule)
    return web.json_response(view, status=201)


async def _list(request: web.Request) -> web.Response:
    return web.json_response(request.app[_JOBS].all())


async def _get(request: web.Request) -> web.Response:
    jobs, jid = request.app[_JOBS], request.match_info["id"]

    def probe() -> tuple[bool, dict[str, Any]]:
        view = jobs.get(jid)
        return view.get("state") in ENDED, view

    return web.json_response(await _hold(request, _ENDED, _wait_arg(request), probe))


async def _stop(request: web.Request) -> web.Response:
    return web.json_response(request.app[_JOBS].stop(request.match_info["id"]))


async def _resume(request: web.Request) -> web.Response:
    return web.json_response(request.app[_JOBS].resume(request.match_info["id"]))


async def _claim(request: web.Request) -> web.Response:
    jobs, wid = request.app[_JOBS], request.match_info["id"]

    def probe() -> tuple[bool, Any]:
        task = jobs.claim(wid)
        return task is not None, task

    return web.json_response({"task": await _hold(request, _WAKE, _wait_arg(request), probe)})


async def _report(request: web.Request) -> web.Response:
    try:
        tid = int(request.match_info["id"])
    except ValueError:
        raise InvalidArgument("task id must be a number") from None
    body = await _decode(request)
    if not isinstance(body, dict):
        raise InvalidArgument("task report must be an object")
    return web.json_response(request.app[_JOBS].report(tid, body))


def _watch_args(request: web.Request) -> tuple[int, float, str]:
    q = request.query
    try:
        since = int(q.get("since", "0"))
    except ValueError:
        raise InvalidArgument("since must be an integer (a datasets generation)") from None
    try:
        timeout = float(q.get("timeout", str(control.WATCH_DEFAULT_TIMEOUT)))
    except ValueError:
        raise InvalidArgument("timeout must be a number of seconds") from None
    if not math.isfinite(timeout) or timeout < 0:
        raise InvalidArgument("timeout must be a number of seconds >= 0")
    watcher = q.get("watcher", "")
    if not watcher or len(watcher) > 256 or not watcher.isprintable():
        raise InvalidArgument("watcher must be an id of 1-256 printable characters")
    return since, min(timeout, control.WATCH_MAX_TIMEOUT), watcher


async def _watch(request: web.Request) -> web.Response:
    since, timeout, watcher = _watch_args(request)
    jobs = request.app[_JOBS]

    def probe() -> tuple[bool, int]:
        gen = jobs.generation()
        return gen > since, gen

    jobs.watch_begin(watcher, since)
    try:
        body: control.WatchResponse = {
            "datasets_generation": await _hold(request, _GEN, timeout, probe)
        }
        return web.json_response(body)
    finally:
        jobs.watch_end(watcher)


async def _manifest(request: web.Request) -> web.Response:
    mid, raw = request.app[_JOBS].manifest_bytes(request.match_info["name"])
    return web.Response(body=raw, content_type=MSGPACK, headers={control.MANIFEST_HEADER: mid})


def add_job_routes(app: web.Application, jobs: JobManager) -> None:
    app[_JOBS] = jobs
    app[_CLOSING] = [False]
    for key in (_WAKE, _GEN, _ENDED):
        app[key] = [asyncio.Event()]
    jobs.on_tasks = lambda: _pulse(app, _WAKE)
    jobs.on_generation = lambda: _pulse(app, _GEN)

    def job_written(job: Job) -> None:
        if job.state in ENDED:
            _pulse(app, _ENDED)

    jobs.state.on_put_job = job_written

    async def closing(app: web.Application) -> None:
        app[_CLOSING][0] = True  # long-polls answer now instead of holding up the shutdown
        for key in (_WAKE, _GEN, _ENDED):
            _pulse(app, key)

    app.on_shutdown.append(closing)
    app.router.add_post(JOBS, _submit)
    app.router.add_get(JOBS, _list)
    app.router.add_get(JOB, _get)
    app.router.add_post(JOB_STOP, _stop)
    app.router.add_post(JOB_RESUME, _resume)
    app.router.add_get(CLAIM, _claim)
    app.router.add_post(TASK, _report)
    app.router.add_get(MANIFEST, _manifest)
    app.router.add_get(control.WATCH, _watch)

"""Who may call which route of the master's API.

With a cluster secret (``shoal master --secret-file``), every request carries a token
(``Authorization: Bearer <token>``; the console also takes the ``shoal_token``
cookie) signed with it (see :mod:`shoal.core.tokens`), checked before the handler
runs. Without a secret the API is open, and the master says so at start.

==========================================  ===========================================
route                                       roles
==========================================  ===========================================
GET health, GET /metrics                    anyone (no token needed)
GET datasets, dataset, manifest, ring,      reader, worker, admin; a reader limited to
report, watch, jobs, job; GET /ui/...       datasets sees only those (lists filtered,
                                            other names refused)
POST register, heartbeat, GET task claims,  worker, admin (a worker drains only
POST task reports, POST worker drain         itself: the request carries its key)
everything else (create/patch/delete        admin
datasets, submit/stop/resume jobs, backup,
tokens)
==========================================  ===========================================

A refusal answers 401 (no token, or one this cluster did not sign, or expired) or 403
(a valid token without the role or the dataset), is logged with the reason and the
holder's name (never the token) and counted in ``refusals``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from shoal.core.tokens import ADMIN, READER, WORKER, Claims, verify
from shoal.errors import ShoalError, Unauthenticated
from shoal.proto import control

log = logging.getLogger("shoal.master.auth")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CLAIMS: web.RequestKey[Claims] = web.RequestKey("claims", Claims)
#: what an open API (no secret) grants
OPEN_CLAIMS = Claims("anonymous", ADMIN)
COOKIE = "shoal_token"

_OPEN = {("GET", control.HEALTH), ("GET", control.METRICS)}
_READ = {
    ("GET", control.DATASETS),
    ("GET", control.DATASET),
    ("GET", control.MANIFEST),
    ("GET", control.RING),
    ("GET", control.REPORT),
    ("GET", control.WATCH),
    ("GET", control.JOBS),
    ("GET", control.JOB),
}
_WORKER = {
    ("POST", control.WORKER_REGISTER),
    ("POST", control.WORKER_HEARTBEAT),
    ("GET", control.CLAIM),
    ("POST", control.TASK),
    # a worker drains itself (SIGTERM with a drain timeout), proving it with its key
    ("POST", control.WORKER_DRAIN),
}


def required_roles(method: str, route: str) -> tuple[str, ...] | None:
    """The roles that may call ``method route`` (the route's pattern); None: anyone."""
    method = "GET" if method == "HEAD" else method
    if (method, route) in _OPEN:
        return None
    if (method, route) in _READ or (method == "GET" and route.startswith("/ui")):
        return (READER, WORKER)
    if (method, route) in _WORKER:
        return (WORKER,)
    return (ADMIN,)


def _token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    if header:
        kind, _, value = header.partition(" ")
        if kind.lower() != "bearer" or not value.strip():
            raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
        return value.strip()
    return request.cookies.get(COOKIE)


def claims_of(request: web.Request) -> Claims:
    """The claims the request was let in with (an open API: admin)."""
    got = request.get(CLAIMS)
    return got if isinstance(got, Claims) else OPEN_CLAIMS


class Gate:
    """The auth middleware and its refusal counts."""

    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret
        self.refusals: Counter[str] = Counter()

    @property
    def on(self) -> bool:
        return self.secret is not None

    def check(self, request: web.Request) -> Claims:
        route = request.match_info.route.resource
        pattern = route.canonical if route is not None else request.path
        roles = required_roles(request.method, pattern)
        if roles is None or self.secret is None:
            return OPEN_CLAIMS
        token = _token(request)
        if not token:
            raise Unauthenticated(
                "this master requires a token: set SHOAL_TOKEN or SHOAL_TOKEN_FILE (shoal up "
                "writes one), or ask an admin for one (shoal token create)"
            )
        claims = verify(self.secret, token)
        claims.require_role(*roles)
        name = request.match_info.get("name")
        if name is not None and pattern in (control.DATASET, control.MANIFEST):
            claims.require_dataset(name)
        return claims

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            request[CLAIMS] = self.check(request)
        except ShoalError as exc:
            kind = "unauthenticated" if isinstance(exc, Unauthenticated) else "denied"
            self.refusals[kind] += 1
            log.warning(
                "refused %s %s from %s: %s",
                request.method,
                request.path,
                request.remote,
                exc.message,
            )
            raise
        return await handler(request)


def visible(request: web.Request, items: list[Any], key: Callable[[Any], str]) -> list[Any]:
    """``items`` less those naming a dataset the caller's token does not grant."""
    claims = claims_of(request)
    if claims.datasets is None:
        return items
    return [i for i in items if claims.may_use(key(i))]

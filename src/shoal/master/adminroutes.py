"""Admin routes of the master's API: the online backup and token minting.

``POST /api/v1/tokens`` with ``{"name", "role", "datasets"?, "ttl"?}`` answers
``{"token"}``: a token signed with the cluster secret (admin only, like every route
here; see :mod:`shoal.master.auth`). A master without a secret cannot mint.

``GET /api/v1/backup`` answers a backup archive (see :mod:`shoal.master.backup`): the
snapshot is taken synchronously on the event loop, so it is one instant of the state;
the tar is written in a thread and streamed from a temporary file that is removed
once sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile

from aiohttp import web

from shoal.core.tokens import mint
from shoal.errors import InvalidArgument
from shoal.master import backup
from shoal.master.auth import Gate, claims_of
from shoal.master.service import MasterService
from shoal.master.validate import parse_json
from shoal.proto import control

log = logging.getLogger("shoal.master.backup")


def add_admin_routes(app: web.Application, service: MasterService, gate: Gate) -> None:
    state_dir = service.settings.state_dir
    backup.remove_stale(state_dir)
    lock = asyncio.Lock()

    async def _backup(request: web.Request) -> web.StreamResponse:
        async with lock:  # one at a time: each holds a copy of the state on disk
            work = backup.snapshot(
                service.state.backup_into, service.jobs.state.backup_into, state_dir
            )
            fd, tar = tempfile.mkstemp(prefix=".backup-", suffix=".tar", dir=state_dir)
            os.close(fd)
            try:
                info = await asyncio.to_thread(backup.write_archive, work, tar)
            finally:
                await asyncio.to_thread(shutil.rmtree, work, True)
            try:
                log.info(
                    "backup: %d datasets, %d jobs, %d manifests, %d bytes",
                    info.datasets,
                    info.jobs,
                    info.manifests,
                    info.size,
                )
                resp = web.StreamResponse(
                    headers={
                        "Content-Type": "application/x-tar",
                        "Content-Length": str(info.size),
                        control.BACKUP_HEADER: str(info.created),
                    }
                )
                await resp.prepare(request)
                with open(tar, "rb") as f:
                    while chunk := await asyncio.to_thread(f.read, 4 << 20):
                        await resp.write(chunk)
                await resp.write_eof()
                return resp
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tar)

    async def _mint(request: web.Request) -> web.Response:
        if gate.secret is None:
            raise InvalidArgument("this master runs without a cluster secret: no tokens to mint")
        body = parse_json(await request.read())
        if not isinstance(body, dict):
            raise InvalidArgument("token body must be {'name', 'role', 'datasets'?, 'ttl'?}")
        datasets = body.get("datasets")
        ttl = body.get("ttl")
        if datasets is not None and not (
            isinstance(datasets, list) and all(isinstance(d, str) for d in datasets)
        ):
            raise InvalidArgument("datasets must be a list of dataset names")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)):
            raise InvalidArgument("ttl must be a number of seconds")
        token = mint(
            gate.secret, str(body.get("name", "")), str(body.get("role", "")), datasets, ttl
        )
        who = claims_of(request).name
        log.info("token for %r (%s) minted by %r", body.get("name"), body.get("role"), who)
        return web.json_response({"token": token}, status=201)

    app.router.add_get(control.BACKUP, _backup)
    app.router.add_post(control.TOKENS, _mint)

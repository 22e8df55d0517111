"""Admin routes of the master's API: the online backup.

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

from shoal.master import backup
from shoal.master.service import MasterService
from shoal.proto import control

log = logging.getLogger("shoal.master.backup")


def add_admin_routes(app: web.Application, service: MasterService) -> None:
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

    app.router.add_get(control.BACKUP, _backup)

"""CREATE, APPEND and DELETE of the WebHDFS gateway: passed through to the under store
of a dataset started as writable (``--writable DATASET``), with shoal.client.writes.

A write is of whole objects (the under stores are object stores): the body is spooled
to a local file, with a size limit checked while it arrives, then uploaded and the key
synced, so that reads through the cache see the new bytes when the answer comes. An
APPEND rewrites the object with the new bytes after the old ones: right for the small
appends fsspec's writer makes (it CREATEs empty, then APPENDs its buffer), costly for a
large file grown many times. MKDIRS, RENAME and the other namespace changes are
UnsupportedOperationException: object stores have neither directories nor renames.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

from aiohttp import web

from shoal.client.aio import AsyncClient
from shoal.client.writes import Writer
from shoal.core.types import split_path
from shoal.errors import InvalidArgument, IsADirectory, NotFound
from shoal.gateway import webhdfs_json as js
from shoal.gateway.webhdfs_json import Unsupported

if TYPE_CHECKING:
    from shoal.gateway.webhdfs import WebHdfsGateway
    from shoal.gateway.webhdfs_req import Req

__all__ = ["MAX_WRITE", "Writes"]

#: bytes one CREATE or APPEND may carry (and an APPENDed file may reach)
MAX_WRITE = 5 << 30
_SPOOL_CHUNK = 1 << 20


class TooLarge(InvalidArgument):
    """A write body over the gateway's limit."""


class Writes:
    def __init__(
        self, client: AsyncClient, max_bytes: int = MAX_WRITE, spool_dir: str | None = None
    ) -> None:
        self.client = client
        self.writer = Writer(client)
        self.max_bytes = max_bytes
        self.spool_dir = spool_dir

    async def handle(self, gw: WebHdfsGateway, req: Req) -> web.StreamResponse:
        np = split_path(req.path) if req.path != "/" else None
        if np is None or not np.rel:
            raise Unsupported(f"{req.op} needs a file path /<dataset>/<mount>/<path>")
        gw.access.check_write(req.who, np.dataset)
        if req.op == "DELETE":
            return await self._delete(req)
        if req.op not in ("CREATE", "APPEND"):
            raise Unsupported(f"{req.op} is not supported: under stores are object stores")
        existing = await self._existing(req.path)
        if req.op == "CREATE" and existing is not None and not _true(req, "overwrite"):
            return _exists(req.path)
        if req.op == "APPEND" and existing is None:
            raise NotFound(f"File does not exist: {req.path}")
        if not req.redirected and not _true(req, "data"):
            return gw.redirect(req)
        try:
            with tempfile.NamedTemporaryFile(dir=self.spool_dir, prefix="shoal-webhdfs-") as f:
                size = 0
                if req.op == "APPEND" and existing:
                    size = await self._copy_existing(req.path, existing, f.fileno())
                size += await self._spool(req.http, f.fileno(), self.max_bytes - size)
                f.flush()
                await self.writer.put_file(req.path, f.name)
        except TooLarge as exc:
            return web.json_response(js.remote_exception(413, exc.message), status=413)
        if req.op == "APPEND":
            resp = web.Response(status=200)
        else:
            resp = web.Response(status=201)
            resp.headers["Location"] = f"webhdfs://{req.http.host}{req.path}"
        resp.shoal_bytes = size  # type: ignore[attr-defined]
        return resp

    async def _existing(self, path: str) -> int | None:
        """The size of the file at ``path``, None when there is none."""
        try:
            info = await self.client.stat(path)
        except NotFound:
            return None
        if info.is_dir:
            raise IsADirectory(f"{path} is a directory")
        return info.size

    async def _copy_existing(self, path: str, size: int, fd: int) -> int:
        if size > self.max_bytes:
            raise TooLarge(f"{path} is already over the {self.max_bytes}-byte write limit")
        done = 0
        while done < size:
            chunk = await self.client.read(path, done, min(8 << 20, size - done))
            if not chunk:
                raise NotFound(f"{path} shrank while it was appended to")
            _write_all(fd, chunk)
            done += len(chunk)
        return done

    async def _spool(self, http: web.Request, fd: int, room: int) -> int:
        if http.content_length is not None and http.content_length > room:
            raise TooLarge(f"request body over the {self.max_bytes}-byte write limit")
        size = 0
        while True:
            chunk = await http.content.read(_SPOOL_CHUNK)
            if not chunk:
                return size
            size += len(chunk)
            if size > room:
                raise TooLarge(f"request body over the {self.max_bytes}-byte write limit")
            _write_all(fd, chunk)

    async def _delete(self, req: Req) -> web.StreamResponse:
        try:
            existing = await self._existing(req.path)
        except IsADirectory:
            raise Unsupported("DELETE of a directory is not supported") from None
        if existing is None:
            return web.json_response({"boolean": False})
        await self.writer.delete(req.path)
        return web.json_response({"boolean": True})

    async def close(self) -> None:
        await self.writer.close()


def _true(req: Req, name: str) -> bool:
    return req.params.get(name, "").lower() == "true"


def _exists(path: str) -> web.Response:
    # HDFS answers an IOException with 403 (its ExceptionHandler)
    body = js.remote_exception(
        403, f"{path} for client already exists", "FileAlreadyExistsException"
    )
    return web.json_response(body, status=403)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]

"""The WebHDFS-compatible gateway: ``/webhdfs/v1/<dataset>/<mount>/<path>?op=...`` over
the client, for Hadoop's WebHdfsFileSystem (and so Spark), fsspec and HdfsCLI.

Reads: GETFILESTATUS, LISTSTATUS, LISTSTATUS_BATCH, OPEN, GETCONTENTSUMMARY,
GETFILECHECKSUM, GETHOMEDIRECTORY, GETFILEBLOCKLOCATIONS, GET_BLOCK_LOCATIONS,
GETSERVERDEFAULTS, GETSTATUS. Writes (CREATE, APPEND, DELETE) pass through to the
under store of a dataset named writable (shoal.gateway.webhdfs_write).

Redirects: a NameNode answers OPEN, GETFILECHECKSUM, CREATE and APPEND with a 307 to a
DataNode, and Hadoop's client accepts nothing else. Here the "DataNode" is this same
gateway: the 307 points back at the request with ``namenoderpcaddress=shoal`` added,
and a request that carries it is answered. An OPEN that names ``length`` (Hadoop's
client never does; fsspec and HdfsCLI do) is answered at once, saving a round trip;
``noredirect=true`` gets the target as JSON ``{"Location": ...}``.

Block size: the gateway's ``block_size`` (default 128 MiB, HDFS's), not the dataset's
page size: Hadoop input formats split work by block, and a 1 MiB split per task would
be ruinous. A file's blocks all report the file's owning workers, since placement is
by file (README: "Placement"), so Spark schedules a file's tasks next to its cache.

Paths are taken from the raw request line and decoded once here: Hadoop sends raw
UTF-8 bytes in paths, which aiohttp's C parser rejects, so the gateway makes aiohttp
use its pure-Python parser (:func:`use_python_parser`, process-wide); '.' and '..'
segments and NUL are refused before any work.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp.http_parser
import aiohttp.web_protocol
from aiohttp import web

from shoal.client.aio import AsyncClient
from shoal.client.wholefile import LocalFiles
from shoal.core.types import FileInfo, split_path
from shoal.errors import InvalidArgument, IsADirectory, NotFound, PermissionDenied, ShoalError
from shoal.gateway import webhdfs_json as js
from shoal.gateway.metrics import GatewayMetrics
from shoal.gateway.server import send_file_range
from shoal.gateway.webhdfs_auth import Access
from shoal.gateway.webhdfs_req import PREFIX, Req, parse_target

__all__ = ["PREFIX", "WebHdfsGateway", "use_python_parser"]

log = logging.getLogger("shoal.gateway.webhdfs")

BLOCK_SIZE = 128 << 20
#: entries per LISTSTATUS_BATCH page (HDFS's dfs.ls.limit)
LIST_LIMIT = 1000
#: bytes per read through the client while streaming OPEN or a checksum
CHUNK = 4 << 20
#: a range at least this long is sent with sendfile when a local worker has the file
SENDFILE_MIN = 1 << 20
#: file checksums kept, by (path, version)
CHECKSUMS_KEPT = 1024
#: directories listed at once while GETCONTENTSUMMARY walks a tree
SUMMARY_CONCURRENCY = 16

JSON = "application/json"
OCTETS = "application/octet-stream"

Handler = Callable[["Req"], Awaitable[web.StreamResponse]]


def use_python_parser() -> None:
    """Make aiohttp parse requests with its pure-Python parser in this process: the C
    one answers 400 to the raw UTF-8 that Hadoop's client puts in URL paths (measured;
    ``AIOHTTP_NO_EXTENSIONS=1`` has the same effect when set before aiohttp loads)."""
    aiohttp.web_protocol.HttpRequestParser = aiohttp.http_parser.HttpRequestParserPy  # type: ignore[misc]


#: operations that change the namespace, and the HTTP method each comes with
WRITE_OPS = {
    "CREATE": "PUT",
    "MKDIRS": "PUT",
    "RENAME": "PUT",
    "APPEND": "POST",
    "TRUNCATE": "POST",
    "CONCAT": "POST",
    "DELETE": "DELETE",
}


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(body, status=status, content_type=JSON)


def _name(path: str) -> str:
    return path.rstrip("/").rpartition("/")[2]


class WebHdfsGateway:
    """The gateway's aiohttp application over one AsyncClient."""

    def __init__(
        self,
        client: AsyncClient,
        access: Access,
        *,
        block_size: int = BLOCK_SIZE,
        list_limit: int = LIST_LIMIT,
        writes: Any = None,
    ) -> None:
        if block_size <= 0 or block_size % js.BYTES_PER_CRC:
            raise InvalidArgument("block size must be a positive multiple of 512 bytes")
        if list_limit <= 0:
            raise InvalidArgument("list limit must be positive")
        self.client = client
        self.access = access
        self.block_size = block_size
        self.list_limit = list_limit
        self.metrics = GatewayMetrics("webhdfs")
        #: shoal.gateway.webhdfs_write.Writes, or None for a read-only gateway
        self.writes = writes
        self._checksums: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        #: descriptors of whole local files, for the file's next OPENs (sendfile)
        self.local = LocalFiles(client)
        self.get_ops: dict[str, Handler] = {
            "GETFILESTATUS": self.getfilestatus,
            "LISTSTATUS": self.liststatus,
            "LISTSTATUS_BATCH": self.liststatus_batch,
            "OPEN": self.open,
            "GETCONTENTSUMMARY": self.getcontentsummary,
            "GETFILECHECKSUM": self.getfilechecksum,
            "GETHOMEDIRECTORY": self.gethomedirectory,
            "GETFILEBLOCKLOCATIONS": self.getfileblocklocations,
            "GET_BLOCK_LOCATIONS": self.get_block_locations,
            "GETSERVERDEFAULTS": self.getserverdefaults,
            "GETSTATUS": self.getstatus,
        }

    def app(self) -> web.Application:
        use_python_parser()
        app = web.Application(client_max_size=1 << 20)
        app.router.add_get("/metrics", self.metrics.handler)
        app.router.add_route("*", PREFIX + "{tail:.*}", self.dispatch)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _cleanup(self, app: web.Application) -> None:
        self.local.close()

    # -- dispatch ---------------------------------------------------------------------

    async def dispatch(self, http: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        op, status, nbytes = "-", 500, 0
        try:
            path, params = parse_target(http.raw_path)
            op = params.get("op", "").upper() or "-"
            req = Req(http, path, params, self.access.who(params))
            resp = await self._route(req)
            status = resp.status
            nbytes = getattr(resp, "shoal_bytes", 0) or (resp.content_length or 0)
            return resp
        except ShoalError as exc:
            status, body = js.from_error(exc)
            if status >= 500:
                log.warning("webhdfs %s failed: %s", op, exc)
            return _json(body, status)
        except (ConnectionResetError, asyncio.CancelledError):
            status = 499
            raise
        finally:
            label = op if op in self.get_ops or op in WRITE_OPS else "other"
            self.metrics.observe(label, status, nbytes, time.monotonic() - t0)

    async def _route(self, req: Req) -> web.StreamResponse:
        method = req.http.method
        if method == "GET" and req.op in self.get_ops:
            return await self.get_ops[req.op](req)
        if WRITE_OPS.get(req.op) == method:
            if self.writes is None:
                raise PermissionDenied(f"Permission denied: {req.op}: this gateway is read-only")
            resp: web.StreamResponse = await self.writes.handle(self, req)
            return resp
        kind = {"GET": "Get", "PUT": "Put", "POST": "Post", "DELETE": "Delete"}.get(method)
        if kind is None:
            raise InvalidArgument(f"method {method} is not a WebHDFS method")
        raise InvalidArgument(
            f'Invalid value for webhdfs parameter "op": No enum constant '
            f"org.apache.hadoop.hdfs.web.resources.{kind}OpParam.Op.{req.op[:64]}"
        )

    # -- metadata ---------------------------------------------------------------------

    async def _stat(self, req: Req) -> FileInfo:
        if req.path == "/":
            return FileInfo("/", 0, "", 0.0, True)
        self.access.check_read(req.who, req.dataset)
        return await self.client.stat(req.path)

    def _status(self, info: FileInfo, name: str) -> dict[str, Any]:
        ds = info.path.strip("/").partition("/")[0]
        return js.file_status(
            name,
            info.path,
            is_dir=info.is_dir,
            length=info.size,
            mtime=info.mtime,
            block_size=self.block_size,
            writable=bool(ds) and self.access.is_writable(ds) and self.writes is not None,
        )

    async def _children(self, req: Req) -> list[FileInfo] | None:
        """The entries of the directory at ``req.path``, sorted by name as HDFS sorts
        (UTF-8 bytes); None when it is a file."""
        if req.path == "/":
            names = [d.name for d in await self.client.datasets()]
            entries = [
                FileInfo("/" + n, 0, "", 0.0, True)
                for n in names
                if self.access.can_list(req.who, n)
            ]
        else:
            info = await self._stat(req)
            if not info.is_dir:
                return None
            entries = await self.client.ls(req.path)
        return sorted(entries, key=lambda e: _name(e.path).encode())

    async def getfilestatus(self, req: Req) -> web.StreamResponse:
        info = await self._stat(req)
        return _json({"FileStatus": self._status(info, "")})

    async def liststatus(self, req: Req) -> web.StreamResponse:
        entries = await self._children(req)
        if entries is None:
            return _json(js.file_statuses([self._status(await self._stat(req), "")]))
        return _json(js.file_statuses([self._status(e, _name(e.path)) for e in entries]))

    async def liststatus_batch(self, req: Req) -> web.StreamResponse:
        entries = await self._children(req)
        if entries is None:
            one = [self._status(await self._stat(req), "")]
            return _json(js.directory_listing(one, 0))
        after = req.params.get("startafter", "").encode()
        if after:
            entries = [e for e in entries if _name(e.path).encode() > after]
        page = entries[: self.list_limit]
        statuses = [self._status(e, _name(e.path)) for e in page]
        return _json(js.directory_listing(statuses, len(entries) - len(page)))

    async def getcontentsummary(self, req: Req) -> web.StreamResponse:
        length, files, dirs = 0, 0, 0
        level = [req.path]
        sem = asyncio.Semaphore(SUMMARY_CONCURRENCY)
        top = await self._stat(req)
        if not top.is_dir:
            return _json(js.content_summary(top.size, 1, 0))
        while level:
            dirs += len(level)
            listings = await asyncio.gather(*(self._ls_under(req, p, sem) for p in level))
            level = []
            for entries in listings:
                for e in entries:
                    if e.is_dir:
                        level.append(e.path)
                    else:
                        files += 1
                        length += e.size
        return _json(js.content_summary(length, files, dirs))

    async def _ls_under(self, req: Req, path: str, sem: asyncio.Semaphore) -> list[FileInfo]:
        if path == "/":
            sub = Req(req.http, "/", req.params, req.who)
            return await self._children(sub) or []
        self.access.check_read(req.who, split_path(path).dataset)
        async with sem:
            return await self.client.ls(path)

    async def gethomedirectory(self, req: Req) -> web.StreamResponse:
        # "/" rather than /user/<name>: relative paths then name datasets, and a bare
        # `hadoop fs -ls` lists them instead of failing on a home that cannot exist
        return _json({"Path": "/"})

    async def getserverdefaults(self, req: Req) -> web.StreamResponse:
        return _json(js.server_defaults(self.block_size))

    async def getstatus(self, req: Req) -> web.StreamResponse:
        # the cache's tiers over the live workers (the master's report totals)
        totals = (await self.client.report()).get("totals") or {}
        return _json(js.fs_status(int(totals.get("capacity", 0)), int(totals.get("used", 0))))

    # -- block locations --------------------------------------------------------------

    async def _locations(self, req: Req) -> tuple[FileInfo, list[tuple[int, int]], list[js.Host]]:
        info = await self._stat(req)
        if info.is_dir:
            raise NotFound(f"Path is not a file: {req.path}")
        offset = req.int_param("offset", 0)
        length = req.int_param("length", -1)
        np = split_path(req.path)
        ds = await self.client.dataset(np.dataset)
        owners = (await self.client.owners(ds, np.key_path))[: ds.policy.replicas]
        hosts = [js.Host(w.host, w.port) for w in owners]
        return info, js.blocks(info.size, self.block_size, offset, length), hosts

    async def getfileblocklocations(self, req: Req) -> web.StreamResponse:
        _, spans, hosts = await self._locations(req)
        return _json(js.block_locations(spans, hosts))

    async def get_block_locations(self, req: Req) -> web.StreamResponse:
        info, spans, hosts = await self._locations(req)
        return _json(js.located_blocks(req.path, info.size, self.block_size, spans, hosts))

    # -- data -------------------------------------------------------------------------

    def redirect(self, req: Req) -> web.StreamResponse:
        url = req.redirect_url()
        if req.params.get("noredirect", "").lower() == "true":
            return _json({"Location": url})
        resp = web.Response(status=307, headers={"Location": url}, content_type=OCTETS)
        return resp

    async def open(self, req: Req) -> web.StreamResponse:
        info = await self._stat(req)
        if info.is_dir:
            raise IsADirectory(f"Path is not a file: {req.path}")
        if not req.redirected and "length" not in req.params:
            return self.redirect(req)
        offset = req.int_param("offset", 0)
        length = req.int_param("length", -1)
        if offset > info.size:
            raise InvalidArgument(f"Offset={offset} out of the range [0, {info.size}]")
        end = info.size if length < 0 else min(info.size, offset + length)
        count = end - offset
        resp = web.StreamResponse(status=200)
        resp.content_type = OCTETS
        resp.content_length = count
        sent = 0
        local = None
        if count >= SENDFILE_MIN:
            local = await self.local.open(req.path, info.version, info.size)
        await resp.prepare(req.http)
        try:
            if local is not None:
                sent = await send_file_range(req.http, resp, local, offset, count)
            else:
                while sent < count:
                    n = min(CHUNK, count - sent)
                    chunk = await self.client.read(req.path, offset + sent, n)
                    if not chunk:
                        raise NotFound(f"{req.path} shrank while it was read")
                    await resp.write(chunk)
                    sent += len(chunk)
        except ShoalError as exc:
            # the status line has left: the only way to say "failed" is a short body
            log.warning("webhdfs OPEN %s failed after %d bytes: %s", req.path, sent, exc)
            if req.http.transport is not None:
                req.http.transport.close()
            raise ConnectionResetError("read failed mid-response") from None
        finally:
            if local is not None:
                os.close(local)
        await resp.write_eof()
        resp.shoal_bytes = sent  # type: ignore[attr-defined]
        return resp

    async def getfilechecksum(self, req: Req) -> web.StreamResponse:
        info = await self._stat(req)
        if info.is_dir:
            raise IsADirectory(f"Path is not a file: {req.path}")
        if not req.redirected:
            return self.redirect(req)
        key = (req.path, f"{info.version}:{self.block_size}")
        hit = self._checksums.get(key)
        if hit is None:
            ck = js.HdfsChecksum(self.block_size)
            done = 0
            while done < info.size:
                chunk = await self.client.read(req.path, done, min(CHUNK, info.size - done))
                if not chunk:
                    raise NotFound(f"{req.path} shrank while its checksum was computed")
                await asyncio.to_thread(ck.update, chunk)
                done += len(chunk)
            hit = ck.result()
            self._checksums[key] = hit
            while len(self._checksums) > CHECKSUMS_KEPT:
                self._checksums.popitem(last=False)
        else:
            self._checksums.move_to_end(key)
        return _json(hit)

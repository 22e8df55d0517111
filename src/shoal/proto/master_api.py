"""One client of the master's HTTP API, for every caller: the client library, the
worker and the CLI.

Routes come from :mod:`shoal.proto.control` and every answer goes through
:func:`~shoal.proto.control.raise_for_error`, so the callers never build a URL or read
a status themselves and all of them see the same errors: an error body comes back as
the class of its code, a bodyless 5xx (a proxy's 502, a master restarting) as
:class:`~shoal.errors.Unavailable`, a bodyless 404 as :class:`~shoal.errors.NotFound`,
and a master that cannot be reached (refused, reset, timed out) as Unavailable too.

It lives in ``proto`` because the worker may not import the client package. It owns no
session: the caller passes a factory, so its timeouts, lifetime and fork handling stay
the caller's. A caller may also pass a :class:`~shoal.proto.lighthttp.LightHTTP` for
its GETs (the client library: a reader's master calls are GETs), and then aiohttp is
imported only by the first request that needs it: a new reader process does not pay
its import (about 0.2 s) before its first read.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO, cast
from urllib.parse import urlsplit

import msgpack

from shoal.config import tls_ca_for, token_for
from shoal.core.jobs import ENDED
from shoal.core.manifest import Manifest
from shoal.core.records import record
from shoal.core.tls import WHAT_TO_PASS, TLSRefused, client_context
from shoal.errors import InvalidArgument, NotFound, ProtocolError, Unavailable
from shoal.proto import control as api
from shoal.proto.lighthttp import BadResponse, ConnectError, LightHTTP

if TYPE_CHECKING:
    import aiohttp

#: manifests of at least this many bytes are decoded in a thread (smaller ones inline:
#: a thread hop costs more than their decode)
MANIFEST_INLINE_MAX = 1 << 20
#: seconds between looks at a job when the master does not hold a wait for its end
OLD_MASTER_POLL = 0.1

#: returns the aiohttp session to send on (created, or re-created, by the caller)
SessionFactory = Callable[[], "aiohttp.ClientSession"]


@record(slots=False)
class Answer:
    """A successful (1xx-3xx) answer: its status, raw body and headers."""

    status: int
    raw: bytes
    headers: Mapping[str, str]

    def json(self) -> Any:
        """The body as JSON (None when empty); ProtocolError when it is not JSON."""
        try:
            return json.loads(self.raw) if self.raw else None
        except ValueError:
            raise ProtocolError("the master sent an answer that is not JSON") from None


def _decoded(raw: bytes) -> Any:
    """An error answer's body as JSON, or None: a proxy's HTML page is no error body."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


class _NothingSent(Exception):
    """The address did not take the connection: the next one may take the request."""


class MasterAPI:
    """The master's API at ``master`` (``http://host:port``) over ``session()``; GETs
    over ``light`` when given."""

    def __init__(
        self,
        master: str,
        session: SessionFactory,
        token: str | None = None,
        tls_ca: str | None = None,
        light: LightHTTP | None = None,
    ) -> None:
        #: every address the master may answer at, in order ("URL,URL,..."): a restored
        #: or standby master on another host is found without reconfiguring anyone
        self.masters = [m.strip().rstrip("/") for m in master.split(",") if m.strip()]
        if not self.masters:
            raise InvalidArgument("no master URL")
        self._at = 0
        self._session = session
        #: the bearer token sent with every request (shoal.config.token_for by default)
        self._token = token if token is not None else token_for(master)
        self._auth = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        #: an https master's certificate is checked with this CA (tls_ca, else
        #: SHOAL_TLS_CA; neither: the system's CAs)
        self._ssl = client_context(tls_ca_for(tls_ca, master))
        self._light = light

    @property
    def token(self) -> str | None:
        """The token this client presents (None: none); never shown."""
        return self._token

    @property
    def master(self) -> str:
        """The address that answered last (the first one until one fails)."""
        return self.masters[self._at]

    @staticmethod
    def _shown(url: str) -> str:
        """The URL as errors name it: never with credentials a URL may carry."""
        if "@" not in url:
            return url
        p = urlsplit(url)
        return p._replace(netloc=p.netloc.rpartition("@")[2]).geturl()

    # -- transport --------------------------------------------------------------------

    async def send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        packed: bool = False,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
        connect: float | None = None,
    ) -> Answer:
        """One request; ``body`` goes as JSON, or msgpack with ``packed``; ``timeout``
        (and ``connect``) seconds instead of the session's. Raises the ShoalError the
        answer carries, Unavailable when the master cannot be reached."""
        light = self._light if method == "GET" and body is None else None
        for tries in range(len(self.masters)):
            url = self.master
            try:
                if light is not None:
                    status, raw, headers = await self._light_send(
                        light, url + path, params, timeout
                    )
                else:
                    status, raw, headers = await self._aiohttp_send(
                        method, url + path, body, packed, params, timeout, connect
                    )
                break
            except _NothingSent as exc:
                if tries + 1 < len(self.masters):
                    self._at = (self._at + 1) % len(self.masters)
                    continue
                raise Unavailable(f"master at {self._shown(url)} unreachable: {exc}") from None
        if status >= 400:
            api.raise_for_error(status, _decoded(raw))
        return Answer(status, raw, headers)

    def _untrusted(self, url: str, why: object) -> TLSRefused:
        return TLSRefused(
            f"master at {self._shown(url)}: its TLS certificate is not trusted ({why}): "
            f"{WHAT_TO_PASS}"
        )

    async def _light_send(
        self, light: LightHTTP, url: str, params: Mapping[str, str] | None, timeout: float | None
    ) -> tuple[int, bytes, Mapping[str, str]]:
        try:
            r = await light.get(url, self._auth, params, timeout)
        except ssl.SSLCertVerificationError as exc:
            raise self._untrusted(url, exc.verify_message or exc) from None
        except ConnectError as exc:
            raise _NothingSent(repr(exc)) from None
        except (BadResponse, OSError, TimeoutError) as exc:
            # the request may have arrived: it is not sent to another address
            what = exc if isinstance(exc, BadResponse) else repr(exc)
            raise Unavailable(f"master at {self._shown(url)} unreachable: {what}") from None
        return r.status, r.body, r.headers

    async def _aiohttp_send(
        self,
        method: str,
        url: str,
        body: Any,
        packed: bool,
        params: Mapping[str, str] | None,
        timeout: float | None,
        connect: float | None,
    ) -> tuple[int, bytes, Mapping[str, str]]:
        import aiohttp  # here: a reader's GETs go over LightHTTP and never import it
        from multidict import CIMultiDict

        kw: dict[str, Any] = {"headers": dict(self._auth)}
        if self._ssl is not None:
            kw["ssl"] = self._ssl  # used for https:// addresses only
        if packed:
            kw["data"] = msgpack.packb(body, use_bin_type=True)
            kw["headers"]["Content-Type"] = api.MSGPACK
        elif body is not None:
            kw["json"] = body
        if params is not None:
            kw["params"] = dict(params)
        if timeout is not None:
            kw["timeout"] = aiohttp.ClientTimeout(total=timeout, connect=connect)
        try:
            async with self._session().request(method, url, **kw) as r:
                raw = await r.read()
                # case-insensitive, as HTTP headers are (a proxy may lowercase them)
                return r.status, raw, CIMultiDict(r.headers)
        except aiohttp.ClientConnectorCertificateError as exc:
            why = getattr(exc.certificate_error, "verify_message", exc)
            raise self._untrusted(url, why) from None
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise _NothingSent(repr(exc)) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            # OSError: NotFound and PermissionDenied are OSErrors too, but none is
            # raised inside this block; what lands here is the connection's failure.
            # The request may have arrived: it is not sent to another address.
            raise Unavailable(f"master at {self._shown(url)} unreachable: {exc!r}") from None

    async def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        """:meth:`send` and decode the answer's JSON."""
        return (await self.send(method, path, body=body, **kw)).json()

    async def _object(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        data = await self.call(method, path, body, **kw)
        if not isinstance(data, dict):
            raise ProtocolError(f"the master answered {method} {path} with no JSON object")
        return data

    # -- health, report, watch --------------------------------------------------------

    async def health(self) -> api.HealthResponse:
        return cast(api.HealthResponse, await self._object("GET", api.HEALTH))

    async def report(self) -> api.ReportResponse:
        return cast(api.ReportResponse, await self._object("GET", api.REPORT))

    async def watch(self, since: int, timeout: float, watcher: str) -> int:
        """Long-poll ``GET /api/v1/watch`` (contract in :mod:`shoal.proto.control`) and
        return the master's datasets generation."""
        wait = min(max(0.0, timeout), api.WATCH_MAX_TIMEOUT)
        params = {"since": str(int(since)), "timeout": repr(wait), "watcher": watcher}
        # the poll is held open on purpose: longer than a session's default timeout
        data = await self.call("GET", api.WATCH, params=params, timeout=wait + 15, connect=5)
        gen = data.get("datasets_generation") if isinstance(data, dict) else None
        if not isinstance(gen, int):
            raise ProtocolError("master sent a watch answer without datasets_generation")
        return gen

    # -- datasets ---------------------------------------------------------------------

    async def datasets(self) -> list[api.DatasetBody]:
        data = await self._object("GET", api.DATASETS)
        if not isinstance(data.get("datasets"), list):
            raise ProtocolError("master sent a dataset list without datasets")
        return cast(list[api.DatasetBody], data["datasets"])

    async def dataset(self, name: str) -> api.DatasetBody:
        return cast(api.DatasetBody, await self._object("GET", api.dataset_path(name)))

    async def create_dataset(self, body: Mapping[str, Any]) -> api.DatasetBody:
        return cast(api.DatasetBody, await self._object("POST", api.DATASETS, dict(body)))

    async def update_dataset(self, name: str, policy: Mapping[str, Any]) -> api.DatasetBody:
        req: api.PatchDatasetRequest = {"policy": dict(policy)}
        return cast(api.DatasetBody, await self._object("PATCH", api.dataset_path(name), req))

    async def delete_dataset(self, name: str) -> api.DeleteDatasetResponse:
        path = api.dataset_path(name)
        return cast(api.DeleteDatasetResponse, await self._object("DELETE", path))

    async def manifest(self, name: str) -> tuple[str, Manifest] | None:
        """The dataset's manifest and its id; None when it has none (404)."""
        try:
            a = await self.send("GET", api.manifest_path(name))
        except NotFound:  # DatasetNotFound is a UserError: a dataset gone still raises
            return None
        mid = a.headers.get(api.MANIFEST_HEADER, "")
        if len(a.raw) < MANIFEST_INLINE_MAX:
            return mid, Manifest.from_bytes(a.raw)
        # a large one off the loop: decoding 150k files held a worker's loop (its reads
        # and its heartbeats) for a third of a second; in a thread the loop keeps
        # answering between the GIL's switches
        return mid, await asyncio.to_thread(Manifest.from_bytes, a.raw)

    # -- workers and the ring ---------------------------------------------------------

    async def ring(self) -> api.RingResponse:
        data = await self._object("GET", api.RING)
        if not isinstance(data.get("workers"), list) or "epoch" not in data:
            raise ProtocolError("master sent a ring answer without epoch and workers")
        return cast(api.RingResponse, data)

    async def register(self, body: Mapping[str, Any]) -> api.RegisterResponse:
        """Register a worker (a :class:`~shoal.proto.control.RegisterRequest`, plus
        whatever else the worker tells about itself)."""
        data = await self._object("POST", api.WORKER_REGISTER, dict(body))
        return cast(api.RegisterResponse, data)

    async def drain_worker(self, worker_id: str, key: str | None = None) -> dict[str, Any]:
        """Take a worker out of the ring; it hands its files over, then leaves. A
        worker draining itself sends its identity ``key`` (never logged)."""
        body = {"key": key} if key is not None else None
        out: dict[str, Any] = await self._object("POST", api.drain_path(worker_id), body)
        return out

    async def heartbeat(self, worker_id: str, stats: Mapping[str, Any]) -> api.HeartbeatResponse:
        req = {"stats": dict(stats)}
        data = await self._object("POST", api.heartbeat_path(worker_id), req)
        return cast(api.HeartbeatResponse, data)

    # -- admin ------------------------------------------------------------------------

    async def mint_token(
        self, name: str, role: str, datasets: list[str] | None, ttl: float | None
    ) -> str:
        body = {"name": name, "role": role, "datasets": datasets, "ttl": ttl}
        data = await self._object("POST", api.TOKENS, body)
        if not isinstance(data.get("token"), str):
            raise ProtocolError("master answered a token request without a token")
        return str(data["token"])

    async def backup(self, out: BinaryIO) -> int:
        """Stream the master's online backup (a tar, see shoal.master.backup) into
        ``out``; returns the bytes written. A backup may be large: no total timeout."""
        import aiohttp

        url = self.master
        hold = aiohttp.ClientTimeout(total=None, connect=10, sock_read=300)
        try:
            async with self._session().get(url + api.BACKUP, timeout=hold, headers=self._auth) as r:
                if r.status >= 400:
                    api.raise_for_error(r.status, _decoded(await r.read()))
                want = r.content_length
                n = 0
                async for chunk in r.content.iter_chunked(1 << 20):
                    out.write(chunk)
                    n += len(chunk)
        except aiohttp.ClientConnectorError as exc:
            why = exc.os_error.strerror or str(exc.os_error)
            raise Unavailable(f"master at {self._shown(url)} unreachable ({why})") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unavailable(f"backup from {self._shown(url)} failed: {exc!r}") from None
        if want is not None and n != want:
            raise Unavailable(f"backup from {self._shown(url)} ended after {n} of {want} bytes")
        return n

    # -- jobs -------------------------------------------------------------------------

    async def submit_job(self, spec: Mapping[str, Any], schedule: str | None) -> dict[str, Any]:
        body = {"spec": dict(spec), "schedule": schedule}
        return cast(dict[str, Any], await self._object("POST", api.JOBS, body))

    async def jobs(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._object("GET", api.JOBS))

    async def job(self, job_id: str, wait: float = 0.0) -> dict[str, Any]:
        """A job's view; with ``wait``, once it has ended (done, failed or stopped) or
        after ``wait`` seconds (30 at most), whichever comes first. A master from before
        the ``wait`` parameter answers at once: an unended view that comes back that
        early is returned after a short pause, so callers that loop on this poll such
        a master instead of spinning."""
        if wait <= 0:
            return cast(dict[str, Any], await self._object("GET", api.job_path(job_id)))
        wait = min(wait, 30.0)
        params = {"wait": repr(float(wait))}
        loop = asyncio.get_running_loop()
        asked = loop.time()
        data = await self._object(
            "GET", api.job_path(job_id), params=params, timeout=wait + 15, connect=5
        )
        if data.get("state") not in ENDED and loop.time() - asked < wait / 2:
            await asyncio.sleep(min(wait, OLD_MASTER_POLL))
        return cast(dict[str, Any], data)

    async def stop_job(self, job_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._object("POST", api.job_path(job_id, "stop")))

    async def resume_job(self, job_id: str) -> dict[str, Any]:
        path = api.job_path(job_id, "resume")
        return cast(dict[str, Any], await self._object("POST", path))

    async def claim(self, worker_id: str, wait: float, hold: float) -> dict[str, Any] | None:
        """Long-poll for a task (``wait`` seconds on the master, the request given up
        after ``hold``); None when none came."""
        params = {"wait": repr(float(wait))}
        data = await self._object("GET", api.claim_path(worker_id), params=params, timeout=hold)
        task = data.get("task")
        if task is not None and not isinstance(task, dict):
            raise ProtocolError("master sent a task that is not an object")
        return cast(dict[str, Any] | None, task)

    async def report_task(
        self, task_id: int, body: Mapping[str, Any], packed: bool = False
    ) -> dict[str, Any]:
        """Report on a task (msgpack with ``packed``: large listing results); the
        master's answer says whether to stop."""
        path = api.task_path(task_id)
        return cast(dict[str, Any], await self._object("POST", path, dict(body), packed=packed))

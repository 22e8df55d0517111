"""The few Kubernetes API calls the operator makes itself (Nodes, PVs, PVCs, the
custom resources it reads across kinds), over aiohttp with kopf's credentials.

Only create, get, list, JSON merge patch and delete: no PUT, no server-side apply, no
label selectors on the server (filtering is done here), so the same calls work on
every API server and on test emulators.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

from shoal.errors import NotFound, ShoalError, Unavailable

MERGE = "application/merge-patch+json"


class KubeError(ShoalError):
    """The Kubernetes API answered an error the operator does not handle."""


class Conflict(KubeError):
    """409: the object exists already."""


def _data(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        return raw  # already PEM


def ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    """An SSL context that trusts the cluster's CA and presents the client cert."""
    if not info.server.startswith("https"):
        return False
    if info.insecure:
        return False
    ctx = ssl.create_default_context()
    if info.ca_path:
        ctx.load_verify_locations(cafile=str(info.ca_path))
    elif info.ca_data:
        ctx.load_verify_locations(cadata=_data(info.ca_data).decode())
    cert, key = info.certificate_path, info.private_key_path
    with tempfile.TemporaryDirectory() as tmp:
        if info.certificate_data:
            cert = f"{tmp}/cert.pem"
            with open(cert, "wb") as f:
                f.write(_data(info.certificate_data))
        if info.private_key_data:
            key = f"{tmp}/key.pem"
            with open(key, "wb") as f:
                f.write(_data(info.private_key_data))
        if cert:
            ctx.load_cert_chain(str(cert), str(key) if key else None)
    return ctx


class Kube:
    """One aiohttp session against the API server that kopf logged in to."""

    def __init__(self) -> None:
        self._info: kopf.ConnectionInfo | None = None
        self._http: aiohttp.ClientSession | None = None

    def connect(self, info: kopf.ConnectionInfo) -> None:
        """Use these credentials from now on (kopf's login handler calls this)."""
        self._info = info
        if self._http is not None and not self._http.closed:
            # the old session closes itself when collected; a re-login is rare
            self._http = None

    def _session(self) -> tuple[aiohttp.ClientSession, str]:
        if self._info is None:
            raise Unavailable("not logged in to the Kubernetes API yet")
        if self._http is None or self._http.closed:
            headers = {}
            if self._info.token:
                headers["Authorization"] = f"{self._info.scheme or 'Bearer'} {self._info.token}"
            auth = None
            if self._info.username and self._info.password:
                auth = aiohttp.BasicAuth(self._info.username, self._info.password)
            self._http = aiohttp.ClientSession(
                headers=headers,
                auth=auth,
                connector=aiohttp.TCPConnector(ssl=ssl_context(self._info)),
                timeout=aiohttp.ClientTimeout(total=30, connect=5),
            )
        return self._http, self._info.server.rstrip("/")

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any]:
        http, server = self._session()
        headers = {"Content-Type": content_type} if body is not None else {}
        try:
            async with http.request(method, server + path, json=body, headers=headers) as r:
                text = await r.text()
                try:
                    data = json.loads(text) if text else {}
                except ValueError:  # e.g. a proxy's HTML error page
                    data = {}
                if r.status == 404:
                    raise NotFound(f"{method} {path}: not found")
                if r.status == 409:
                    raise Conflict(f"{method} {path}: already exists")
                if r.status >= 400:
                    msg = data.get("message") if isinstance(data, Mapping) else None
                    raise KubeError(f"{method} {path}: HTTP {r.status}: {msg or r.reason}")
                return data if isinstance(data, dict) else {}
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unavailable(f"Kubernetes API {method} {path}: {exc!r}") from None

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self._call("GET", path)
        except NotFound:
            return None

    async def items(self, path: str) -> list[dict[str, Any]]:
        return list((await self._call("GET", path)).get("items") or [])

    async def create(self, path: str, body: Mapping[str, Any]) -> bool:
        """Create the object; False when it exists already (idempotent)."""
        try:
            await self._call("POST", path, dict(body))
        except Conflict:
            return False
        return True

    async def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self._call("PATCH", path, dict(body), MERGE)

    async def delete(self, path: str) -> bool:
        """Delete the object; False when it was gone already."""
        try:
            await self._call("DELETE", path)
        except NotFound:
            return False
        return True

    # -- the objects the operator handles ----------------------------------------------

    async def node_labels(self) -> dict[str, dict[str, str]]:
        """Every Node's name -> its labels."""
        return {
            n["metadata"]["name"]: dict(n["metadata"].get("labels") or {})
            for n in await self.items("/api/v1/nodes")
        }

    async def label_node(self, node: str, key: str, value: str | None) -> None:
        """Set (or, with None, remove) one label of a Node by merge patch."""
        await self.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {key: value}}})

"""One WebHDFS request, parsed: the namespace path decoded once from the raw request
target (refusing '.', '..', NUL and control characters before any work), the
parameters with lower-cased names (Hadoop sends ``startafter``, fsspec ``startAfter``),
and who asks."""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, unquote_to_bytes, urlencode

from aiohttp import web

from shoal.core.types import split_path
from shoal.errors import InvalidArgument, NotFound
from shoal.gateway.webhdfs_auth import Who
from shoal.gateway.webhdfs_json import BadPath

__all__ = ["MARK", "PREFIX", "Req", "parse_target"]

PREFIX = "/webhdfs/v1"
#: query parameters and characters per value accepted
MAX_PARAMS, MAX_VALUE = 32, 4096
#: bytes of a decoded path accepted (HDFS's own limit is 8000)
MAX_PATH = 8000
#: the parameter that marks a request as the target of this gateway's own redirect
MARK = "namenoderpcaddress"


class Req:
    """One parsed request: the namespace path, lower-cased parameters, who asks."""

    __slots__ = ("http", "op", "params", "path", "who")

    def __init__(self, http: web.Request, path: str, params: dict[str, str], who: Who) -> None:
        self.http = http
        self.path = path
        self.params = params
        self.op = params.get("op", "").upper()
        self.who = who

    def int_param(self, name: str, default: int) -> int:
        raw = self.params.get(name)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise InvalidArgument(f'Invalid value for webhdfs parameter "{name}": {raw}') from None
        if value < 0 and not (name == "length" and value == -1):
            raise InvalidArgument(f'Invalid value for webhdfs parameter "{name}": {raw}')
        return value

    @property
    def dataset(self) -> str:
        return split_path(self.path).dataset

    @property
    def redirected(self) -> bool:
        return MARK in self.params

    def redirect_url(self) -> str:
        """This request as the "DataNode" URL a 307 names."""
        query = {k: v for k, v in self.params.items() if k != "offset"}
        query[MARK] = "shoal"
        query["offset"] = self.params.get("offset", "0")
        host = self.http.host
        return f"{self.http.scheme}://{host}{PREFIX}{quote(self.path)}?{urlencode(query)}"


def parse_target(raw: str) -> tuple[str, dict[str, str]]:
    """(namespace path, lower-cased parameters) of a raw request target."""
    target, _, query = raw.partition("?")
    if not target.startswith(PREFIX) or target[len(PREFIX) : len(PREFIX) + 1] not in ("", "/"):
        raise NotFound(f"not a WebHDFS path (use {PREFIX}/...)")
    try:
        path = unquote_to_bytes(target[len(PREFIX) :]).decode("utf-8")
        pairs = parse_qsl(query, keep_blank_values=True, max_num_fields=MAX_PARAMS, errors="strict")
    except (UnicodeError, ValueError):
        raise InvalidArgument("malformed request: bad encoding or too many parameters") from None
    if len(path.encode()) > MAX_PATH:
        raise BadPath(f"path longer than {MAX_PATH} bytes")
    if "\x00" in path or any(ord(c) < 0x20 for c in path):
        raise BadPath("path contains a control character")
    segments = [s for s in path.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise BadPath("path may not contain '.' or '..' segments")
    params: dict[str, str] = {}
    for k, v in pairs:
        if len(v) > MAX_VALUE:
            raise InvalidArgument(f'webhdfs parameter "{k[:64]}" is too long')
        params[k.lower()] = v
    return "/" + "/".join(segments), params

"""Path and URI helpers shared by the drivers: relative-path hygiene, joining a path
to a mount root, versions from backend metadata, and URIs with credentials removed."""

from __future__ import annotations

import datetime as _dt
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from shoal.errors import InvalidArgument

#: info keys that fsspec backends use for a modification time, in order of preference
_MTIME_KEYS = ("mtime", "LastModified", "last_modified", "modificationTime", "modified", "created")


def clean_rel(path: str) -> str:
    """'a//b/./c' -> 'a/b/c'; '' and '/' -> ''; '..' anywhere is refused."""
    if "\x00" in path:
        raise InvalidArgument("path may not contain NUL bytes")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidArgument(f"path {path!r} may not contain '..'")
    return "/".join(parts)


def join(root: str, rel: str) -> str:
    """The backend path of ``rel`` below ``root`` (root has no trailing slash)."""
    rel = clean_rel(rel)
    if not rel:
        return root
    return f"{root}/{rel}" if root not in ("", "/") else f"{root.rstrip('/')}/{rel}"


def relative(root: str, name: str) -> str:
    """Inverse of :func:`join` for names a backend returns."""
    name = name.rstrip("/")
    root = root.rstrip("/")
    if name == root:
        return ""
    if root and name.startswith(root + "/"):
        return name[len(root) + 1 :]
    if not root:
        return name.lstrip("/")
    return name.lstrip("/")  # pragma: no cover - a backend returned a foreign name


def redact_uri(uri: str) -> str:
    """The URI without userinfo (user:password@), query or fragment."""
    if "://" not in uri:
        return uri
    parts = urlsplit(uri)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def mtime_of(info: dict[str, Any]) -> float:
    """Seconds since the epoch from whichever key the backend used (0.0 if none)."""
    for key in _MTIME_KEYS:
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, _dt.datetime):
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value) / 1000.0 if key == "modificationTime" else float(value)
        if isinstance(value, str):
            try:
                return _dt.datetime.fromisoformat(value).timestamp()
            except ValueError:
                continue
    return 0.0


def version_of(info: dict[str, Any], size: int, mtime: float) -> str:
    """The ETag (quotes stripped) when the backend gives one, else '<size>-<mtime_ns>'."""
    etag = info.get("ETag") or info.get("etag") or info.get("e_tag")
    if isinstance(etag, str) and etag.strip('"'):
        tag = etag.strip()
        if tag.startswith("W/"):
            tag = tag[2:]
        return tag.strip('"')
    return f"{size}-{round(mtime * 1e9)}"

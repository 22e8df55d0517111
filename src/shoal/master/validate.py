"""Turn untrusted JSON request bodies into typed values, or raise InvalidArgument.

Every problem becomes one line naming the field at fault; nothing here lets a
``KeyError`` or ``TypeError`` escape as a 500. Unknown fields in what users send
(datasets, policies) are errors, so a typo is reported rather than silently ignored;
what workers send is read tolerantly, so a newer worker can talk to an older master.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any
from urllib.parse import urlsplit

from shoal.core.membership import TierDecl, WorkerInfo
from shoal.core.types import CachePolicy, Dataset, Mount
from shoal.errors import InvalidArgument

_POLICY_FIELDS = {f.name for f in fields(CachePolicy)}
_INT_FIELDS = {"replicas", "page_size", "readahead"}
_FLOAT_FIELDS = {"ttl", "staleness"}
#: fields whose string values go through CachePolicy.with_options ("64MiB", "5m", ...)
_PARSED_STR_FIELDS = _INT_FIELDS | _FLOAT_FIELDS | {"pin", "tiers"}


#: deepest nesting of arrays/objects accepted in a request body (ours nest 4 deep)
MAX_DEPTH = 64


def _no_constant(name: str) -> Any:
    raise InvalidArgument(f"malformed JSON body: {name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf
        raise InvalidArgument(f"malformed JSON body: {text} is out of range")
    return value


def _too_deep(raw: bytes) -> bool:
    """Nesting deeper than MAX_DEPTH, counted without parsing (brackets in strings
    count too: a false alarm only for bodies no shoal client sends)."""
    depth = 0
    for b in raw:
        if b in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif b in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


def parse_json(raw: bytes) -> Any:
    """Strict JSON: no NaN/Infinity, no out-of-range numbers, bounded nesting."""
    if len(raw) < (1 << 20) and _too_deep(raw):
        raise InvalidArgument(f"malformed JSON body: nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"malformed JSON body: {exc}") from None
    except RecursionError:
        raise InvalidArgument("malformed JSON body: nested too deeply") from None


def require_object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidArgument(f"{what} must be a JSON object")
    return body


def _check_keys(body: Mapping[str, Any], allowed: set[str], what: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidArgument(
            f"unknown field {unknown[0]!r} in {what}; known: {', '.join(sorted(allowed))}"
        )


def _str(body: Mapping[str, Any], key: str, what: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise InvalidArgument(f"{what}: {key!r} must be a string")
    return value


def _int(body: Mapping[str, Any], key: str, what: str) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what}: {key!r} must be an integer")
    return value


def _bool(body: Mapping[str, Any], key: str, what: str) -> bool:
    """An optional boolean (absent or null: False)."""
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what}: {key!r} must be true or false")
    return value


def apply_policy(base: CachePolicy, changes: Any) -> CachePolicy:
    """``base`` with the fields in ``changes`` replaced (a partial policy dict).

    Values are JSON-typed (``"replicas": 2``); sizes, durations, booleans and tier
    lists may also be given as strings in the CLI's syntax (``"page_size": "4MiB"``).
    """
    changes = require_object(changes, "policy")
    _check_keys(changes, _POLICY_FIELDS, "policy")
    merged = base.to_dict()
    as_text: dict[str, str] = {}
    for key, value in changes.items():
        if isinstance(value, str) and key in _PARSED_STR_FIELDS:
            as_text[key] = value
        elif key in _INT_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidArgument(f"invalid {key} {value!r}: must be an integer")
        elif key in _FLOAT_FIELDS and (
            isinstance(value, bool) or not isinstance(value, int | float)
        ):
            raise InvalidArgument(f"invalid {key} {value!r}: must be a number of seconds")
        elif key == "pin" and not isinstance(value, bool):
            raise InvalidArgument(f"invalid pin {value!r}: must be true or false")
        elif key == "tiers" and (
            not isinstance(value, list) or not all(isinstance(t, str) for t in value)
        ):
            raise InvalidArgument(f"invalid tiers {value!r}: a list such as ['mem', 'ssd']")
        elif key in ("placement", "eviction") and not isinstance(value, str):
            raise InvalidArgument(f"invalid {key} {value!r}: must be a string")
        else:
            merged[key] = value
    policy = CachePolicy.from_dict(merged)
    policy = policy.with_options(as_text) if as_text else policy
    for key in sorted(_FLOAT_FIELDS):
        # NaN and Infinity would be stored, then leave as JSON that strict parsers reject
        if not math.isfinite(getattr(policy, key)):
            raise InvalidArgument(f"invalid {key} {getattr(policy, key)!r}: must be finite")
    return policy


#: the master flag that allows file:// mounts under a directory
FILE_ROOT_FLAG = "--file-root"


def _local_path(uri: str) -> str | None:
    """The host path a URI reads (file://, fsspec's local:// or a bare path), else None."""
    if uri.startswith("/"):
        return uri
    head, sep, rest = uri.partition("://")
    if not sep or not {p.lower() for p in head.split("::")} & {"file", "local"}:
        return None
    return rest[len("localhost") :] if rest.startswith("localhost/") else rest


def _check_endpoint(mount: str, url: str | None) -> None:
    """An endpoint_url the S3 driver can use, refused here rather than by a worker."""
    if url is None:
        return
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # raises ValueError for a port out of range or not a number
    except ValueError:
        ok = False
    if not ok:
        raise InvalidArgument(
            f"mount {mount!r}: invalid endpoint_url {url[:100]!r}: expected http(s)://host[:port]"
        )


def check_uri(name: str, uri: str, file_roots: Sequence[str] | None) -> None:
    """Refuse URIs no driver should see; a file:// mount only under ``file_roots``.

    ``file_roots`` None skips the file:// rule (callers that are not the master's
    API); an empty sequence refuses every file:// mount. A file:// dataset reads host
    files as the workers' user, so only directories an administrator named are allowed.
    """
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in uri):
        raise InvalidArgument(f"mount {name!r}: the URI contains a control character (or NUL)")
    if len(uri) > 4096:
        raise InvalidArgument(f"mount {name!r}: the URI is longer than 4096 characters")
    path = _local_path(uri)
    if path is None or file_roots is None:
        return
    if not path.startswith("/"):
        raise InvalidArgument(f"mount {name!r}: a file:// URI needs an absolute path")
    if not file_roots:
        raise InvalidArgument(
            f"mount {name!r}: file:// mounts are not allowed by this master; start it "
            f"with {FILE_ROOT_FLAG} DIR (repeatable) to allow directories under DIR"
        )
    # resolved: '..' and symlinks may not lead out of an allowed root
    real = os.path.realpath(path)
    for root in file_roots:
        r = os.path.realpath(root)
        if real == r or real.startswith(r.rstrip("/") + "/"):
            return
    raise InvalidArgument(
        f"mount {name!r}: {real} is outside the master's file roots "
        f"({', '.join(file_roots)}); add one with {FILE_ROOT_FLAG} DIR"
    )


def parse_dataset(body: Any, file_roots: Sequence[str] | None = None) -> Dataset:
    """A ``POST /api/v1/datasets`` body -> a new Dataset (generation is the master's).

    ``file_roots``: see :func:`check_uri`.
    """
    body = require_object(body, "dataset")
    # "generation" and "manifest" are accepted (and ignored) so Dataset.to_dict() output
    # can be posted
    _check_keys(body, {"name", "mounts", "policy", "generation", "manifest"}, "dataset")
    name = _str(body, "name", "dataset")
    mounts_in = body.get("mounts")
    if not isinstance(mounts_in, list):
        raise InvalidArgument(f"dataset {name!r}: 'mounts' must be a list of {{name, uri}}")
    mounts: list[Mount] = []
    for m in mounts_in:
        m = require_object(m, "mount")
        _check_keys(m, {"name", "uri", "options"}, "mount")
        options = m.get("options") or {}
        if not isinstance(options, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in options.items()
        ):
            raise InvalidArgument("mount: 'options' must map strings to strings")
        mname, uri = _str(m, "name", "mount"), _str(m, "uri", "mount")
        check_uri(mname, uri, file_roots)
        _check_endpoint(mname, options.get("endpoint_url"))
        mounts.append(Mount(mname, uri, dict(options)))
    policy = apply_policy(CachePolicy(), body.get("policy") or {})
    return Dataset(name=name, mounts=tuple(mounts), policy=policy)


def parse_policy_patch(body: Any) -> dict[str, Any]:
    """A ``PATCH /api/v1/datasets/{name}`` body -> the partial policy dict."""
    body = require_object(body, "dataset update")
    _check_keys(body, {"policy"}, "dataset update")
    if "policy" not in body:
        raise InvalidArgument("dataset update: give the fields to change as {'policy': {...}}")
    return require_object(body["policy"], "policy")


def parse_register(body: Any) -> WorkerInfo:
    """A ``POST /api/v1/workers/register`` body -> WorkerInfo."""
    body = require_object(body, "worker registration")
    what = "worker registration"
    # unknown keys are ignored here: a newer worker may send more than this master reads
    tiers_in = body.get("tiers", [])
    if not isinstance(tiers_in, list):
        raise InvalidArgument(f"{what}: 'tiers' must be a list of {{name, path, capacity}}")
    tiers: list[TierDecl] = []
    for t in tiers_in:
        t = require_object(t, "tier")
        tiers.append(
            TierDecl(
                _str(t, "name", "tier"), _str(t, "path", "tier", ""), _int(t, "capacity", "tier")
            )
        )
    return WorkerInfo(
        id=_str(body, "id", what),
        host=_str(body, "host", what),
        port=_int(body, "port", what),
        uds=_str(body, "uds", what, "") if body.get("uds") is not None else "",
        node=_str(body, "node", what, "") if body.get("node") is not None else "",
        tiers=tuple(tiers),
        tls=_bool(body, "tls", what),
    )


def parse_heartbeat(body: Any) -> dict[str, Any] | None:
    """A heartbeat body -> the stats to store (None: keep the previous ones)."""
    if body is None:
        return None
    body = require_object(body, "heartbeat")
    stats = body.get("stats")
    if stats is None:
        return None
    return require_object(stats, "heartbeat stats")

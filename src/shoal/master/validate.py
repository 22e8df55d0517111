"""Turn untrusted JSON request bodies into typed values, or raise InvalidArgument.

Every problem becomes one line naming the field at fault; nothing here lets a
``KeyError`` or ``TypeError`` escape as a 500. Unknown fields in what users send
(datasets, policies) are errors, so a typo is reported rather than silently ignored;
what workers send is read tolerantly, so a newer worker can talk to an older master.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from shoal.core.membership import TierDecl, WorkerInfo
from shoal.core.types import CachePolicy, Dataset, Mount
from shoal.errors import InvalidArgument

_POLICY_FIELDS = {f.name for f in fields(CachePolicy)}
_INT_FIELDS = {"replicas", "page_size", "readahead"}
_FLOAT_FIELDS = {"ttl", "staleness"}
#: fields whose string values go through CachePolicy.with_options ("64MiB", "5m", ...)
_PARSED_STR_FIELDS = _INT_FIELDS | _FLOAT_FIELDS | {"pin", "tiers"}


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
    return policy.with_options(as_text) if as_text else policy


def parse_dataset(body: Any) -> Dataset:
    """A ``POST /api/v1/datasets`` body -> a new Dataset (generation is the master's)."""
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
        mounts.append(Mount(_str(m, "name", "mount"), _str(m, "uri", "mount"), dict(options)))
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

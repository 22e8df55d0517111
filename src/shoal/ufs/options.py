"""Mount-option parsing for drivers: unknown keys and bad values are InvalidArgument,
and the value of a credential-like key is never echoed back."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from shoal.core.types import SECRET_OPTION_KEYS
from shoal.errors import InvalidArgument
from shoal.ufs.errors import RetryPolicy

_SECRETISH = ("secret", "password", "token", "key", "credential")


def is_secretish(key: str) -> bool:
    k = key.lower()
    return k in SECRET_OPTION_KEYS or any(word in k for word in _SECRETISH)


def _shown(key: str, value: object) -> str:
    return "<hidden>" if is_secretish(key) else repr(value)


def check_known(scheme: str, options: Mapping[str, object], known: Iterable[str]) -> None:
    """Raise InvalidArgument naming the first option ``scheme`` does not understand."""
    allowed = sorted(set(known))
    for key in sorted(options):
        if key not in allowed:
            hint = ", ".join(allowed) if allowed else "none"
            raise InvalidArgument(f"unknown {scheme} mount option {key!r}; known: {hint}")


def opt_bool(options: Mapping[str, object], key: str, default: bool) -> bool:
    value = options.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise InvalidArgument(f"invalid value for {key}: {_shown(key, value)} (expected true or false)")


def opt_float(options: Mapping[str, object], key: str, default: float) -> float:
    value = options.get(key)
    if value is None:
        return default
    try:
        out = float(str(value))
    except ValueError:
        raise InvalidArgument(
            f"invalid value for {key}: {_shown(key, value)} (expected a number)"
        ) from None
    if out <= 0:
        raise InvalidArgument(f"invalid value for {key}: must be > 0")
    return out


def opt_choice(options: Mapping[str, object], key: str, choices: tuple[str, ...]) -> str | None:
    value = options.get(key)
    if value is None:
        return None
    text = str(value).strip().lower()
    if text not in choices:
        raise InvalidArgument(
            f"invalid value for {key}: {_shown(key, value)} (expected {' or '.join(choices)})"
        )
    return text


def coerce_like(key: str, value: object, default: object) -> object:
    """Convert a string option to the type of a constructor parameter's default."""
    if not isinstance(value, str):
        return value
    if isinstance(default, bool):
        return opt_bool({key: value}, key, default)
    if isinstance(default, int):
        try:
            return int(value)
        except ValueError:
            raise InvalidArgument(f"invalid value for {key}: {_shown(key, value)}") from None
    if isinstance(default, float):
        return opt_float({key: value}, key, default)
    return value


#: mount options of the drivers that bound their requests to the store, in seconds
#: (see :class:`shoal.ufs.errors.RetryPolicy`): ``connect_timeout``, ``read_timeout``
#: (how long the store may stay silent), ``deadline`` (one operation, all attempts),
#: ``hold`` (how long requests fail at once after the store went silent)
DEADLINE_OPTIONS = ("connect_timeout", "read_timeout", "deadline", "hold")


def opt_deadlines(options: Mapping[str, object], base: RetryPolicy) -> RetryPolicy:
    """``base`` with the DEADLINE_OPTIONS that ``options`` sets (each a number > 0)."""
    changes: dict[str, Any] = {}
    for key in DEADLINE_OPTIONS:
        if options.get(key) is None:
            continue
        value = opt_float(options, key, getattr(base, key))
        if not math.isfinite(value) or value > 86400:
            raise InvalidArgument(f"invalid value for {key}: must be at most 86400 seconds")
        changes[key] = value
    return dataclasses.replace(base, **changes) if changes else base

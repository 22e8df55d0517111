"""Backend errors, translated once into :mod:`shoal.errors`, and the one retry policy.

Every driver runs each backend call through :func:`call_with_retry`: the call's
exception is classified here (botocore, aiohttp, requests, fsspec and plain OSError
shapes), retryable failures are retried with bounded jittered exponential backoff,
and the caller only ever sees the shoal exception tree.

Only *backend* exception types are translated (OSError and its kin, the HTTP
libraries' errors, timeouts, and types a driver declares). Anything else -- a
TypeError, a KeyError -- is a bug and propagates unchanged, so nothing hides it.

Messages carry the store's redacted URI and path and never a credential: callers
pass the secret values they know in ``scrub`` and those are blanked out of whatever
text a backend put in its exception.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from shoal.errors import (
    CredentialsError,
    FatalStoreError,
    NotFound,
    PermissionDenied,
    RetryableStoreError,
    ShoalError,
    StaleVersion,
)

# botocore's and requests' exceptions are looked up only in modules already imported:
# an exception of theirs can exist only once someone imported them, and importing them
# here would cost every client process ~0.1-0.2 s before its first byte.
_BOTO_EXC = "botocore.exceptions"
_REQUESTS = "requests"

log = logging.getLogger("shoal.ufs.errors")

T = TypeVar("T")

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchVersion", "404"})
_DENIED_CODES = frozenset({"AccessDenied", "AllAccessDisabled", "AccountProblem", "403"})
_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "ExpiredTokenException",
        "InvalidClientTokenId",
    }
)
_RETRY_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestLimitExceeded",
        "InternalError",
        "ServiceUnavailable",
        "RequestThrottled",
        "TooManyRequests",
        "BandwidthLimitExceeded",
        "RequestTimeoutException",
    }
)
_STALE_CODES = frozenset({"PreconditionFailed", "412"})
_RETRY_ERRNOS = frozenset(
    {
        _errno.ETIMEDOUT,
        _errno.ECONNRESET,
        _errno.ECONNREFUSED,
        _errno.ECONNABORTED,
        _errno.EHOSTUNREACH,
        _errno.ENETUNREACH,
        _errno.ENETDOWN,
        _errno.EAGAIN,
        _errno.EBUSY,
        _errno.EPIPE,
        getattr(_errno, "EREMOTEIO", _errno.EIO),
    }
    - {_errno.EIO}
)


_BASE_TYPES: tuple[type[BaseException], ...] = (OSError, aiohttp.ClientError, asyncio.TimeoutError)


def backend_errors() -> tuple[type[BaseException], ...]:
    """Exception types that are translated; everything else is a bug and propagates."""
    _bce: Any = sys.modules.get(_BOTO_EXC)
    if _bce is None:
        return _BASE_TYPES
    return (*_BASE_TYPES, _bce.BotoCoreError, _bce.ClientError)


def _by_status(status: int) -> type[ShoalError] | None:
    if status == 404:
        return NotFound
    if status in (401, 403):
        return PermissionDenied
    if status == 412:
        return StaleVersion
    if status in (408, 429) or status >= 500:
        return RetryableStoreError
    return None


def _classify_one(exc: BaseException) -> tuple[type[ShoalError], str] | None:
    """(class, short reason) for exceptions that carry enough to decide, else None."""
    _bce: Any = sys.modules.get(_BOTO_EXC)
    if _bce is not None:
        if isinstance(exc, _bce.ClientError):
            err = exc.response.get("Error", {}) or {}
            code = str(err.get("Code", ""))
            status = int((exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
            reason = f"{code or 'error'} (HTTP {status})" if status else code or "error"
            if code in _STALE_CODES:
                return StaleVersion, reason
            if code in _NOT_FOUND_CODES:
                return NotFound, reason
            if code in _CREDENTIAL_CODES:
                return CredentialsError, reason
            if code in _DENIED_CODES:
                return PermissionDenied, reason
            if code in _RETRY_CODES:
                return RetryableStoreError, reason
            return _by_status(status) or FatalStoreError, reason
        if isinstance(
            exc,
            _bce.NoCredentialsError
            | _bce.PartialCredentialsError
            | _bce.CredentialRetrievalError
            | _bce.ProfileNotFound,
        ):
            return CredentialsError, type(exc).__name__
        if isinstance(
            exc, _bce.HTTPClientError | _bce.ConnectionError | _bce.ResponseStreamingError
        ):
            # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ...
            return RetryableStoreError, type(exc).__name__
        if isinstance(exc, _bce.BotoCoreError):
            if type(exc).__name__ == "ResponseParserError":  # throttling sends bad XML
                return RetryableStoreError, type(exc).__name__
            return FatalStoreError, type(exc).__name__
    _requests: Any = sys.modules.get(_REQUESTS)
    if _requests is not None and isinstance(exc, _requests.RequestException):
        resp = exc.response
        if resp is not None:
            return _by_status(resp.status_code) or FatalStoreError, f"HTTP {resp.status_code}"
        if isinstance(
            exc,
            _requests.ConnectionError
            | _requests.Timeout
            | _requests.exceptions.ChunkedEncodingError,
        ):
            return RetryableStoreError, type(exc).__name__
        return FatalStoreError, type(exc).__name__
    if isinstance(exc, aiohttp.ClientResponseError):
        return _by_status(exc.status) or FatalStoreError, f"HTTP {exc.status}"
    if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError):
        return RetryableStoreError, type(exc).__name__
    return None


def classify(exc: BaseException) -> tuple[type[ShoalError], str]:
    """The shoal class for a backend exception, and a short reason for messages.

    Wrapped errors (s3fs re-raises ClientError as OSError with ``__cause__``) are
    classified by the most specific exception in the cause chain.
    """
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 8:
        found = _classify_one(cur)
        if found is not None:
            return found
        cur = cur.__cause__
        seen += 1
    if isinstance(exc, FileNotFoundError) or getattr(exc, "errno", None) == _errno.ENOENT:
        return NotFound, "not found"
    if isinstance(exc, PermissionError):
        return PermissionDenied, "permission denied"
    if isinstance(exc, TimeoutError | ConnectionError):
        return RetryableStoreError, type(exc).__name__
    code = getattr(exc, "errno", None)
    if isinstance(code, int) and code in _RETRY_ERRNOS:
        return RetryableStoreError, _errno.errorcode.get(code, str(code))
    if isinstance(exc, OSError) and exc.strerror:
        return FatalStoreError, exc.strerror
    return FatalStoreError, type(exc).__name__


def scrub_text(text: str, secrets: Sequence[str]) -> str:
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "***")
    return text


def translate(exc: BaseException, where: str, scrub: Sequence[str] = ()) -> ShoalError:
    """A shoal error for ``exc``, its message ``<where>: <reason>`` free of ``scrub``."""
    if isinstance(exc, ShoalError):
        return exc
    cls, reason = classify(exc)
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    detail = text.strip().splitlines()[0] if text.strip() else ""
    if detail and detail not in reason and len(detail) < 300:
        reason = f"{reason}: {detail}"
    out = cls(scrub_text(f"{where}: {reason}", scrub))
    code = getattr(exc, "errno", None)
    if cls is FatalStoreError and isinstance(code, int) and code > 0:
        out.errno = code  # keep EISDIR, ENOTDIR, ENAMETOOLONG ... for FUSE
    return out


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded jittered exponential backoff for retryable under-storage errors."""

    #: total tries including the first
    attempts: int = 4
    #: scale of the first wait, seconds (full jitter: a wait is uniform in [0, cap])
    initial: float = 0.05
    #: longest single wait, seconds
    maximum: float = 1.0
    #: injectable for tests: how to wait
    sleep: Callable[[float], Awaitable[None]] = field(default=_sleep, compare=False)


DEFAULT_RETRY = RetryPolicy()


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.info("retrying after attempt %d: %s", state.attempt_number, exc)


async def call_with_retry(
    op: Callable[[], Awaitable[T]],
    where: str,
    *,
    policy: RetryPolicy = DEFAULT_RETRY,
    scrub: Sequence[str] = (),
    extra: tuple[type[BaseException], ...] = (),
) -> T:
    """Run ``op`` (a fresh awaitable per attempt), translating backend errors and
    retrying RetryableStoreError only. ``extra`` adds driver-specific backend types."""
    catch = backend_errors() + extra

    async def attempt() -> T:
        try:
            return await op()
        except ShoalError:
            raise
        except catch as exc:
            raise translate(exc, where, scrub) from exc

    retrying = AsyncRetrying(
        stop=stop_after_attempt(max(1, policy.attempts)),
        wait=wait_random_exponential(multiplier=policy.initial, max=policy.maximum),
        retry=retry_if_exception_type(RetryableStoreError),
        sleep=policy.sleep,
        before_sleep=_log_retry,
        reraise=True,
    )
    result: Any = await retrying(attempt)
    return result

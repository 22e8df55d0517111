"""Backend errors classified and translated once into :mod:`shoal.errors`.

The classification half of :mod:`shoal.ufs.errors` (which re-exports these names, and
owns the retry policy): botocore, aiohttp, requests, fsspec and plain OSError shapes
become the most specific shoal error (not found, permission, credentials, stale
version, retryable, fatal), with the message redacted of any secret a caller names.
Only *backend* exception types are translated; anything else is a bug and propagates.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import sys
from collections.abc import Sequence
from typing import Any

import aiohttp

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


def classify_code(code: str, status: int) -> type[ShoalError]:
    """The class for an S3 error answer: its ``<Code>`` first, then its HTTP status
    (what a botocore ClientError is classified by; the lean paths use it directly)."""
    if code in _STALE_CODES:
        return StaleVersion
    if code in _NOT_FOUND_CODES:
        return NotFound
    if code in _CREDENTIAL_CODES:
        return CredentialsError
    if code in _DENIED_CODES:
        return PermissionDenied
    if code in _RETRY_CODES:
        return RetryableStoreError
    return _by_status(status) or FatalStoreError


def _classify_one(exc: BaseException) -> tuple[type[ShoalError], str] | None:
    """(class, short reason) for exceptions that carry enough to decide, else None."""
    _bce: Any = sys.modules.get(_BOTO_EXC)
    if _bce is not None:
        if isinstance(exc, _bce.ClientError):
            err = exc.response.get("Error", {}) or {}
            code = str(err.get("Code", ""))
            status = int((exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
            reason = f"{code or 'error'} (HTTP {status})" if status else code or "error"
            return classify_code(code, status), reason
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


def silence_of(exc: BaseException) -> str | None:
    """``"connect"`` or ``"read"`` when ``exc`` (or an exception in its cause chain) says the
    store did not answer in time, else None (it answered: with an error, a reset, ...)."""
    _bce: Any = sys.modules.get(_BOTO_EXC)
    _requests: Any = sys.modules.get(_REQUESTS)
    cur: BaseException | None = exc
    seen = 0
    while cur is not None and seen < 8:
        if isinstance(cur, aiohttp.ConnectionTimeoutError):
            return "connect"
        if _bce is not None and isinstance(cur, _bce.ConnectTimeoutError):
            return "connect"
        if _requests is not None and isinstance(cur, _requests.exceptions.ConnectTimeout):
            return "connect"
        if isinstance(cur, TimeoutError):  # asyncio's, aiohttp's and aiobotocore's too
            return "read"
        if _bce is not None and isinstance(cur, _bce.ReadTimeoutError):
            return "read"
        if _requests is not None and isinstance(cur, _requests.Timeout):
            return "read"
        if getattr(cur, "errno", None) == _errno.ETIMEDOUT:
            return "read"
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
        seen += 1
    return None


def retryable_silence(out: ShoalError, exc: BaseException) -> str | None:
    """:func:`silence_of` the cause when ``out`` is a retryable failure, else None."""
    # only a retryable failure can be silence: an answer (NotFound, ...) raised while
    # handling a timeout inside a library is an answer
    return silence_of(exc) if isinstance(out, RetryableStoreError) else None

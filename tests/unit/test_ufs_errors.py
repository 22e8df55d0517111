"""Classification of backend errors into shoal.errors, and the retry policy."""

from __future__ import annotations

import errno

import aiohttp
import pytest
import requests
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
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
from shoal.ufs.errors import RetryPolicy, call_with_retry, classify, translate


def client_error(code: str, status: int, message: str = "msg") -> ClientError:
    response = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, "GetObject")


def wrapped(cause: BaseException) -> OSError:
    """The shape s3fs raises: an OSError whose __cause__ is the ClientError."""
    exc = OSError(errno.EIO, "translated by s3fs")
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (client_error("NoSuchKey", 404), NotFound),
        (client_error("404", 404), NotFound),
        (client_error("NoSuchBucket", 404), NotFound),
        (client_error("AccessDenied", 403), PermissionDenied),
        (client_error("Forbidden", 403), PermissionDenied),
        (client_error("InvalidAccessKeyId", 403), CredentialsError),
        (client_error("SignatureDoesNotMatch", 403), CredentialsError),
        (client_error("PreconditionFailed", 412), StaleVersion),
        (client_error("SlowDown", 503), RetryableStoreError),
        (client_error("ServiceUnavailable", 503), RetryableStoreError),
        (client_error("TooManyRequests", 429), RetryableStoreError),
        (client_error("InternalError", 500), RetryableStoreError),
        (client_error("WeirdGatewayThing", 502), RetryableStoreError),
        (client_error("InvalidArgument", 400), FatalStoreError),
        (wrapped(client_error("NoSuchKey", 404)), NotFound),
        (wrapped(client_error("SlowDown", 503)), RetryableStoreError),
        (wrapped(client_error("PreconditionFailed", 412)), StaleVersion),
        (NoCredentialsError(), CredentialsError),
        (EndpointConnectionError(endpoint_url="http://x"), RetryableStoreError),
        (ReadTimeoutError(endpoint_url="http://x"), RetryableStoreError),
        (ParamValidationError(report="bad"), FatalStoreError),
        (FileNotFoundError(errno.ENOENT, "gone"), NotFound),
        (PermissionError(errno.EACCES, "no"), PermissionDenied),
        (TimeoutError(), RetryableStoreError),
        (TimeoutError(), RetryableStoreError),
        (ConnectionResetError(errno.ECONNRESET, "reset"), RetryableStoreError),
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), RetryableStoreError),
        (OSError(errno.ETIMEDOUT, "timed out"), RetryableStoreError),
        (OSError(errno.EISDIR, "is a directory"), FatalStoreError),
        (aiohttp.ServerDisconnectedError(), RetryableStoreError),
        (aiohttp.ClientPayloadError("truncated"), RetryableStoreError),
        (requests.ConnectionError("refused"), RetryableStoreError),
        (requests.Timeout("slow"), RetryableStoreError),
    ],
)
def test_classification(exc: BaseException, expected: type[ShoalError]) -> None:
    assert classify(exc)[0] is expected


def test_http_status_errors_from_requests_and_aiohttp() -> None:
    for status, expected in [
        (404, NotFound),
        (403, PermissionDenied),
        (503, RetryableStoreError),
        (429, RetryableStoreError),
        (400, FatalStoreError),
    ]:
        resp = requests.Response()
        resp.status_code = status
        assert classify(requests.HTTPError(response=resp))[0] is expected
        info = aiohttp.RequestInfo(url=None, method="GET", headers=None)  # type: ignore[arg-type]
        err = aiohttp.ClientResponseError(info, (), status=status)
        assert classify(err)[0] is expected


def test_translate_keeps_errno_and_location_and_scrubs_secrets() -> None:
    out = translate(OSError(errno.EISDIR, "Is a directory"), "file:///data/x")
    assert isinstance(out, FatalStoreError)
    assert out.errno == errno.EISDIR
    assert str(out).startswith("file:///data/x: ")
    leaky = client_error("AccessDenied", 403, "denied for key AKIASECRETKEY123 sig s3cr3t-value")
    out2 = translate(leaky, "s3://b/k", scrub=["AKIASECRETKEY123", "s3cr3t-value"])
    assert isinstance(out2, PermissionDenied)
    assert "AKIASECRETKEY123" not in str(out2) and "s3cr3t-value" not in str(out2)
    assert isinstance(translate(NotFound("already"), "x"), NotFound)


class Flaky:
    """A backend call that fails ``fails`` times with ``exc``, then returns 'ok'."""

    def __init__(self, exc: BaseException, fails: int) -> None:
        self.exc, self.fails, self.calls = exc, fails, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.fails:
            raise self.exc
        return "ok"


def fast_policy(waits: list[float], attempts: int = 4) -> RetryPolicy:
    async def record(seconds: float) -> None:
        waits.append(seconds)

    return RetryPolicy(attempts=attempts, initial=0.001, maximum=0.004, sleep=record)


async def test_retryable_errors_are_retried_until_success() -> None:
    waits: list[float] = []
    op = Flaky(client_error("SlowDown", 503), fails=3)
    assert await call_with_retry(op, "s3://b/k", policy=fast_policy(waits)) == "ok"
    assert op.calls == 4
    assert len(waits) == 3 and all(0 <= w <= 0.004 for w in waits)


async def test_retries_are_bounded() -> None:
    waits: list[float] = []
    op = Flaky(ConnectionResetError(errno.ECONNRESET, "reset"), fails=100)
    with pytest.raises(RetryableStoreError):
        await call_with_retry(op, "s3://b/k", policy=fast_policy(waits, attempts=3))
    assert op.calls == 3 and len(waits) == 2


@pytest.mark.parametrize(
    "exc",
    [
        client_error("NoSuchKey", 404),
        client_error("AccessDenied", 403),
        client_error("PreconditionFailed", 412),
        NoCredentialsError(),
        OSError(errno.EISDIR, "is a directory"),
    ],
)
async def test_non_retryable_errors_are_tried_once(exc: BaseException) -> None:
    waits: list[float] = []
    op = Flaky(exc, fails=100)
    with pytest.raises(ShoalError):
        await call_with_retry(op, "s3://b/k", policy=fast_policy(waits))
    assert op.calls == 1 and waits == []


async def test_bugs_are_not_translated_or_retried() -> None:
    waits: list[float] = []
    op = Flaky(TypeError("a bug"), fails=100)
    with pytest.raises(TypeError):
        await call_with_retry(op, "s3://b/k", policy=fast_policy(waits))
    assert op.calls == 1


async def test_driver_declared_backend_errors_are_translated() -> None:
    op = Flaky(RuntimeError("RemoteException: boom"), fails=1)
    with pytest.raises(FatalStoreError):
        await call_with_retry(op, "webhdfs://h/p", policy=fast_policy([]), extra=(RuntimeError,))

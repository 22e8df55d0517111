"""Backend errors, translated once into :mod:`shoal.errors`, and the one retry policy.

Every driver runs each backend call through :func:`call_with_retry`: the call's
exception is classified (botocore, aiohttp, requests, fsspec and plain OSError shapes;
:mod:`shoal.ufs.classify`, whose names this module re-exports), retryable failures are
retried with bounded jittered exponential backoff, and the caller only ever sees the
shoal exception tree.

Only *backend* exception types are translated (OSError and its kin, the HTTP
libraries' errors, timeouts, and types a driver declares). Anything else -- a
TypeError, a KeyError -- is a bug and propagates unchanged, so nothing hides it.

Messages carry the store's redacted URI and path and never a credential: callers
pass the secret values they know in ``scrub`` and those are blanked out of whatever
text a backend put in its exception.

Deadlines: a store that does not answer must not hold a read for long, and the error
must say so. Each attempt gets a connect timeout and a read timeout (how long the
store may stay silent: before the first byte of its answer, and between chunks; a
transfer that keeps making progress is never cut), and one operation gets a
``deadline`` over all its attempts: no attempt starts after it, and each attempt's
timeouts are cut to what is left of it (drivers read them from
:func:`attempt_timeouts`). A store that never answers therefore fails within the
deadline with :class:`~shoal.errors.StoreTimeout`, whose message names the store (its
URI and endpoint) and the cause, well before a client gives up on the worker that
asked (the client's request timeout is 30 s by default, the deadline 8 s).

A :class:`StoreHealth` shared by a store's operations remembers that the store went
silent: when an operation spent its deadline without an answer and nothing else on
that store was answered meanwhile, further operations fail at once for ``hold``
seconds, then one at a time probes the store with a single attempt while the others
keep failing at once; the first answer (of any kind) ends it. A dead store then costs
a worker one request slot, not every slot for a deadline each.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from shoal.errors import (
    RetryableStoreError,
    ShoalError,
    StoreTimeout,
)
from shoal.ufs.classify import (
    backend_errors,
    classify,
    retryable_silence,
    scrub_text,
    silence_of,
    translate,
)

__all__ = [
    "DEFAULT_RETRY",
    "RETRIES",
    "RetryPolicy",
    "StoreHealth",
    "attempt_timeouts",
    "backend_errors",
    "call_with_retry",
    "classify",
    "scrub_text",
    "silence_of",
    "translate",
]

log = logging.getLogger("shoal.ufs.errors")

T = TypeVar("T")


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded jittered exponential backoff for retryable under-storage errors, and the
    deadlines of one store operation (mount options ``connect_timeout``,
    ``read_timeout``, ``deadline``, ``hold`` on the drivers that take them)."""

    #: total tries including the first
    attempts: int = 4
    #: scale of the first wait, seconds (full jitter: a wait is uniform in [0, cap])
    initial: float = 0.05
    #: longest single wait, seconds
    maximum: float = 1.0
    #: seconds to open a connection to the store, per attempt
    connect_timeout: float = 3.0
    #: seconds the store may stay silent on an open request, per attempt: before the
    #: first byte of its answer and between chunks (a transfer that keeps making
    #: progress is never cut). A healthy store's first byte takes milliseconds; a
    #: silent one is retried once within the deadline.
    read_timeout: float = 4.0
    #: seconds one operation may spend on all its attempts and the waits between them
    #: while the store does not answer: no attempt starts after it and each attempt's
    #: timeouts are cut to what is left, so a dead store fails within it. Keep it well
    #: below the clients' request timeout (30 s, FUSE 10 s), or they give up on the
    #: worker first and blame it.
    deadline: float = 8.0
    #: seconds operations fail at once after the store was found silent, before one
    #: probes it again (see StoreHealth)
    hold: float = 5.0
    #: injectable for tests: how to wait
    sleep: Callable[[float], Awaitable[None]] = field(default=_sleep, compare=False)
    #: injectable for tests: monotonic seconds
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "read_timeout", "deadline"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"RetryPolicy.{name} must be a positive number, got {value!r}")
        if not (math.isfinite(self.hold) and self.hold >= 0):
            raise ValueError(f"RetryPolicy.hold must be >= 0, got {self.hold!r}")


DEFAULT_RETRY = RetryPolicy()

#: (connect, read) timeouts of the attempt in progress in this task, see attempt_timeouts
_ATTEMPT: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "shoal_ufs_attempt", default=None
)


def attempt_timeouts(policy: RetryPolicy) -> tuple[float, float]:
    """(connect, read) seconds for the attempt in progress: the policy's, cut to what is
    left of its operation's deadline. Drivers that can set timeouts per request use
    these; outside call_with_retry they are the policy's."""
    got = _ATTEMPT.get()
    return got if got is not None else (policy.connect_timeout, policy.read_timeout)


def _secs(x: float) -> str:
    return f"{x:.0f} s" if x >= 10 or x == int(x) else f"{x:.1f} s"


class StoreHealth:
    """Whether one store answers, shared by every operation on it (one per store
    instance, used from one event loop at a time).

    A store is *down* once an operation spent its deadline on attempts the store did
    not answer and no other operation on it got an answer since that operation began
    (a single object that hangs is that object's trouble, not the store's). While
    down, operations fail at once with StoreTimeout for ``policy.hold`` seconds; after
    that one operation at a time is let through as a probe with a single attempt, the
    others still fail at once. Any answer -- bytes, or an error the store sent --
    ends it.
    """

    def __init__(self, name: str, policy: RetryPolicy = DEFAULT_RETRY) -> None:
        #: the store as messages name it, e.g. "s3://bucket at http://host:port"
        self.name = name
        self.policy = policy
        self._down: str | None = None  # what found it silent, for the fail-fast message
        self._down_at = 0.0
        self._answered_at = -math.inf
        self._probing = False

    @property
    def down(self) -> bool:
        return self._down is not None

    def admit(self, where: str) -> bool:
        """Before an operation: False to go ahead as usual, True when this operation is
        the probe of a down store (one attempt; call :meth:`probed` after it). Raises
        StoreTimeout when the operation must fail at once."""
        if self._down is None:
            return False
        ago = self.policy.clock() - self._down_at
        left = self.policy.hold - ago
        found = f"{where}: not sent, failing at once: {self._down} {_secs(ago)} ago"
        if left > 0:
            raise StoreTimeout(f"{found}; tried again in {_secs(left)}")
        if self._probing:
            raise StoreTimeout(f"{found}; it is being probed")
        self._probing = True
        return True

    def probed(self) -> None:
        self._probing = False

    def answered(self) -> None:
        self._answered_at = self.policy.clock()
        if self._down is not None:
            log.info("store %s answers again", self.name)
        self._down = None

    def silent(self, started: float, what: str) -> None:
        """An operation begun at ``started`` ended without an answer (``what`` says how)."""
        if self._answered_at >= started:
            return
        if self._down is None:
            log.warning("%s; failing its requests at once for %s", what, _secs(self.policy.hold))
        self._down = what
        self._down_at = self.policy.clock()


class _OutOfTime(stop_base):
    """Stop when what is left of the deadline after the coming wait is below ``floor``."""

    def __init__(self, policy: RetryPolicy, started: float, floor: float) -> None:
        self.policy, self.started, self.floor = policy, started, floor

    def __call__(self, retry_state: RetryCallState) -> bool:
        p = self.policy
        left = p.deadline - (p.clock() - self.started) - (retry_state.upcoming_sleep or 0.0)
        return left < self.floor


#: retries of under-storage requests in this process, by the error's code
#: (store_retryable, store_timeout): exported as shoal_ufs_retries_total{kind}
RETRIES: Counter[str] = Counter()


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    RETRIES[exc.code if isinstance(exc, ShoalError) else "other"] += 1
    log.info("retrying after attempt %d: %s", state.attempt_number, exc)


async def call_with_retry(
    op: Callable[[], Awaitable[T]],
    where: str,
    *,
    policy: RetryPolicy = DEFAULT_RETRY,
    scrub: Sequence[str] = (),
    extra: tuple[type[BaseException], ...] = (),
    health: StoreHealth | None = None,
) -> T:
    """Run ``op`` (a fresh awaitable per attempt), translating backend errors and
    retrying RetryableStoreError only, within ``policy.deadline``. ``extra`` adds
    driver-specific backend types. An operation that ends because the store did not
    answer raises StoreTimeout naming the store (``health.name``, else ``where``)."""
    catch = backend_errors() + extra
    clock = policy.clock
    started = clock()
    probe = health.admit(where) if health is not None else False
    # the shortest attempt worth starting: less than this left of the deadline is none
    floor = min(0.5, policy.read_timeout / 4)
    tried = 0
    silence: str | None = None

    async def attempt() -> T:
        nonlocal tried, silence
        left = policy.deadline - (clock() - started)
        bounds = (min(policy.connect_timeout, left), min(policy.read_timeout, left))
        token = _ATTEMPT.set(bounds)
        tried += 1
        try:
            result = await op()
        except ShoalError as exc:
            silence = retryable_silence(exc, exc)
            raise
        except catch as exc:
            out = translate(exc, where, scrub)
            silence = retryable_silence(out, exc)
            raise out from exc
        finally:
            _ATTEMPT.reset(token)
        silence = None
        return result

    async def attempts() -> T:
        # the first attempt runs bare: tenacity's machinery costs ~0.1-0.3 ms a call
        # (measured; a load of small files makes several store calls per file), and
        # most calls succeed at once. After a retryable failure tenacity takes over and
        # sees that failure as its first attempt, so waits, stops and logs are the same.
        try:
            return await attempt()
        except RetryableStoreError as exc:
            failed: RetryableStoreError | None = exc

        async def replayed() -> T:
            nonlocal failed
            if failed is not None:
                exc, failed = failed, None
                raise exc
            return await attempt()

        retrying = AsyncRetrying(
            stop=stop_after_attempt(1 if probe else max(1, policy.attempts))
            | _OutOfTime(policy, started, floor),
            wait=wait_random_exponential(multiplier=policy.initial, max=policy.maximum),
            retry=retry_if_exception_type(RetryableStoreError),
            sleep=policy.sleep,
            before_sleep=_log_retry,
            reraise=True,
        )
        out: T = await retrying(replayed)
        return out

    try:
        result: Any = await attempts()
    except ShoalError as exc:
        took = clock() - started
        if silence is not None and not isinstance(exc, StoreTimeout):
            store = health.name if health is not None else where
            what = _timed_out(store, silence, policy, tried, took, exc, where)
            if health is not None:
                health.silent(started, what)
            raise StoreTimeout(scrub_text(f"{where}: {what}", scrub)) from exc
        if health is None:
            raise
        health.answered()  # with an error, but it answered
        if type(exc) is RetryableStoreError and tried > 1:
            # retries spent on resets, 5xx, throttling: say which store, and how often
            cause = exc.message.removeprefix(f"{where}: ")
            msg = f"{where}: store {health.name}: {cause} ({tried} attempts in {took:.1f} s)"
            raise RetryableStoreError(scrub_text(msg, scrub)) from exc
        raise
    finally:
        if probe and health is not None:
            health.probed()
    if health is not None:
        health.answered()
    return result


def _timed_out(
    store: str,
    silence: str,
    policy: RetryPolicy,
    tried: int,
    took: float,
    exc: ShoalError,
    where: str,
) -> str:
    """'store X did not answer within 4 s (2 attempts in 8.0 s; <last cause>)'."""
    if silence == "connect":
        head = f"store {store} did not accept a connection within {_secs(policy.connect_timeout)}"
    else:
        head = f"store {store} did not answer within {_secs(policy.read_timeout)}"
    cause = exc.message.removeprefix(f"{where}: ")
    plural = "attempt" if tried == 1 else "attempts"
    return f"{head} ({tried} {plural} in {took:.1f} s; {cause})"

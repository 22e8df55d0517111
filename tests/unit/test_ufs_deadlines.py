"""Deadlines to the under store (issue 10 item 10): per-attempt connect and read
timeouts cut to one deadline per operation, a StoreTimeout that names the store, and
the StoreHealth that fails requests at once while a store is silent.

The policy tests run on a fake clock (the injected sleep advances it, and a "silent
store" advances it by the read timeout its attempt was given); the socket tests use a
black-holed FaultProxy with sub-second timeouts."""

from __future__ import annotations

import asyncio
import errno
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.errors import (
    InvalidArgument,
    NotFound,
    RetryableStoreError,
    StoreTimeout,
    from_code,
)
from shoal.testing.faults import FaultProxy, Mode
from shoal.ufs.errors import (
    RetryPolicy,
    StoreHealth,
    attempt_timeouts,
    call_with_retry,
    silence_of,
)
from shoal.ufs.options import opt_deadlines


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def policy(clock: FakeClock, **kw: float) -> RetryPolicy:
    base: dict[str, float] = {"connect_timeout": 3.0, "read_timeout": 4.0, "deadline": 8.0}
    base.update(kw)
    return RetryPolicy(
        initial=0.05,
        maximum=0.2,
        sleep=clock.sleep,
        clock=clock,
        **base,  # type: ignore[arg-type]
    )


class SilentStore:
    """An op that never answers: each attempt 'waits' out the read timeout it got."""

    def __init__(self, clock: FakeClock, p: RetryPolicy) -> None:
        self.clock, self.policy = clock, p
        self.given: list[tuple[float, float]] = []

    async def __call__(self) -> bytes:
        connect, read = attempt_timeouts(self.policy)
        self.given.append((connect, read))
        self.clock.now += read
        raise TimeoutError()


# -- the deadline ---------------------------------------------------------------------


async def test_a_silent_store_fails_within_the_deadline_naming_the_store() -> None:
    clock = FakeClock()
    p = policy(clock)
    op = SilentStore(clock, p)
    health = StoreHealth("s3://bkt at http://10.0.0.9:9000", p)
    t0 = clock()
    with pytest.raises(StoreTimeout) as got:
        await call_with_retry(op, "s3://bkt/a/b.bin", policy=p, health=health)
    took = clock() - t0
    assert took <= p.deadline + 1e-9
    # two attempts: the first gets the full read timeout, the second what is left
    assert len(op.given) == 2
    assert op.given[0] == (3.0, 4.0)
    assert op.given[1][1] == pytest.approx(p.deadline - 4.0 - clock.waits[0])
    msg = str(got.value)
    assert msg.startswith("s3://bkt/a/b.bin: store s3://bkt at http://10.0.0.9:9000 ")
    assert "did not answer within 4 s (2 attempts in 8.0 s" in msg
    assert "worker" not in msg
    assert isinstance(got.value, RetryableStoreError)
    assert got.value.errno == errno.ETIMEDOUT


async def test_the_deadline_bounds_attempts_of_any_length() -> None:
    clock = FakeClock()
    p = policy(clock, read_timeout=30.0, deadline=5.0)
    op = SilentStore(clock, p)
    with pytest.raises(StoreTimeout):
        await call_with_retry(op, "s3://bkt/k", policy=p)
    assert op.given == [(3.0, 5.0)]  # cut to the deadline, and no time left for another
    assert clock() - 1000.0 == pytest.approx(5.0)


async def test_fast_failures_still_get_their_attempts_and_are_not_timeouts() -> None:
    clock = FakeClock()
    p = policy(clock)
    calls = 0

    async def reset() -> bytes:
        nonlocal calls
        calls += 1
        clock.now += 0.01
        raise ConnectionResetError(errno.ECONNRESET, "reset by peer")

    health = StoreHealth("s3://bkt", p)
    with pytest.raises(RetryableStoreError) as got:
        await call_with_retry(reset, "s3://bkt/k", policy=p, health=health)
    assert not isinstance(got.value, StoreTimeout)
    assert calls == p.attempts
    assert not health.down  # a reset is an answer: the store is there


async def test_spent_retries_name_the_store() -> None:
    clock = FakeClock()
    p = policy(clock)

    async def reset() -> bytes:
        raise ConnectionResetError(errno.ECONNRESET, "reset by peer")

    health = StoreHealth("s3://bkt at http://h:9000", p)
    with pytest.raises(RetryableStoreError) as got:
        await call_with_retry(reset, "s3://bkt/k", policy=p, health=health)
    msg = str(got.value)
    assert msg.startswith("s3://bkt/k: store s3://bkt at http://h:9000: ")
    assert f"({p.attempts} attempts in " in msg


async def test_an_answer_raised_while_handling_a_timeout_is_an_answer() -> None:
    clock = FakeClock()
    p = policy(clock)

    async def missing() -> bytes:
        try:
            raise TimeoutError()
        except TimeoutError:
            raise FileNotFoundError(errno.ENOENT, "no such key")  # noqa: B904

    health = StoreHealth("s3://bkt", p)
    with pytest.raises(NotFound):
        await call_with_retry(missing, "s3://bkt/k", policy=p, health=health)
    assert not health.down


async def test_a_slow_first_attempt_is_retried_and_succeeds() -> None:
    clock = FakeClock()
    p = policy(clock)
    n = 0

    async def flaky() -> bytes:
        nonlocal n
        n += 1
        if n == 1:
            clock.now += attempt_timeouts(p)[1]
            raise TimeoutError()
        return b"ok"

    health = StoreHealth("s3://bkt", p)
    assert await call_with_retry(flaky, "s3://bkt/k", policy=p, health=health) == b"ok"
    assert not health.down


def test_attempt_timeouts_outside_an_operation_are_the_policys() -> None:
    p = RetryPolicy(connect_timeout=1.5, read_timeout=2.5)
    assert attempt_timeouts(p) == (1.5, 2.5)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_policy_refuses_bad_timeouts(bad: float) -> None:
    with pytest.raises(ValueError, match="deadline"):
        RetryPolicy(deadline=bad)


# -- telling silence from an answer -----------------------------------------------------


def test_silence_of() -> None:
    import aiohttp
    import requests
    from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

    assert silence_of(TimeoutError()) == "read"
    assert silence_of(aiohttp.ServerTimeoutError("x")) == "read"
    assert silence_of(aiohttp.ConnectionTimeoutError("x")) == "connect"
    assert silence_of(ReadTimeoutError(endpoint_url="http://h")) == "read"
    assert silence_of(ConnectTimeoutError(endpoint_url="http://h")) == "connect"
    assert silence_of(requests.ConnectTimeout()) == "connect"
    assert silence_of(requests.ReadTimeout()) == "read"
    assert silence_of(OSError(errno.ETIMEDOUT, "timed out")) == "read"
    wrapped = RetryableStoreError("GET k: ServerTimeoutError")
    wrapped.__cause__ = aiohttp.ServerTimeoutError("x")
    assert silence_of(wrapped) == "read"
    assert silence_of(ConnectionResetError()) is None
    assert silence_of(RetryableStoreError("503 SlowDown")) is None


# -- StoreHealth: failing at once while a store is silent -------------------------------


async def test_a_silent_store_fails_the_next_requests_at_once_then_probes() -> None:
    clock = FakeClock()
    p = policy(clock, hold=5.0)
    health = StoreHealth("s3://bkt at http://h:1", p)
    op = SilentStore(clock, p)
    with pytest.raises(StoreTimeout):
        await call_with_retry(op, "s3://bkt/a", policy=p, health=health)
    assert health.down
    tried = len(op.given)

    # within the hold: no request reaches the store
    t0 = clock()
    with pytest.raises(StoreTimeout) as fast:
        await call_with_retry(op, "s3://bkt/b", policy=p, health=health)
    assert clock() == t0 and len(op.given) == tried
    assert str(fast.value).startswith(
        "s3://bkt/b: not sent, failing at once: store s3://bkt at http://h:1 did not answer"
    )

    # after it: one probe, one attempt, while others still fail at once
    clock.now += p.hold
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def probe() -> bytes:
        entered.set()
        await gate.wait()
        return b"back"

    task = asyncio.ensure_future(call_with_retry(probe, "s3://bkt/c", policy=p, health=health))
    await entered.wait()
    with pytest.raises(StoreTimeout, match="it is being probed"):
        await call_with_retry(op, "s3://bkt/d", policy=p, health=health)
    gate.set()
    assert await task == b"back"
    assert not health.down  # an answer ends it

    # and the store is tried normally again
    async def ok() -> bytes:
        return b"ok"

    assert await call_with_retry(ok, "s3://bkt/e", policy=p, health=health) == b"ok"


async def test_a_failed_probe_gets_one_attempt_and_holds_again() -> None:
    clock = FakeClock()
    p = policy(clock, hold=5.0)
    health = StoreHealth("s3://bkt", p)
    op = SilentStore(clock, p)
    with pytest.raises(StoreTimeout):
        await call_with_retry(op, "s3://bkt/a", policy=p, health=health)
    clock.now += p.hold
    before = len(op.given)
    with pytest.raises(StoreTimeout, match=r"\(1 attempt in"):
        await call_with_retry(op, "s3://bkt/b", policy=p, health=health)
    assert len(op.given) == before + 1
    with pytest.raises(StoreTimeout, match="failing at once"):
        await call_with_retry(op, "s3://bkt/c", policy=p, health=health)


async def test_any_answer_from_the_store_ends_the_hold() -> None:
    clock = FakeClock()
    p = policy(clock, hold=5.0)
    health = StoreHealth("s3://bkt", p)
    with pytest.raises(StoreTimeout):
        await call_with_retry(SilentStore(clock, p), "s3://bkt/a", policy=p, health=health)
    clock.now += p.hold

    async def missing() -> bytes:
        raise FileNotFoundError(errno.ENOENT, "no such key")

    with pytest.raises(NotFound):
        await call_with_retry(missing, "s3://bkt/b", policy=p, health=health)
    assert not health.down


async def test_one_hung_object_does_not_take_the_store_down() -> None:
    """An operation that timed out while others on the store got answers is that
    object's trouble: the store stays up."""
    clock = FakeClock()
    p = policy(clock)
    health = StoreHealth("s3://bkt", p)
    slow = SilentStore(clock, p)

    async def hung_then_others_answer() -> bytes:
        try:
            await slow()
        finally:
            health.answered()  # meanwhile another request on the store was answered
        raise AssertionError("unreachable")

    with pytest.raises(StoreTimeout):
        await call_with_retry(hung_then_others_answer, "s3://bkt/a", policy=p, health=health)
    assert not health.down


async def test_wire_code_round_trips() -> None:
    exc = from_code(StoreTimeout.code, "store s3://b did not answer")
    assert type(exc) is StoreTimeout and str(exc) == "store s3://b did not answer"


# -- mount options ----------------------------------------------------------------------


def test_opt_deadlines() -> None:
    base = RetryPolicy()
    assert opt_deadlines({}, base) is base
    got = opt_deadlines({"read_timeout": "2.5", "deadline": "6", "hold": "1"}, base)
    assert (got.connect_timeout, got.read_timeout, got.deadline, got.hold) == (
        base.connect_timeout,
        2.5,
        6.0,
        1.0,
    )
    for bad in ("0", "-1", "nan", "inf", "1e999", "soon", "100000"):
        with pytest.raises(InvalidArgument):
            opt_deadlines({"deadline": bad}, base)


def test_s3_and_webhdfs_take_the_deadline_options() -> None:
    from shoal.ufs.s3 import S3Store
    from shoal.ufs.webhdfs import WebHdfsStore

    s3 = S3Store("s3://bkt/pre", {"endpoint_url": "http://h:9000", "deadline": "3"})
    assert s3._retry.deadline == 3.0
    assert s3._health.name == "s3://bkt at http://h:9000"
    hdfs = WebHdfsStore("webhdfs://nn:9870/data", {"read_timeout": "1"})
    assert hdfs._retry.read_timeout == 1.0
    with pytest.raises(InvalidArgument, match="deadline"):
        S3Store("s3://bkt", {"deadline": "never"})


# -- against sockets: a black-holed store ------------------------------------------------


@pytest.fixture
def blackhole() -> Iterator[FaultProxy]:
    # a blackhole never connects upstream: the upstream address is never used
    with FaultProxy("127.0.0.1:9") as p:
        p.set(Mode.BLACKHOLE)
        yield p
        p.reset_connections()


FAST = {"read_timeout": "0.3", "deadline": "0.8", "hold": "30"}


def creds_file(tmp_path: Path) -> str:
    path = tmp_path / "creds"
    path.write_text(
        "[default]\naws_access_key_id = AKIADEADLINEKEY1\n"
        "aws_secret_access_key = deadline-secret-value-123\n"
    )
    return str(path)


async def test_s3_fast_get_against_a_black_hole(blackhole: FaultProxy, tmp_path: Path) -> None:
    from shoal.ufs.s3 import S3Store

    opts = {"endpoint_url": blackhole.endpoint, "credentials_file": creds_file(tmp_path), **FAST}
    store = S3Store("s3://bkt/pre", opts)
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreTimeout) as got:
            await store.read("x.bin", 0, 100)
        took = time.monotonic() - t0
        assert took < 5.0  # liveness: well within, not the old 120 s
        msg = str(got.value)
        assert f"store s3://bkt at {blackhole.endpoint} did not answer within 0.3 s" in msg
        assert "deadline-secret-value-123" not in msg and "AKIADEADLINEKEY1" not in msg
        # the next read fails at once: the store went silent
        t1 = time.monotonic()
        with pytest.raises(StoreTimeout, match="failing at once"):
            await store.read_head("y.bin", 100)
        assert time.monotonic() - t1 < 0.3
    finally:
        await store.close()


async def test_s3fs_path_against_a_black_hole(blackhole: FaultProxy, tmp_path: Path) -> None:
    """Listing and metadata go through s3fs/botocore, whose read_timeout is set."""
    from shoal.ufs.s3 import S3Store

    opts = {"endpoint_url": blackhole.endpoint, "credentials_file": creds_file(tmp_path), **FAST}
    store = S3Store("s3://bkt/pre", opts)
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreTimeout) as got:
            await store.info("x.bin")
        assert time.monotonic() - t0 < 5.0
        assert f"store s3://bkt at {blackhole.endpoint}" in str(got.value)
        assert "deadline-secret-value-123" not in str(got.value)
    finally:
        await store.close()


async def test_webhdfs_against_a_black_hole(blackhole: FaultProxy) -> None:
    from shoal.ufs.webhdfs import WebHdfsStore

    store = WebHdfsStore(f"webhdfs://127.0.0.1:{blackhole.port}/data", dict(FAST))
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreTimeout) as got:
            await store.info("x.bin")
        assert time.monotonic() - t0 < 5.0
        assert f"store webhdfs://127.0.0.1:{blackhole.port} did not answer" in str(got.value)
    finally:
        await store.close()

import asyncio

import pytest

from shoal.core.singleflight import SingleFlight


async def test_one_flight_for_many_waiters() -> None:
    sf: SingleFlight[int] = SingleFlight()
    gate = asyncio.Event()
    calls = 0

    async def fetch() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        return 42

    waiters = [asyncio.create_task(sf.do("k", fetch)) for _ in range(16)]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*waiters) == [42] * 16
    assert calls == 1 and sf.started == 1 and sf.shared == 15
    assert len(sf) == 0


async def test_error_reaches_every_waiter_and_next_call_retries() -> None:
    sf: SingleFlight[int] = SingleFlight()
    gate = asyncio.Event()

    async def boom() -> int:
        await gate.wait()
        raise OSError("store down")

    waiters = [asyncio.create_task(sf.do("k", boom)) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    for r in await asyncio.gather(*waiters, return_exceptions=True):
        assert isinstance(r, OSError)

    async def ok() -> int:
        return 1

    assert await sf.do("k", ok) == 1


async def test_cancelled_waiter_does_not_cancel_the_flight() -> None:
    sf: SingleFlight[int] = SingleFlight()
    gate = asyncio.Event()

    async def fetch() -> int:
        await gate.wait()
        return 7

    owner = asyncio.create_task(sf.do("k", fetch))
    await asyncio.sleep(0)
    joiner = asyncio.create_task(sf.do("k", fetch))
    await asyncio.sleep(0)
    joiner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await joiner
    gate.set()
    assert await owner == 7


def test_do_many_answers_every_key_it_claimed_with_one_computation() -> None:
    async def go() -> None:
        sf: SingleFlight[str] = SingleFlight()
        gate = asyncio.Event()
        calls = []

        async def many() -> list[str]:
            calls.append("many")
            await gate.wait()
            return ["a!", "b!", "c!"]

        async def own() -> str:
            await gate.wait()
            return "b (own)"

        b_own = asyncio.create_task(sf.do("b", own))  # already in flight: keeps its own
        await asyncio.sleep(0)
        run = asyncio.create_task(sf.do_many(["a", "b", "c"], many))
        await asyncio.sleep(0)
        joined = [asyncio.create_task(sf.do(k, own)) for k in ("a", "c")]
        await asyncio.sleep(0)
        gate.set()
        assert await run == ["a!", "b!", "c!"]
        assert [await j for j in joined] == ["a!", "c!"]  # waited on the run, not own()
        assert await b_own == "b (own)"
        assert calls == ["many"] and len(sf) == 0

        async def fails() -> list[str]:
            raise ValueError("store down")

        with pytest.raises(ValueError):
            await sf.do_many(["x", "y"], fails)
        assert len(sf) == 0

    asyncio.run(go())

"""Faults of the under store through shoal.testing.faults.FaultProxy (the dataset's
endpoint is the proxy): cached files are served whatever the store does, misses fail
with an error in bounded time instead of hanging, and a response cut short is never
cached nor returned."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from relhelpers import Dataset, Figures, Readers, digest, seed, wait_for

from shoal.client import Client
from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.faults import FaultProxy, Mode
from shoal.testing.s3 import MotoServer

pytestmark = pytest.mark.integration

#: a miss against a dead store must fail within this: the client's request timeout is
#: 2 s here and the worker's store deadline 8 s (issue 10 item 10); generous for CI
MISS_BOUND = 30.0


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[FaultProxy]:
    with FaultProxy(moto.endpoint) as p:
        yield p


@pytest.fixture
def cluster1(tmp_path: Path, s3_credentials: None) -> Iterator[TestCluster]:
    c = start_cluster(tmp_path / "c", workers=1, mem="0")
    try:
        yield c
    finally:
        c.stop()


def _read_all(c: Client, ds: Dataset, keys: list[str]) -> tuple[int, int, list[str]]:
    """(reads, wrong, errors) reading ``keys``; errors as text."""
    wrong = 0
    errors: list[str] = []
    for k in keys:
        try:
            data = c.read(ds.path(k))
        except Exception as exc:  # counted below
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        if digest(data) != digest(ds.files[k]):
            wrong += 1
    return len(keys), wrong, errors


def _bounded(fn: object, timeout: float) -> tuple[bool, float]:
    """Run fn() on a thread; (finished, seconds). A hung call is left behind as a
    daemon thread, the test fails on it."""
    t0 = time.monotonic()
    t = threading.Thread(target=fn, daemon=True)  # type: ignore[arg-type]
    t.start()
    t.join(timeout)
    return not t.is_alive(), time.monotonic() - t0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_hits_served_and_misses_fail_under_store_faults(
    moto: MotoServer, proxy: FaultProxy, cluster1: TestCluster, bucket: str, figures: Figures
) -> None:
    files = sample_files(60, 1000, 120_000, seed=41)
    ds = seed(moto, cluster1, bucket, files, endpoint=proxy.endpoint)
    keys = sorted(files)
    hits, misses = keys[:40], keys[40:]
    with cluster1.client() as c:
        assert _read_all(c, ds, hits) == (len(hits), 0, [])

    for mode in (Mode.BLACKHOLE, Mode.RESET):
        proxy.set(mode)
        for sc in (True, False):
            # a new client each time: nothing of the earlier reads is in its memory
            with cluster1.client(short_circuit=sc, request_timeout=2.0) as c:
                n, wrong, errors = _read_all(c, ds, hits)
            figures.record(
                f"cached reads, store {mode.value}, {'short circuit' if sc else 'TCP'}",
                n,
                "0 wrong bytes, 0 failed reads",
                wrong + len(errors),
            )
            assert wrong == 0 and not errors, errors[:3]

        # misses: an error within a bound, never a hang and never bytes
        result: dict[str, object] = {}

        def miss(mode: Mode = mode, result: dict[str, object] = result) -> None:
            with cluster1.client(short_circuit=False, request_timeout=2.0, ufs_fallback=False) as c:
                result["r"] = _read_all(c, ds, misses[:2])

        finished, took = _bounded(miss, MISS_BOUND)
        n, wrong, errors = result.get("r", (2, 0, []))  # type: ignore[misc]
        figures.record(
            f"uncached reads, store {mode.value}",
            2,
            f"each fails with an error within {MISS_BOUND:.0f} s",
            int(not finished) + wrong + (2 - len(errors)),
            seconds=round(took, 1),
            error=errors[0][:120] if errors else "",
        )
        assert finished, f"misses hung for {took:.0f}s with the store {mode.value}"
        assert wrong == 0 and len(errors) == 2, errors
        proxy.set(Mode.PASS)
        proxy.reset_connections()  # what the blackhole left hanging

    # the store back: every file readable, correct, including the former misses
    with cluster1.client() as c:
        assert _read_all(c, ds, keys) == (len(keys), 0, [])


@pytest.mark.timeout(180)
def test_truncated_store_responses_are_never_cached(
    moto: MotoServer, proxy: FaultProxy, cluster1: TestCluster, bucket: str, figures: Figures
) -> None:
    files = sample_files(30, 5000, 200_000, seed=43)
    files["big/a.bin"] = bytes(range(256)) * 12_000  # 3 MB: several 1 MiB pages
    ds = seed(moto, cluster1, bucket, files, endpoint=proxy.endpoint)
    keys = sorted(files)
    proxy.set(Mode.TRUNCATE, truncate_after=1000)
    during = 0
    with cluster1.client(request_timeout=5.0, ufs_fallback=False) as c:
        n, wrong, errors = _read_all(c, ds, keys)
    during += n
    truncated = proxy.stats().get("truncated", 0)
    figures.record(
        "reads while every store response is cut after 1000 body bytes",
        n,
        "a read fails or returns the whole object, never part of it",
        wrong,
        failed_reads=len(errors),
        truncated_responses=truncated,
    )
    assert truncated > 0
    assert wrong == 0
    proxy.set(Mode.PASS)
    for sc in (False, True):
        with cluster1.client(short_circuit=sc) as c:
            n, wrong, errors = _read_all(c, ds, keys)
            n2, wrong2, errors2 = _read_all(c, ds, keys)  # now from the cache
        figures.record(
            f"reads after truncation, store back ({'short circuit' if sc else 'TCP'})",
            n + n2,
            "0 wrong bytes (nothing torn was cached), 0 failed reads",
            wrong + wrong2 + len(errors) + len(errors2),
        )
        assert wrong == wrong2 == 0 and not errors and not errors2, (errors + errors2)[:3]


@pytest.mark.timeout(120)
def test_a_slow_store_serves_correct_bytes(
    moto: MotoServer, proxy: FaultProxy, cluster1: TestCluster, bucket: str, figures: Figures
) -> None:
    files = sample_files(20, 1000, 300_000, seed=45)
    ds = seed(moto, cluster1, bucket, files, endpoint=proxy.endpoint)
    proxy.set(Mode.LATENCY, latency=0.05)
    with cluster1.client(request_timeout=20.0) as c:
        n, wrong, errors = _read_all(c, ds, sorted(files))
    figures.record(
        "uncached reads through a store with 50 ms per chunk",
        n,
        "0 wrong bytes, 0 failed reads",
        wrong + len(errors),
    )
    assert wrong == 0 and not errors, errors[:3]


DEADLINE_BOUND = 15.0


@pytest.mark.timeout(90)
def test_a_miss_against_a_dead_store_fails_fast_naming_the_store(
    moto: MotoServer,
    proxy: FaultProxy,
    cluster1: TestCluster,
    bucket: str,
    readers: Readers,
    figures: Figures,
) -> None:
    """With default client settings, a miss against a black-holed store fails within a
    bound with an error that names the store, not a healthy worker."""
    files = sample_files(2, 1000, 5000, seed=47)
    ds = seed(moto, cluster1, bucket, files, endpoint=proxy.endpoint)
    proxy.set(Mode.BLACKHOLE)
    t0 = time.monotonic()
    readers.start(cluster1.master_url, ds.want, 1, settings={"ufs_fallback": False}, rounds=1)
    proc = readers.procs[0][0]
    try:
        wait_for(lambda: proc.poll() is not None, DEADLINE_BOUND, "the reader")
    except AssertionError:
        pass
    took = time.monotonic() - t0
    finished = proc.poll() is not None
    total = readers.stop(timeout=1) if finished else {"errors": []}
    readers.kill()
    proxy.set(Mode.PASS)
    proxy.reset_connections()
    errors = [e for e in total["errors"] if "wrong" not in e]
    named = bool(errors) and all("store" in e.lower() and "worker" not in e for e in errors)
    figures.record(
        "uncached reads, store blackhole, default client settings",
        2,
        f"each fails within {DEADLINE_BOUND:.0f} s with an error naming the store",
        int(not finished) + int(not named),
        seconds=round(took, 1),
    )
    assert finished, f"a miss against a dead store took over {took:.0f}s"
    assert named, errors

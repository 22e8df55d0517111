"""A cluster over several hosts on one machine (network namespaces, real sockets): the
remote read path, placement between hosts, a worker host cut off, and the master host
cut off. One namespaced cluster is shared by the module; each test uses its own
dataset and puts back any link it pulls."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from shoal.testing import netns
from shoal.testing.cluster import sample_files
from shoal.testing.netns import MultiHost

pytestmark = pytest.mark.integration

T = TypeVar("T")
#: small files per dataset, and one large file of several pages (1 MiB pages)
N = 30
LARGE = 2_500_000


def _until(fn: Callable[[], T], ok: Callable[[T], bool], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if ok(v):
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f}s; last: {v!r}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def mh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"namespaced hosts unavailable: {reason}")
    with netns.multihost(tmp_path_factory.mktemp("multihost"), workers=3, clients=2) as m:
        # the module's reader: a client host with no worker of its own
        m.agent("client0").call("connect", master=m.master_url, request_timeout=10.0)
        yield m


def _dataset(
    mh: MultiHost, name: str, seed: int, options: dict[str, str] | None = None, n: int = N
) -> dict[str, list[Any]]:
    """Seed bucket ``name`` in the store host and define dataset ``name`` over it;
    what a byte-exact read of each file answers, by path."""
    spec: list[dict[str, Any]] = [
        {"n": n, "min_size": 1_000, "max_size": 64_000, "seed": seed},
        {"n": 1, "min_size": LARGE, "max_size": LARGE, "seed": seed, "prefix": "big"},
    ]
    files: dict[str, bytes] = {}
    for s in spec:
        files.update(sample_files(**s))
    ctl = mh.agent("client0")
    ctl.call("seed", endpoint=mh.store_endpoint, bucket=name, spec=spec)
    ctl.call("create_dataset", name=name, bucket=name, endpoint=mh.store_endpoint, options=options)
    return netns.expected(files, name)


def _total(want: dict[str, list[Any]]) -> int:
    return sum(size for size, _ in want.values())


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def _stats(mh: MultiHost, dataset: str) -> list[dict[str, float]]:
    return [mh.worker_stats(i, dataset, via="client0") for i in range(3)]


def _ring(mh: MultiHost) -> dict[str, Any]:
    r = mh.agent("client0").call("get", url=mh.master_url + "/api/v1/ring")
    out: dict[str, Any] = json.loads(r["body"])
    return out


def test_each_host_binds_only_its_own_address(mh: MultiHost) -> None:
    for h in mh.plan.hosts:
        listening = mh.net.listeners(h.name)
        assert set(listening) <= {h.addr}, f"{h.name} listens on {listening}"
        if h.role in ("master", "store", "worker"):
            assert listening, f"nothing listens on {h.name}"
    ring = _ring(mh)
    assert {w["host"] for w in ring["workers"]} == {h.addr for h in mh.plan.workers()}
    assert {w["node"] for w in ring["workers"]} == {h.node for h in mh.plan.workers()}
    # the machine's own network has none of it: no interface, no address
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert mh.plan.token not in links
    assert mh.plan.subnet.rsplit(".", 1)[0] + "." not in addrs


def test_remote_reads_go_over_tcp_and_are_byte_exact(mh: MultiHost) -> None:
    want = _dataset(mh, "remote", seed=1)
    total = _total(want)
    c = mh.agent("client0")
    before = c.call("counters")
    assert c.call("read", paths=list(want)) == want  # cold: the owners fetch
    assert c.call("read", paths=list(want), how="cat_many") == want  # warm: batched
    assert c.call("read", paths=list(want)) == want  # warm: one by one
    d = _delta(c.call("counters"), before)
    # no worker on this host: nothing short-circuited or over a Unix socket, nothing
    # read around the workers; every byte came over TCP
    assert d["short_circuit"] == d["local"] == d["bytes_short_circuit"] == d["bytes_local"] == 0
    assert d["ufs_fallback"] == d["bytes_ufs"] == 0
    assert d["bytes_remote"] == 3 * total
    stats = _stats(mh, "remote")
    assert sum(s["local"] for s in stats) == 0
    assert sum(s["remote"] for s in stats) == 2 * total  # the warm passes
    assert sum(s["ufs"] for s in stats) == total  # the cold pass, fetched once


def test_placement_hash_spreads_over_all_worker_hosts(mh: MultiHost) -> None:
    want = _dataset(mh, "spread", seed=2)
    assert mh.agent("client0").call("read", paths=list(want)) == want
    stats = _until(
        lambda: _stats(mh, "spread"),
        lambda st: sum(s["cached_files"] for s in st) == len(want),
        20,
        "every file cached once",
    )
    assert all(s["cached_files"] > 0 for s in stats), stats


def test_placement_local_caches_on_the_readers_host(mh: MultiHost) -> None:
    want = _dataset(mh, "nearby", seed=3, options={"placement": "local"})
    # a client host that also runs a worker: worker1's
    reader = mh.agent("worker1")
    reader.call("connect", master=mh.master_url, request_timeout=10.0)
    before = reader.call("counters")
    assert reader.call("read", paths=list(want)) == want
    assert reader.call("read", paths=list(want)) == want
    d = _delta(reader.call("counters"), before)
    assert d["remote"] == d["ufs_fallback"] == 0  # all through the worker on this host
    stats = _until(
        lambda: _stats(mh, "nearby"),
        lambda st: st[1]["cached_files"] == len(want),
        20,
        "worker1 caching every file",
    )
    assert stats[0]["cached_files"] == stats[2]["cached_files"] == 0, stats


def test_replicas_2_survive_a_worker_host_cut_off(mh: MultiHost) -> None:
    want = _dataset(mh, "twice", seed=4, options={"replicas": "2"})
    c = mh.agent("client0")
    job = c.call("load", dataset="twice", timeout=60.0)
    assert job["state"] == "done", job
    _until(
        lambda: _stats(mh, "twice"),
        lambda st: sum(s["cached_files"] for s in st) == 2 * len(want),
        20,
        "two copies of every file",
    )
    fetched = [s["ufs"] for s in _stats(mh, "twice")]
    before = c.call("counters")
    try:
        with mh.net.cut("worker2"):
            # at once: the client finds worker2 silent and reads the second copies
            assert c.call("read", paths=list(want)) == want
            # once the master has dropped worker2 from the ring
            _until(lambda: _ring(mh), lambda r: len(r["workers"]) == 2, 30, "worker2 expired")
            assert c.call("read", paths=list(want), how="cat_many") == want
            d = _delta(c.call("counters"), before)
            assert d["ufs_fallback"] == 0  # served by the surviving copies
            assert d["failovers"] >= 1
            # ... from their caches: the survivors fetched nothing anew
            after = [mh.worker_stats(i, "twice", via="client0")["ufs"] for i in (0, 1)]
            assert after == fetched[:2]
    finally:
        mh.cluster.wait_ring(3)


def test_a_client_host_that_loses_the_master_keeps_reading(mh: MultiHost) -> None:
    want = _dataset(mh, "headless", seed=5, n=2 * N)
    paths = sorted(want)
    cached, uncached = paths[::2], paths[1::2]
    # a reader on the second client host that refreshes its ring every half second, so
    # that refreshes come due (and fail) while the master is gone
    c = mh.agent("client1")
    c.call("connect", master=mh.master_url, request_timeout=10.0, ring_refresh=0.5)
    assert c.call("read", paths=cached) == {p: want[p] for p in cached}
    before = c.call("counters")
    try:
        with mh.net.cut("master"):
            with pytest.raises(netns.AgentError):  # out of reach from here now
                c.call("get", url=mh.master_url + "/api/v1/health", timeout=1.0)
            assert c.call("read", paths=cached) == {p: want[p] for p in cached}
            assert c.call("read", paths=uncached) == {p: want[p] for p in uncached}
            # and on, past several refresh intervals, batched and one by one
            until = time.monotonic() + 3.0
            passes = 0
            while time.monotonic() < until or passes < 2:
                assert c.call("read", paths=paths, how=("cat", "cat_many")[passes % 2]) == want
                passes += 1
            d = _delta(c.call("counters"), before)
            assert d["ufs_fallback"] == 0  # the workers served, fetching what was new
            assert d["remote"] >= len(paths)
    finally:
        mh.cluster.wait_ring(3)


def test_bandwidth_cap_applies_and_lifts(mh: MultiHost) -> None:
    h = mh.plan.host("client1")

    def qdiscs() -> str:
        argv = ["tc", "-n", h.netns, "qdisc", "show", "dev", netns.HOST_IF]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    mh.net.set_rate("client1", "200mbit")
    try:
        assert "tbf" in qdiscs() and "200Mbit" in qdiscs()
        # still reachable, only slower
        assert (
            mh.agent("client1").call("get", url=mh.master_url + "/api/v1/health")["status"] == 200
        )
    finally:
        mh.net.set_rate("client1", None)
    assert "tbf" not in qdiscs()


def test_cleanup_leaves_no_namespace(tmp_path: Path) -> None:
    """A cluster that fails inside its ``with`` leaves no namespace behind."""
    if netns.unavailable() is not None:
        pytest.skip("namespaced hosts unavailable")
    p = netns.plan(workers=1, clients=0)
    net = netns.Network(p)
    with pytest.raises(RuntimeError, match="boom"), net:
        assert set(p.namespaces()) <= set(netns.list_namespaces())
        raise RuntimeError("boom")
    assert not set(p.namespaces()) & set(netns.list_namespaces())


def test_a_crashed_runs_namespaces_are_swept(tmp_path: Path) -> None:
    """Namespaces named for a process that is gone are removed by the next run."""
    if netns.unavailable() is not None:
        pytest.skip("namespaced hosts unavailable")
    gone = subprocess.Popen(["true"])
    gone.wait()
    name = f"{netns.NS_PREFIX}{gone.pid}-abc-master"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in netns.sweep_stale()
        assert name not in netns.list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_sigterm_cleans_up(tmp_path: Path) -> None:
    """A test process killed with SIGTERM deletes its namespaces on the way out."""
    if netns.unavailable() is not None:
        pytest.skip("namespaced hosts unavailable")
    script = (
        "import sys\n"
        "from shoal.testing import netns\n"
        "net = netns.Network(netns.plan(workers=1, clients=0)).up()\n"
        "print(' '.join(net.plan.namespaces()), flush=True)\n"
        "sys.stdin.read()\n"  # until killed
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        names = proc.stdout.readline().split()
        assert names and set(names) <= set(netns.list_namespaces())
        proc.terminate()
        assert proc.wait(timeout=30) == -signal.SIGTERM
        assert not set(names) & set(netns.list_namespaces())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

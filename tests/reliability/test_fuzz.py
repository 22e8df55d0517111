"""A protocol fuzzer against a worker's TCP port and Unix socket: random bytes, frames
with random ops and bodies, structure-aware frames (msgpack argument lists of the wrong
shapes and types), mutated valid requests and frames that claim more than they send.
The worker stays alive and answers valid requests throughout (its event loop stays
responsive), and its memory and descriptors stay bounded."""

from __future__ import annotations

import random
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from relhelpers import Figures, fd_count, rss_bytes, seed, wait_for, worker_info, worker_pid

from shoal.proto import wire
from shoal.proto.messages import TouchRequest, encode_request
from shoal.proto.wire import Op
from shoal.testing import wire as raw
from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.s3 import MotoServer

pytestmark = pytest.mark.integration

FRAMES = 300
#: a valid request must be answered within this while the fuzzer runs
LIVENESS_BOUND = 5.0
MiB = 1 << 20


@pytest.fixture(scope="module")
def fcluster(
    tmp_path_factory: pytest.TempPathFactory, s3_credentials: None, moto: MotoServer
) -> Iterator[TestCluster]:
    c = start_cluster(tmp_path_factory.mktemp("fuzz"), workers=1, mem="0")
    try:
        files = sample_files(20, 100, 5000, seed=71)
        seed(moto, c, "fuzz-bucket", files)
        with c.client() as cl:  # cached, so valid requests find data
            for k in files:
                cl.read(f"/ds/data/{k}")
        yield c
    finally:
        c.stop()


Addr = tuple[str, int] | str


def _reply(s: socket.socket) -> tuple[int, Any]:
    """(status, meta) of one response; data is read and discarded."""
    r = raw.read_reply(s)
    return r.status, r.meta


def hello(addr: Addr, timeout: float = LIVENESS_BOUND) -> float:
    """Seconds a HELLO on a fresh connection took; raises if it is not answered OK."""
    return raw.hello(addr, timeout)


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([0, 1, -1, 2**31, 2**63 - 1, -(2**63), 10**7, rng.randrange(1 << 16)])
    if kind == 2:
        return rng.choice(["", "ds", "data/000/f000001.bin", "../../etc/passwd", "x" * 300])
    if kind == 3:
        return rng.randbytes(rng.randrange(40))
    if kind == 4:
        return rng.random() * rng.choice([1, 1e300, -1])
    if kind == 5:
        return rng.choice([True, False])
    if kind == 6:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(6))]
    if kind == 7:
        return {str(_value(rng, 3)): _value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [[_value(rng, depth + 2) for _ in range(4)] for _ in range(rng.randrange(4))]


def _valid(op: Op) -> list[Any]:
    p = "data/000/f000001.bin"
    valid: dict[Op, list[Any]] = {
        Op.HELLO: [wire.VERSION],
        Op.STAT: ["ds", p, None],
        Op.LIST: ["ds", "data/000", None],
        Op.READ: ["ds", p, 0, 100, None, 0, None],  # wire order of ReadRequest
        Op.BATCH: ["ds", [p], None],
        Op.LOCATE: ["ds", p, None, 0, 100, True, 0, 0, None],
        Op.TOUCH: ["ds", [[p, "v", 1, 100]]],
        Op.DROP: ["ds", "nope", "v", 0],
        Op.LOCATE_DIR: ["ds", "data/000", 0, None],
    }
    return valid[op]


def frame(rng: random.Random) -> tuple[str, bytes]:
    """One fuzzed frame and its kind."""
    kind = rng.randrange(6)
    op = rng.choice(list(Op))
    if kind == 0:
        return "random bytes", rng.randbytes(rng.randrange(1, 300))
    if kind == 1:
        body = rng.randbytes(rng.randrange(0, 200))
        return "random body", wire.REQ_HDR.pack(len(body), rng.randrange(256), 1) + body
    if kind == 2:
        args = [_value(rng) for _ in range(rng.randrange(10))]
        body = msgpack.packb(args, use_bin_type=True)
        return "random arguments", wire.REQ_HDR.pack(len(body), op, 1) + body
    if kind == 3:
        raw = bytearray(wire.encode_request(op, 1, _valid(op)))
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(wire.REQ_HDR.size, len(raw)) if len(raw) > 9 else 0
            raw[i] = rng.randrange(256)
        return "mutated request", bytes(raw)
    if kind == 4:
        # claims a body it never sends (or one past the limit), then hangs up
        claim = rng.choice([1000, 1 << 20, wire.MAX_BODY, wire.MAX_BODY + 1, 2**32 - 1])
        return "short body", wire.REQ_HDR.pack(claim, op, 1) + rng.randbytes(rng.randrange(100))
    # a valid header whose arguments are swapped around
    args = _valid(op)
    rng.shuffle(args)
    body = msgpack.packb(args, use_bin_type=True)
    return "shuffled arguments", wire.REQ_HDR.pack(len(body), op, 1) + body


def send_frame(addr: Addr, data: bytes) -> str:
    """Send one frame on its own connection (HELLO said first, so that the frame meets
    the decoders); what came back: reply, closed or silent."""
    with raw.connect(addr, 2.0) as s:
        try:
            s.sendall(data)
        except OSError:
            return "closed"
        s.settimeout(0.3)
        try:
            _reply(s)
            return "reply"
        except (ConnectionError, struct.error):
            return "closed"
        except TimeoutError:
            return "silent"  # waiting for the rest of a frame: legitimate


class Pinger(threading.Thread):
    """HELLO every 0.1 s while the fuzzer runs; the slowest answer is the event loop's
    worst latency as a client sees it."""

    def __init__(self, addr: Addr) -> None:
        super().__init__(daemon=True)
        self.addr = addr
        self.stop = threading.Event()
        self.worst = 0.0
        self.count = 0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                self.worst = max(self.worst, hello(self.addr))
                self.count += 1
            except Exception as exc:  # counted: a missed ping is a finding
                self.failures.append(f"{type(exc).__name__}: {exc}")


def _addresses(c: TestCluster) -> dict[str, Addr]:
    info = worker_info(c, 0)
    return {"tcp": (info["host"], int(info["port"])), "unix": str(info["uds"])}


@pytest.mark.timeout(180)
def test_fuzzed_frames_leave_the_worker_serving(fcluster: TestCluster, figures: Figures) -> None:
    addrs = _addresses(fcluster)
    pid = worker_pid(fcluster, 0)
    for a in addrs.values():
        hello(a)
    rss0, fds0 = rss_bytes(pid), fd_count(pid)
    rng = random.Random(73)
    outcomes: dict[str, int] = {}
    pingers = {name: Pinger(a) for name, a in addrs.items()}
    for p in pingers.values():
        p.start()
    try:
        for i in range(FRAMES):
            name = "tcp" if i % 2 == 0 else "unix"
            kind, data = frame(rng)
            got = send_frame(addrs[name], data)
            outcomes[got] = outcomes.get(got, 0) + 1
            assert fcluster.procs["worker-0"].poll() is None, f"worker died on a {kind} frame"
    finally:
        for p in pingers.values():
            p.stop.set()
            p.join(10)
    for a in addrs.values():
        hello(a)
    # the fuzzer's connections are all closed: the worker's descriptors come back
    wait_for(lambda: fd_count(pid) <= fds0 + 10, 10, "the worker's descriptors to settle")
    rss1 = rss_bytes(pid)
    worst = max(p.worst for p in pingers.values())
    pings = sum(p.count for p in pingers.values())
    missed = [f for p in pingers.values() for f in p.failures]
    figures.record(
        "fuzzed frames (random, structure-aware, mutated, short) on TCP and the Unix socket",
        FRAMES,
        "worker alive and answering; RSS +<64 MiB, fds back to baseline",
        int(rss1 - rss0 > 64 * MiB),
        **outcomes,
        rss_growth_mib=round((rss1 - rss0) / MiB, 1),
    )
    figures.record(
        "valid HELLO on both sockets every 0.1 s while fuzzing",
        pings + len(missed),
        f"each answered within {LIVENESS_BOUND:.0f} s",
        len(missed),
        worst_s=round(worst, 3),
    )
    assert not missed, missed[:3]
    assert worst < LIVENESS_BOUND
    assert rss1 - rss0 < 64 * MiB, (rss0, rss1)


@pytest.mark.timeout(60)
def test_huge_touch_frame_does_not_block_the_event_loop(
    fcluster: TestCluster, figures: Figures
) -> None:
    """Issue 10 item 11: one small TOUCH frame claiming 10^7 pages blocked the loop 19 s."""
    addrs = _addresses(fcluster)
    items = [(f"data/000/f{i:06d}.bin", "v", 10**7, 10**12) for i in range(20)]
    data = encode_request(TouchRequest("ds", tuple(items)), 1)
    with raw.connect(addrs["tcp"], 30) as s:
        s.sendall(data)
        took = hello(addrs["unix"], timeout=30)
        s.settimeout(30)
        _status, _ = _reply(s)
    figures.record(
        "TOUCH frame of 20 items x 10^7 pages, then a HELLO on another connection",
        1,
        f"HELLO answered within {LIVENESS_BOUND:.0f} s",
        int(took > LIVENESS_BOUND),
        hello_s=round(took, 3),
    )
    assert took < LIVENESS_BOUND


@pytest.mark.timeout(60)
def test_malformed_bodies_get_the_protocol_error_and_little_log(
    fcluster: TestCluster, figures: Figures
) -> None:
    """Issue 10 item 18: a malformed body gets the protocol's error reply (not a dropped
    connection) and at most a line of log, never a BufferError traceback."""
    addrs = _addresses(fcluster)
    log = fcluster.dir / "worker-0.log"
    before = log.stat().st_size
    rng = random.Random(75)
    n = 40
    replied = 0
    for i in range(n):
        body = b"\xc1" + rng.randbytes(rng.randrange(0, 60))  # 0xc1: never valid msgpack
        data = wire.REQ_HDR.pack(len(body), Op.STAT, 1) + body
        with raw.connect(addrs["tcp" if i % 2 else "unix"], 2.0) as s:
            s.sendall(data)
            try:
                status, meta = _reply(s)
            except (ConnectionError, TimeoutError):
                continue
            if status == wire.Status.ERR and meta.get("code") == "protocol":
                replied += 1
    hello(addrs["tcp"])
    grown = log.read_bytes()[before:]
    lines = grown.count(b"\n")
    figures.record(
        "frames with a malformed msgpack body",
        n,
        "each answered with the protocol error; < 1 log line each, no BufferError",
        (n - replied) + int(b"BufferError" in grown) + int(lines > n),
        log_lines=lines,
    )
    assert b"BufferError" not in grown
    assert replied == n
    assert lines <= n


@pytest.mark.timeout(60)
def test_partial_large_frames_do_not_grow_memory_without_bound(
    fcluster: TestCluster, figures: Figures
) -> None:
    """Issue 10 item 12: partial 64 MiB frames were buffered whole, with no total cap."""
    addrs = _addresses(fcluster)
    pid = worker_pid(fcluster, 0)
    rss0 = rss_bytes(pid)
    conns = []
    chunk = b"\0" * MiB
    try:
        for _ in range(6):
            s = raw.connect(addrs["tcp"], 5.0)
            conns.append(s)
            try:
                s.sendall(wire.REQ_HDR.pack(wire.MAX_BODY - 1, Op.STAT, 1))
                for _ in range(24):  # 24 MiB of a frame that never completes
                    s.sendall(chunk)
            except OSError:
                pass  # refused or cut off by the worker: what a cap does
        hello(addrs["unix"])
        # what the kernel still holds reaches the worker soon: wait (bounded) for the
        # growth a missing cap would show, so that a pass means a cap and not a race
        try:
            wait_for(lambda: rss_bytes(pid) - rss0 >= 64 * MiB, 5, "RSS growth")
        except AssertionError:
            pass
        grown = rss_bytes(pid) - rss0
    finally:
        for s in conns:
            s.close()
    figures.record(
        "6 connections each sending 24 MiB of a 64 MiB frame",
        6,
        "worker RSS grows by less than 64 MiB",
        int(grown >= 64 * MiB),
        rss_growth_mib=round(grown / MiB, 1),
    )
    assert grown < 64 * MiB

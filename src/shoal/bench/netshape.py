"""The "remote" link: a network namespace joined to this one by a veth pair, with
tbf shaping both directions, and a userspace delay proxy on 127.0.0.1 in front.

Addresses come from 198.18.0.0/15 (reserved for benchmarking), one /30 per run chosen
from the pid, and exist only on the veth pair this run creates; nothing binds
0.0.0.0. ``close()`` removes the namespace (and so both veth ends) and stops the proxy.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _tc(*args: str) -> None:
    subprocess.run(["tc", *args], check=True, capture_output=True)


def netns_available() -> bool:
    if os.geteuid() != 0:
        return False
    name = f"sbprobe{os.getpid() % 100000}"
    try:
        _ip("netns", "add", name)
    except (OSError, subprocess.CalledProcessError):
        return False
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("netns", "del", name)
    return True


@dataclass
class Link:
    """A namespace ``ns`` reachable at ``remote_ip`` from this namespace."""

    tag: str = field(default_factory=lambda: str(os.getpid() % 100000))
    ns: str = ""
    host_if: str = ""
    ns_if: str = ""
    host_ip: str = ""
    remote_ip: str = ""
    rate_mbit: float | None = None

    def __post_init__(self) -> None:
        self.ns = f"shoalbench{self.tag}"
        self.host_if = f"sbh{self.tag}"
        self.ns_if = f"sbn{self.tag}"
        n = int(self.tag) % 16000
        a, b = 18 + (n * 4) // 65536, ((n * 4) // 256) % 256
        base = (n * 4) % 256
        self.host_ip = f"198.{a}.{b}.{base + 1}"
        self.remote_ip = f"198.{a}.{b}.{base + 2}"

    def open(self) -> Link:
        self.close()  # a leftover from a crashed run with the same pid
        _ip("netns", "add", self.ns)
        try:
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.ns)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("-n", self.ns, "addr", "add", f"{self.remote_ip}/30", "dev", self.ns_if)
            _ip("-n", self.ns, "link", "set", self.ns_if, "up")
            _ip("-n", self.ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def shape(self, rate_mbit: float | None) -> None:
        """Cap both directions at ``rate_mbit`` with tbf (None: no qdisc at all)."""
        for args in (["dev", self.host_if], ["-n", self.ns, "dev", self.ns_if]):
            pre = args[:2] if args[0] == "-n" else []
            dev = args[-2:]
            with contextlib.suppress(subprocess.CalledProcessError):
                _tc(*pre, "qdisc", "del", *dev, "root")
            if rate_mbit:
                # burst: enough for the rate at 1 kHz timer ticks, never below 1 MiB
                burst = max(int(rate_mbit * 1e6 / 8 / 250), 1 << 20)
                _tc(
                    *pre,
                    "qdisc",
                    "add",
                    *dev,
                    "root",
                    "tbf",
                    "rate",
                    f"{rate_mbit}mbit",
                    "burst",
                    str(burst),
                    "latency",
                    "50ms",
                )
        self.rate_mbit = rate_mbit

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            _ip("netns", "del", self.ns)
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            _ip("link", "del", self.host_if)

    def popen(self, argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        """Start a process inside the namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], **kw)  # type: ignore[call-overload]


class DelayProxy:
    """``python -m shoal.bench.delayproxy`` as a child process."""

    def __init__(self, upstream: str, delay_ms: float) -> None:
        self.upstream, self.delay_ms = upstream, delay_ms
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint = ""
        self.control = ""  # HOST:PORT that answers the byte counts

    def start(self) -> DelayProxy:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shoal.bench.delayproxy",
                "--upstream",
                self.upstream,
                "--delay-ms",
                str(self.delay_ms),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError("delay proxy did not start")
        self.endpoint = line
        ctl = self.proc.stdout.readline().strip()
        if not ctl.startswith("control "):
            self.stop()
            raise RuntimeError("delay proxy did not start its control listener")
        self.control = ctl.split(" ", 1)[1]
        return self

    def carried(self) -> tuple[int, int]:
        """Bytes carried so far: (to the store, from the store), headers included."""
        host, port = self.control.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            data = b""
            while chunk := s.recv(64):
                data += chunk
        up, down = data.split()
        return int(up), int(down)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None


# -- measuring the link itself ------------------------------------------------------

_SINK = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0)); s.listen(8); print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    mode = c.recv(1)
    if mode == b"p":  # ping: echo one byte per request until closed
        while (b := c.recv(1)):
            c.sendall(b)
    else:  # bulk: send for the requested seconds with 1 MiB writes
        secs = float(c.recv(16).decode()); buf = b"x" * (1 << 20)
        import time; end = time.monotonic() + secs
        try:
            while time.monotonic() < end:
                c.sendall(buf)
        except OSError:
            pass
    c.close()
"""


class Sink:
    """A bulk sender / echo server inside the namespace, to measure the raw link."""

    def __init__(self, link: Link) -> None:
        self.proc = link.popen(
            [sys.executable, "-c", _SINK, link.remote_ip],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.addr = f"{link.remote_ip}:{self.port}"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _connect(endpoint: str) -> socket.socket:
    host, port = endpoint.replace("http://", "").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def bulk_mb_per_s(endpoint: str, seconds: float = 2.0) -> float:
    """Receive for ``seconds`` from the sink (directly or through a proxy): MB/s."""
    with _connect(endpoint) as s:
        s.sendall(b"b" + f"{seconds:<15}".encode())
        n, t0 = 0, time.perf_counter()
        buf = bytearray(1 << 20)
        while (k := s.recv_into(buf)) > 0:
            n += k
        return n / (time.perf_counter() - t0) / 1e6


def rtt_ms(endpoint: str, rounds: int = 50) -> float:
    """Median round-trip of a one-byte request (directly or through a proxy)."""
    with _connect(endpoint) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"p")
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            s.sendall(b"x")
            s.recv(1)
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        return times[len(times) // 2]


def measure_link(
    link: Link, rate_mbit: float | None, delay_ms: float, seconds: float = 2.0,
    every_path: bool = True,
) -> list[dict[str, object]]:  # fmt: skip
    """The evidence that the shaper is not the bottleneck: raw TCP over the bare veth,
    over tbf, and over tbf + the delay proxy, each as MB/s and RTT. Not ``every_path``:
    only the last, the path every remote read takes (a smoke check that it carries)."""
    rows: list[dict[str, object]] = []
    paths: list[tuple[str, float | None, float, bool]] = [
        ("veth, no qdisc, no proxy", None, 0.0, False),
        ("veth + delay proxy at 0 ms", None, 0.0, True),
        (f"veth + tbf {rate_mbit} mbit", rate_mbit, 0.0, False),
        (f"veth + tbf {rate_mbit} mbit + proxy {delay_ms} ms/dir", rate_mbit, delay_ms, True),
    ]
    sink = Sink(link)
    try:
        for label, rate, delay, via_proxy in paths if every_path else paths[-1:]:
            link.shape(rate)
            proxy = DelayProxy(sink.addr, delay).start() if via_proxy else None
            try:
                ep = proxy.endpoint if proxy else f"http://{sink.addr}"
                mbs = bulk_mb_per_s(ep, seconds)
                rtt = rtt_ms(ep)
            finally:
                if proxy:
                    proxy.stop()
            rows.append(
                {
                    "path": label,
                    "mb_per_s": round(mbs, 1),
                    "rtt_ms": round(rtt, 3),
                    "configured_mb_per_s": (rate * 1e6 / 8 / 1e6) if rate else None,
                }
            )
    finally:
        sink.close()
        link.shape(None)
    return rows

"""Several hosts on one machine: a small shoal cluster whose master, workers, clients
and S3 store each live in their own Linux network namespace.

The hosts are joined by veth pairs on a bridge that lives in a "switch" namespace of
its own, so nothing is added to the machine's own network (the root namespace sees no
new interface, route or address) and traffic only ever goes between these namespaces.
Each host has its own address on a private subnet (``10.213.0.0/24`` by default), its
own node identity (so the short circuit applies only on the worker's own host) and its
own cache directory; every process binds only to its host's address. A worker host's
or the master host's "cable" can be pulled (its switch port set down) and bandwidth
capped with ``tbf`` (there is no netem in this kernel).

Needs root and ``ip netns`` (:func:`unavailable` says why not). Typical use::

    with multihost(tmp_path, workers=3, clients=1) as mh:
        c = mh.agent("client0")                # a reader process on the client host
        c.call("connect", master=mh.master_url)
        c.call("read", paths=["/ds/data/a.bin"])   # {path: [size, sha256]}
        with mh.net.cut("worker1"):            # worker1's link down, up again after
            ...

Clean-up: namespaces are named ``shoalnet-<pid>-<token>-<host>``; leaving the context
(also on an exception), interpreter exit and SIGTERM kill whatever runs inside them
and delete them, which removes their veth ends and the bridge. A run that died harder
(SIGKILL) leaves namespaces whose pid is gone: the next run sweeps them first.

The pure part (names, addresses, the ``ip`` commands) is :func:`plan` and
:class:`NetPlan` (:mod:`shoal.testing.netplan`); :class:`Network` carries it out, :class:`MultiHost` runs moto, the
master, the workers and reader agents (``python -m shoal.testing.netns agent``, one
JSON request and one JSON answer per line: :mod:`shoal.testing.netagent`) on it. The
names of both modules are importable from here too.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from shoal.testing.cluster import S3_ENV, TestCluster
from shoal.testing.netagent import AgentError, HostAgent, agent_main, expected
from shoal.testing.netplan import (
    BRIDGE,
    DEFAULT_SUBNET,
    HOST_IF,
    NS_PREFIX,
    STORE_PORT,
    HostPlan,
    NetPlan,
    parse_listeners,
    parse_metrics,
    parse_netns,
    plan,
    stale,
)

__all__ = [
    "BRIDGE",
    "DEFAULT_SUBNET",
    "HOST_IF",
    "NS_PREFIX",
    "STORE_PORT",
    "AgentError",
    "HostAgent",
    "HostPlan",
    "MultiHost",
    "NetPlan",
    "NetnsCluster",
    "Network",
    "agent_main",
    "expected",
    "list_namespaces",
    "multihost",
    "parse_listeners",
    "parse_metrics",
    "parse_netns",
    "plan",
    "remove_namespace",
    "stale",
    "sweep_stale",
    "unavailable",
]


# -- carrying it out ----------------------------------------------------------------


def unavailable() -> str | None:
    """Why this machine cannot run namespaced hosts (None: it can)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "ss"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: iproute2)"
    probe = f"{NS_PREFIX}{os.getpid()}-0-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` fails here: {r.stderr.strip() or r.returncode}"
    try:
        r = subprocess.run(["ip", "netns", "exec", probe, "true"], capture_output=True, text=True)
        if r.returncode != 0:
            return f"`ip netns exec` fails here: {r.stderr.strip() or r.returncode}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip() or f'exit {r.returncode}'}")


def list_namespaces() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    # lines are "NAME" or "NAME (id: N)"
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_namespace(name: str) -> None:
    """Kill what runs in a namespace of this harness's, then delete it (its veth ends
    go with it). Best effort and idempotent."""
    if parse_netns(name) is None:
        raise ValueError(f"not a namespace of this harness: {name!r}")
    for _ in range(3):
        r = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        pids = [int(p) for p in r.stdout.split() if p.isdigit()]
        if not pids:
            break
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
            time.sleep(0.02)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def sweep_stale() -> list[str]:
    """Remove namespaces left by runs of this harness whose process is gone."""
    names = stale(list_namespaces(), _pid_alive)
    for n in names:
        remove_namespace(n)
    return names


#: networks that are up in this process, for the exit and signal clean-up
_LIVE: set[Network] = set()
#: re-entrant: the SIGTERM handler takes it on the thread that may be holding it
_LIVE_LOCK = threading.RLock()
_PREV_SIGTERM: Any = None


def _cleanup_live() -> None:
    with _LIVE_LOCK:
        nets = list(_LIVE)
    for n in nets:
        n.down()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _cleanup_live()
    # then die of the signal as before (or hand it to the handler that was there)
    prev = _PREV_SIGTERM
    if callable(prev):
        prev(signum, frame)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


atexit.register(_cleanup_live)


def _watch_sigterm() -> None:
    global _PREV_SIGTERM
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm or current is signal.SIG_IGN:
        return
    _PREV_SIGTERM = current
    signal.signal(signal.SIGTERM, _on_sigterm)


class Network:
    """The namespaces, bridge and veth pairs of a :class:`NetPlan`."""

    def __init__(self, plan: NetPlan) -> None:
        self.plan = plan
        self._up = False

    def up(self) -> Network:
        sweep_stale()
        with _LIVE_LOCK:
            _LIVE.add(self)
        _watch_sigterm()
        self._up = True
        try:
            for cmd in self.plan.setup_commands():
                _ip(cmd)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Delete every namespace of the plan (what runs there is killed first)."""
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if not self._up:
            return
        self._up = False
        have = set(list_namespaces())
        # hosts first: their veth ends take the switch ports with them
        for name in [*(h.netns for h in self.plan.hosts), self.plan.switch]:
            if name in have:
                remove_namespace(name)

    def __enter__(self) -> Network:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def set_link(self, host: str, up: bool) -> None:
        _ip(self.plan.link_command(host, up))

    @contextlib.contextmanager
    def cut(self, host: str) -> Iterator[None]:
        """``host`` off the network (its switch port down) for the ``with`` body."""
        self.set_link(host, False)
        try:
            yield
        finally:
            self.set_link(host, True)

    def set_rate(self, host: str, rate: str | None) -> None:
        for cmd in self.plan.rate_commands(host, rate):
            if rate is None:
                subprocess.run(cmd, capture_output=True)  # no cap set: nothing to lift
            else:
                _ip(cmd)

    def listeners(self, host: str) -> list[str]:
        """Addresses TCP sockets listen on inside ``host``."""
        r = subprocess.run(
            self.plan.exec_argv(host, ["ss", "-Hltn"]), capture_output=True, text=True, timeout=30
        )
        return parse_listeners(r.stdout)


# -- the cluster --------------------------------------------------------------------


@dataclass
class NetnsCluster(TestCluster):
    """A TestCluster whose master and workers run each in its own host of ``net``: the
    master host's address for the master, worker host ``worker<i>``'s for worker ``i``,
    with that host's node identity."""

    __test__ = False

    net: Network | None = None
    #: the agent the harness uses for its own HTTP checks (the ring)
    ctl: HostAgent | None = None
    #: extra flags by role ("master", "worker"), e.g. ``--tls-cert F --tls-key F``
    role_args: dict[str, list[str]] = field(default_factory=dict)

    def _host_of(self, name: str) -> str:
        return name.replace("-", "") if name.startswith("worker-") else name

    def command(self, name: str, args: list[str]) -> list[str]:
        assert self.net is not None
        host = self._host_of(name)
        h = self.net.plan.host(host)
        argv = super().command(name, args)
        if h.role == "worker":
            argv += ["--host", h.addr, "--node", h.node]  # the last --host wins
        if args and args[0] in ("master", "worker"):
            argv += self.role_args.get(args[0], [])
        return self.net.plan.exec_argv(host, argv)

    def wait_ring(self, n: int, timeout: float = 30.0) -> None:
        """Until the ring has ``n`` workers, asked from inside the network."""
        assert self.ctl is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = self.ctl.call("get", url=self.master_url + "/api/v1/ring", timeout=2.0)
                if r["status"] == 200 and len(json.loads(r["body"])["workers"]) == n:
                    return
            except AgentError:
                pass  # the master is not reachable (yet, or from there): ask again
            if time.monotonic() > deadline:
                raise TimeoutError(f"{n} workers did not join the ring within {timeout:.0f}s")
            time.sleep(0.1)

    def worker_address(self, i: int) -> dict[str, Any]:
        out: dict[str, Any] = json.loads((self.worker_dir(i) / "worker.json").read_text())
        return out


@dataclass
class MultiHost:
    """A running namespaced cluster: network, S3 store, master, workers, agents."""

    dir: Path
    net: Network
    cluster: NetnsCluster
    store_endpoint: str = ""
    store: subprocess.Popen[bytes] | None = None
    agents: dict[str, HostAgent] = field(default_factory=dict)

    @property
    def plan(self) -> NetPlan:
        return self.net.plan

    @property
    def master_url(self) -> str:
        return self.cluster.master_url

    def agent(self, host: str) -> HostAgent:
        """The agent process on ``host`` (started on first use)."""
        a = self.agents.get(host)
        if a is None or a.proc.poll() is not None:
            a = self.agents[host] = HostAgent(
                self.net, host, self.dir / f"agent-{host}.log", dict(S3_ENV)
            )
        return a

    def start(self, ctl_host: str) -> MultiHost:
        self.net.up()
        self._start_store(ctl_host)
        self.cluster.ctl = self.agent(ctl_host)
        self.cluster.start()
        return self

    def _start_store(self, ctl_host: str) -> None:
        h = self.plan.host("store")
        log = open(self.dir / "store.log", "ab")  # noqa: SIM115 -- the child holds it
        with log:
            self.store = subprocess.Popen(
                self.plan.exec_argv(
                    "store",
                    [sys.executable, "-m", "moto.server", "-H", h.addr, "-p", str(STORE_PORT)],
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.store_endpoint = f"http://{h.addr}:{STORE_PORT}"
        # reachable from a client host: the store answers across the switch
        self.agent(ctl_host).call(
            "wait_get", url=self.store_endpoint + "/moto-api/", timeout=60.0, wait=90.0
        )

    def stop(self) -> None:
        # links back up first, so processes that talk on their way out do not hang
        for h in self.plan.hosts:
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                self.net.set_link(h.name, True)
        try:
            for a in self.agents.values():
                with contextlib.suppress(Exception):
                    a.close()
            self.agents.clear()
            with contextlib.suppress(Exception):
                self.cluster.stop()
            if self.store is not None:
                from shoal.testing.s3 import stop_moto

                with contextlib.suppress(Exception):
                    stop_moto(self.store)
                self.store = None
        finally:
            self.net.down()

    def worker_metrics(self, i: int, via: str) -> list[tuple[str, dict[str, str], float]]:
        """Worker ``i``'s /metrics samples, scraped from host ``via``."""
        addr = self.cluster.worker_address(i)
        url = f"http://{addr['host']}:{addr['metrics_port']}/metrics"
        r = self.agent(via).call("get", url=url)
        return parse_metrics(r["body"])

    def worker_stats(self, i: int, dataset: str, via: str) -> dict[str, float]:
        """Worker ``i``'s figures for ``dataset``: cached_files, cached_bytes and
        bytes read by source (local, remote, ufs)."""
        out = {"cached_files": 0.0, "cached_bytes": 0.0, "local": 0.0, "remote": 0.0, "ufs": 0.0}
        for name, labels, value in self.worker_metrics(i, via):
            if labels.get("dataset") != dataset:
                continue
            if name == "shoal_cached_files":
                out["cached_files"] = value
            elif name == "shoal_cached_bytes":
                out["cached_bytes"] = value
            elif name == "shoal_read_bytes_total":
                out[labels["source"]] = value
        return out


@contextlib.contextmanager
def multihost(
    dir: Path,
    workers: int = 3,
    clients: int = 1,
    subnet: str = DEFAULT_SUBNET,
    **cluster_kw: Any,
) -> Iterator[MultiHost]:
    """A master host, a store host, ``workers`` worker hosts and ``clients`` client
    hosts, with moto, the master and a worker per worker host running; everything is
    stopped and every namespace deleted on the way out, also on an error."""
    net = Network(plan(workers, clients, subnet))
    dir.mkdir(parents=True, exist_ok=True)
    cluster = NetnsCluster(
        dir,
        workers=workers,
        env=dict(S3_ENV),
        host=net.plan.host("master").addr,
        net=net,
        **cluster_kw,
    )
    mh = MultiHost(dir, net, cluster)
    # the harness asks from a client host (else the master host): never from the root
    # namespace, which has no way into the network by design
    ctl = "client0" if clients else "master"
    try:
        mh.start(ctl)
        yield mh
    finally:
        mh.stop()


if __name__ == "__main__":
    if sys.argv[1:] == ["agent"]:
        agent_main()
    else:
        sys.exit("usage: python -m shoal.testing.netns agent")

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
:class:`NetPlan`; :class:`Network` carries it out, :class:`MultiHost` runs moto, the
master, the workers and reader agents (``python -m shoal.testing.netns agent``, one
JSON request and one JSON answer per line) on it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import ipaddress
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from shoal.testing.cluster import S3_ENV, TestCluster

#: every namespace this harness makes starts with this
NS_PREFIX = "shoalnet-"
_NS_RE = re.compile(r"^shoalnet-(\d+)-([0-9a-f]+)-([a-z][a-z0-9]*)$")
#: the subnet the test hosts use unless told otherwise (private; never routed anywhere)
DEFAULT_SUBNET = "10.213.0.0/24"
#: interface names inside the namespaces (each namespace has its own name space, so
#: these never meet the machine's own interfaces)
HOST_IF = "eth0"
BRIDGE = "br0"
#: moto's port in the store host: the namespace is fresh, so nothing else holds it
STORE_PORT = 5000
#: Linux interface names are at most 15 bytes
_IFNAMSIZ = 15


# -- the plan (pure) ----------------------------------------------------------------


@dataclass(frozen=True)
class HostPlan:
    #: "master", "store", "worker<i>" or "client<j>"
    name: str
    role: str
    netns: str
    addr: str
    #: the switch-side end of this host's veth pair (inside the switch namespace)
    port: str
    #: node identity (``--node`` / ``SHOAL_NODE``)
    node: str


@dataclass(frozen=True)
class NetPlan:
    token: str
    pid: int
    subnet: str
    switch: str
    hosts: tuple[HostPlan, ...]

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    def host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} in this plan ({', '.join(self.names())})")

    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def workers(self) -> list[HostPlan]:
        return [h for h in self.hosts if h.role == "worker"]

    def namespaces(self) -> list[str]:
        return [self.switch, *(h.netns for h in self.hosts)]

    def setup_commands(self) -> list[list[str]]:
        """``ip`` commands that build the network, in order. Every one names its
        namespaces (``ip netns add``, ``ip -n NS``, or a veth pair created straight
        into two namespaces): none touches the root namespace's network."""
        sw = self.switch
        cmds = [
            ["ip", "netns", "add", sw],
            ["ip", "-n", sw, "link", "add", BRIDGE, "type", "bridge"],
            ["ip", "-n", sw, "link", "set", BRIDGE, "up"],
        ]
        for h in self.hosts:
            cmds += [
                ["ip", "netns", "add", h.netns],
                ["ip", "-n", h.netns, "link", "set", "lo", "up"],
                # created in both namespaces at once: no end ever exists in the root one
                [
                    *("ip", "link", "add", HOST_IF, "netns", h.netns, "type", "veth"),
                    *("peer", "name", h.port, "netns", sw),
                ],
                ["ip", "-n", sw, "link", "set", h.port, "master", BRIDGE],
                ["ip", "-n", sw, "link", "set", h.port, "up"],
                ["ip", "-n", h.netns, "addr", "add", f"{h.addr}/{self.prefixlen}", "dev", HOST_IF],
                ["ip", "-n", h.netns, "link", "set", HOST_IF, "up"],
            ]
        return cmds

    def link_command(self, host: str, up: bool) -> list[str]:
        """Pull (or plug back) a host's cable: its port on the switch down (or up)."""
        return [
            "ip",
            "-n",
            self.switch,
            "link",
            "set",
            self.host(host).port,
            "up" if up else "down",
        ]

    def rate_commands(self, host: str, rate: str | None) -> list[list[str]]:
        """Cap a host's link at ``rate`` (tc syntax, e.g. ``"1gbit"``) both ways with tbf:
        its own egress and its switch port's (what it receives); None lifts the cap."""
        h = self.host(host)
        ends = [("-n", h.netns, HOST_IF), ("-n", self.switch, h.port)]
        if rate is None:
            return [["tc", n, ns, "qdisc", "del", "dev", dev, "root"] for n, ns, dev in ends]
        # burst: at least one MTU, and enough for a timer tick at high rates
        tbf = ["tbf", "rate", rate, "burst", "1mbit", "latency", "50ms"]
        return [["tc", n, ns, "qdisc", "replace", "dev", dev, "root", *tbf] for n, ns, dev in ends]

    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run inside a host's namespace (``ip netns exec`` execs it in place,
        so the process id is the program's own)."""
        return ["ip", "netns", "exec", self.host(host).netns, *argv]


def _check_subnet(subnet: str, needed: int) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(subnet)
    except ValueError as exc:
        raise ValueError(f"subnet {subnet!r}: {exc}") from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise ValueError(f"subnet {subnet}: IPv4 only")
    if not net.is_private or net.is_loopback or net.is_link_local or net.is_multicast:
        raise ValueError(f"subnet {subnet}: use a private range (10/8, 172.16/12, 192.168/16)")
    if net.num_addresses - 2 < needed:
        raise ValueError(f"subnet {subnet}: {needed} hosts do not fit")
    return net


def plan(
    workers: int = 3,
    clients: int = 1,
    subnet: str = DEFAULT_SUBNET,
    token: str | None = None,
    pid: int | None = None,
) -> NetPlan:
    """Names and addresses for a master host, a store host (moto), ``workers`` worker
    hosts and ``clients`` client hosts, in that order from the subnet's first host
    address. ``token`` (random by default) and ``pid`` (this process's) make the
    namespace names unique per run."""
    if workers < 1 or clients < 0:
        raise ValueError(f"need at least one worker and no negative clients ({workers}, {clients})")
    token = token or secrets.token_hex(3)
    if not re.fullmatch(r"[0-9a-f]{1,8}", token):
        raise ValueError(f"token {token!r}: 1-8 lowercase hex digits")
    pid = os.getpid() if pid is None else pid
    roles = [("master", "master"), ("store", "store")]
    roles += [(f"worker{i}", "worker") for i in range(workers)]
    roles += [(f"client{j}", "client") for j in range(clients)]
    net = _check_subnet(subnet, len(roles))
    addrs = net.hosts()
    hosts = []
    for name, role in roles:
        port = f"p-{name}"
        if len(port) > _IFNAMSIZ:
            raise ValueError(f"too many hosts: interface name {port} is over {_IFNAMSIZ} bytes")
        hosts.append(
            HostPlan(
                name=name,
                role=role,
                netns=f"{NS_PREFIX}{pid}-{token}-{name}",
                addr=str(next(addrs)),
                port=port,
                node=f"{name}.{token}",
            )
        )
    return NetPlan(token, pid, str(net), f"{NS_PREFIX}{pid}-{token}-switch", tuple(hosts))


def parse_netns(name: str) -> tuple[int, str, str] | None:
    """(pid, token, host) of a namespace this harness named; None for any other."""
    m = _NS_RE.match(name)
    return (int(m[1]), m[2], m[3]) if m else None


def stale(names: list[str], alive: Callable[[int], bool]) -> list[str]:
    """The harness's namespaces among ``names`` whose creating process is gone."""
    out = []
    for n in names:
        parsed = parse_netns(n)
        if parsed is not None and not alive(parsed[0]):
            out.append(n)
    return out


def parse_listeners(ss_output: str) -> list[str]:
    """Local addresses (without ports) of the listening sockets in ``ss -Hltn`` output."""
    out = []
    for line in ss_output.splitlines():
        cols = line.split()
        if len(cols) >= 4:
            out.append(cols[3].rsplit(":", 1)[0].strip("[]"))
    return out


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample in Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)", line)
        if m is None:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m[2] or ""))
        out.append((m[1], labels, float(m[3])))
    return out


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


# -- agents: processes in a host that do what the test asks -------------------------


class AgentError(RuntimeError):
    pass


class HostAgent:
    """A Python process inside a host's namespace answering JSON requests (see
    :func:`agent_main`); ``call(op, **args)`` returns its result or raises."""

    def __init__(self, net: Network, host: str, log: Path, env: dict[str, str]) -> None:
        self.host = host
        h = net.plan.host(host)
        full = dict(os.environ)
        full.update(env)
        full["SHOAL_NODE"] = h.node  # the client's own node: short circuit on this host only
        full.pop("SHOAL_MASTER", None)
        self._log = open(log, "ab")  # noqa: SIM115 -- closed in close()
        self.proc = subprocess.Popen(
            net.plan.exec_argv(host, [sys.executable, "-m", "shoal.testing.netns", "agent"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=full,
            start_new_session=True,
        )
        self._buf = b""

    def call(self, op: str, *, wait: float = 120.0, **args: Any) -> Any:
        """Ask for ``op``; raise AgentError when it fails or no answer comes in ``wait``
        seconds (the op's own arguments, ``timeout`` among them, go to the agent)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, "args": args}).encode() + b"\n")
        self.proc.stdin.flush()
        reply = json.loads(self._line(wait))
        if not reply["ok"]:
            raise AgentError(f"{self.host}: {op}: {reply['error']}")
        return reply["result"]

    def _line(self, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AgentError(f"{self.host}: no answer within {timeout:.0f}s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise AgentError(f"{self.host}: the agent exited ({self.proc.poll()})")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # EOF: the agent closes its client and exits
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _digest(data: bytes) -> list[Any]:
    return [len(data), hashlib.sha256(data).hexdigest()]


def expected(files: dict[str, bytes], dataset: str, mount: str = "data") -> dict[str, list[Any]]:
    """What the agent's ``read`` answers for byte-exact reads of ``files``."""
    return {f"/{dataset}/{mount}/{k}": _digest(v) for k, v in files.items()}


class _AgentState:
    """What an agent holds between requests: its client."""

    def __init__(self) -> None:
        self.client: Any = None

    def op_connect(self, master: str, **settings: Any) -> dict[str, Any]:
        from shoal.client import Client
        from shoal.config import ClientSettings

        self.close()
        self.client = Client(settings=ClientSettings(master=master, **settings))
        return {"node": self.client.settings.node}

    def op_seed(self, endpoint: str, bucket: str, spec: list[dict[str, Any]]) -> dict[str, int]:
        from shoal.testing.cluster import sample_files
        from shoal.testing.s3 import make_bucket

        files: dict[str, bytes] = {}
        for s in spec:
            files.update(sample_files(**s))
        make_bucket(endpoint, bucket, files)
        return {"files": len(files), "bytes": sum(map(len, files.values()))}

    def op_create_dataset(
        self, name: str, bucket: str, endpoint: str, options: dict[str, str] | None = None
    ) -> dict[str, Any]:
        from shoal.core.types import Mount

        mount = Mount("data", f"s3://{bucket}", {"endpoint_url": endpoint})
        ds = self.client.create_dataset(name, [mount], options)
        return {"name": ds.name}

    def op_read(self, paths: list[str], how: str = "cat") -> dict[str, Any]:
        out: dict[str, Any] = {}
        if how == "cat_many":
            for p, v in self.client.cat_many(paths).items():
                out[p] = _digest(v) if isinstance(v, bytes) else f"error: {v!r}"
            return out
        for p in paths:
            try:
                out[p] = _digest(self.client.cat(p))
            except Exception as exc:  # a failed read is an answer, not the agent's end
                out[p] = f"error: {exc!r}"
        return out

    def op_counters(self) -> dict[str, int]:
        return dict(self.client.counters())

    def op_load(self, dataset: str, timeout: float = 60.0) -> dict[str, Any]:
        job = self.client.submit_job({"kind": "load", "dataset": dataset, "paths": [""]})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            view: dict[str, Any] = self.client.job(job["id"])
            if view["state"] in ("done", "failed", "stopped"):
                return view
            time.sleep(0.1)
        raise TimeoutError(f"load of {dataset} not done within {timeout:.0f}s")

    def op_get(self, url: str, timeout: float = 5.0) -> dict[str, Any]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return {"status": r.status, "body": r.read().decode()}
        except urllib.error.HTTPError as exc:
            return {"status": exc.code, "body": exc.read().decode(errors="replace")}

    def op_wait_get(self, url: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.op_get(url, timeout=1.0)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def agent_main() -> None:
    """Answer one JSON request per stdin line on stdout until EOF."""
    # replies go to the original stdout; anything else printed goes to stderr (the log)
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    state = _AgentState()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            fn = getattr(state, "op_" + req["op"])
            reply = {"ok": True, "result": fn(**req.get("args", {}))}
        except Exception as exc:  # the test reads the error; the agent serves on
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
    state.close()


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

    def _host_of(self, name: str) -> str:
        return name.replace("-", "") if name.startswith("worker-") else name

    def command(self, name: str, args: list[str]) -> list[str]:
        assert self.net is not None
        host = self._host_of(name)
        h = self.net.plan.host(host)
        argv = super().command(name, args)
        if h.role == "worker":
            argv += ["--host", h.addr, "--node", h.node]  # the last --host wins
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

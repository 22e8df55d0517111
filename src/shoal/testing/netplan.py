"""The multi-host harness's plan (pure): namespace names, addresses, the ``ip``
commands, and the parsers of what the hosts report. :mod:`shoal.testing.netns`
carries it out (and re-exports these names).
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

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

"""The pure part of the namespaced-hosts harness: names, addresses and the ``ip``/``tc``
commands it would run (nothing is run here)."""

from __future__ import annotations

import ipaddress

import pytest

from shoal.testing import netns


def test_plan_names_and_addresses() -> None:
    p = netns.plan(workers=3, clients=2, token="ab12cd", pid=4242)
    assert p.names() == ["master", "store", "worker0", "worker1", "worker2", "client0", "client1"]
    net = ipaddress.ip_network(p.subnet)
    addrs = [ipaddress.ip_address(h.addr) for h in p.hosts]
    assert len(set(addrs)) == len(addrs)
    assert all(a in net and a not in (net.network_address, net.broadcast_address) for a in addrs)
    assert [h.addr for h in p.hosts][:3] == ["10.213.0.1", "10.213.0.2", "10.213.0.3"]
    # node identities differ per host: the short circuit applies on one host only
    assert len({h.node for h in p.hosts}) == len(p.hosts)
    assert [h.name for h in p.workers()] == ["worker0", "worker1", "worker2"]
    assert p.host("client1").role == "client"
    with pytest.raises(KeyError, match="no host"):
        p.host("worker3")


def test_namespace_names_are_per_run_and_parse_back() -> None:
    a = netns.plan(token="aaaaaa", pid=10)
    b = netns.plan(token="bbbbbb", pid=10)
    assert not set(a.namespaces()) & set(b.namespaces())
    assert len(set(a.namespaces())) == len(a.namespaces())
    for name in a.namespaces():
        assert name.startswith(netns.NS_PREFIX)
        pid, token, _host = netns.parse_netns(name) or (0, "", "")
        assert (pid, token) == (10, "aaaaaa")
    assert netns.parse_netns("some-other-namespace") is None
    assert netns.parse_netns("shoalnet-12-xyz-master") is None  # not hex
    # random tokens by default: two plans of one process do not collide
    assert netns.plan().token != netns.plan().token


def test_interface_names_fit_linux() -> None:
    p = netns.plan(workers=20, clients=9)
    assert all(len(h.port) <= 15 for h in p.hosts)
    assert len({h.port for h in p.hosts}) == len(p.hosts)


def test_setup_never_touches_the_root_namespace() -> None:
    p = netns.plan(workers=2, clients=1, token="0f0f", pid=7)
    ours = set(p.namespaces())
    cmds = p.setup_commands()
    assert cmds[0] == ["ip", "netns", "add", p.switch]
    for cmd in cmds:
        assert cmd[0] == "ip"
        if cmd[1] == "netns":
            assert cmd[2] == "add" and cmd[3] in ours
        elif cmd[1] == "-n":
            assert cmd[2] in ours
        else:  # a veth pair, made straight into a host namespace and the switch
            assert cmd[1:3] == ["link", "add"], cmd
            targets = [cmd[i + 1] for i, word in enumerate(cmd) if word == "netns"]
            assert len(targets) == 2 and set(targets) <= ours
            assert p.switch in targets
    # every host: its own namespace, an address on the subnet, a port on the bridge
    for h in p.hosts:
        assert ["ip", "netns", "add", h.netns] in cmds
        assert ["ip", "-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", "eth0"] in cmds
        assert ["ip", "-n", p.switch, "link", "set", h.port, "master", "br0"] in cmds


def test_link_and_rate_commands() -> None:
    p = netns.plan(token="1", pid=1)
    w = p.host("worker1")
    assert p.link_command("worker1", False) == ["ip", "-n", p.switch, "link", "set", w.port, "down"]
    assert p.link_command("worker1", True)[-1] == "up"
    cap = p.rate_commands("worker1", "1gbit")
    assert [c[:3] for c in cap] == [["tc", "-n", w.netns], ["tc", "-n", p.switch]]
    assert all("tbf" in c and "1gbit" in c for c in cap)
    assert all(c[3:5] == ["qdisc", "del"] for c in p.rate_commands("worker1", None))
    assert p.exec_argv("client0", ["true"]) == [
        "ip",
        "netns",
        "exec",
        p.host("client0").netns,
        "true",
    ]


@pytest.mark.parametrize(
    "subnet", ["8.8.8.0/24", "127.0.0.0/24", "169.254.0.0/24", "fd00::/64", "10.0.0.0/30", "x"]
)
def test_only_private_subnets_that_fit(subnet: str) -> None:
    with pytest.raises(ValueError, match="subnet"):
        netns.plan(workers=3, clients=1, subnet=subnet)


def test_bad_sizes_and_tokens() -> None:
    with pytest.raises(ValueError):
        netns.plan(workers=0)
    with pytest.raises(ValueError):
        netns.plan(clients=-1)
    with pytest.raises(ValueError, match="token"):
        netns.plan(token="not hex")


def test_stale_namespaces() -> None:
    names = ["shoalnet-10-ab-master", "shoalnet-11-cd-switch", "other", "shoalnet-10-ab-store"]
    assert netns.stale(names, lambda pid: pid == 11) == [names[0], names[3]]
    assert netns.stale(names, lambda pid: True) == []


def test_parse_listeners_and_metrics() -> None:
    ss = (
        "LISTEN 0 4096 10.213.0.3:41001 0.0.0.0:*\n"
        "LISTEN 0 128 [::]:22 [::]:*\n"
        "LISTEN 0 100 127.0.0.1:5000 0.0.0.0:*\n"
    )
    assert netns.parse_listeners(ss) == ["10.213.0.3", "::", "127.0.0.1"]
    text = (
        "# HELP shoal_cached_files Files cached\n"
        'shoal_cached_files{dataset="ds"} 12.0\n'
        'shoal_read_bytes_total{dataset="ds",source="remote"} 1.5e+06\n'
        "shoal_ufs_requests_total 3.0\n"
    )
    assert netns.parse_metrics(text) == [
        ("shoal_cached_files", {"dataset": "ds"}, 12.0),
        ("shoal_read_bytes_total", {"dataset": "ds", "source": "remote"}, 1.5e6),
        ("shoal_ufs_requests_total", {}, 3.0),
    ]


def test_expected_digests() -> None:
    want = netns.expected({"a/b.bin": b"xyz"}, "ds")
    assert list(want) == ["/ds/data/a/b.bin"]
    assert want["/ds/data/a/b.bin"][0] == 3

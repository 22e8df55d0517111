"""The CSI node plugin without mounts: the mount table parser, the state file, request
validation, the endpoint, and the command line the Helm chart runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import grpc
import pytest
import yaml

from shoal.cli.csi import register
from shoal.csi import mounts
from shoal.csi.node import CsiError, NodePlugin, NodeSettings
from shoal.csi.proto import csi_pb2
from shoal.csi.server import socket_path
from shoal.csi.state import Published, VolumeState
from shoal.errors import InvalidArgument

ROOT = Path(__file__).resolve().parents[2]

MOUNTINFO = """\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
90 27 0:50 / /var/lib/shoal/mnt ro,nosuid,nodev,noatime shared:40 - fuse.shoal shoal ro,user_id=0
95 27 0:50 /ds /var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/ds/mount ro,nosuid,nodev - fuse.shoal shoal ro
120 95 0:61 /ds /var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/ds/mount ro,nosuid,nodev - fuse.shoal shoal ro
96 27 0:50 /with\\040space /tmp/a\\040b rw - fuse.shoal shoal rw
"""
TARGET = "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/ds/mount"


def table(tmp_path: Path) -> list[mounts.MountEntry]:
    f = tmp_path / "mountinfo"
    f.write_text(MOUNTINFO)
    return mounts.read_mountinfo(str(f))


def test_mountinfo_fields_and_escapes(tmp_path: Path) -> None:
    t = table(tmp_path)
    fuse = mounts.top_at("/var/lib/shoal/mnt", t)
    assert fuse is not None and mounts.is_fuse(fuse) and fuse.read_only and fuse.root == "/"
    odd = mounts.top_at("/tmp/a b", t)
    assert odd is not None and odd.root == "/with space" and not odd.read_only
    assert not mounts.is_fuse(t[0])
    assert mounts.top_at("/nowhere", t) is None


def test_stacked_mounts_are_ordered_bottom_first(tmp_path: Path) -> None:
    t = table(tmp_path)
    stack = mounts.stack_at(TARGET, t)
    assert [m.mount_id for m in stack] == [95, 120]
    # the order of the lines does not matter, the parent links do
    assert [m.mount_id for m in mounts.stack_at(TARGET, list(reversed(t)))] == [95, 120]
    assert mounts.top_at(TARGET, t).mount_id == 120  # type: ignore[union-attr]


def test_state_round_trip(tmp_path: Path) -> None:
    s = VolumeState(str(tmp_path / "state"))
    s.load()  # no file yet: empty
    assert s.volumes == {}
    s.put(Published("ds", "/pods/a/mount", "ds"))
    s.put(Published("ds/x", "/pods/b/mount", "ds", "x"))
    again = VolumeState(str(tmp_path / "state"))
    again.load()
    assert again.volumes == s.volumes
    assert again.get("/pods/b/mount").rel_source == "ds/x"  # type: ignore[union-attr]
    again.drop("/pods/a/mount")
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["volumes.json"]
    (tmp_path / "state" / "volumes.json").write_text(json.dumps({"version": 99}))
    future = VolumeState(str(tmp_path / "state"))
    future.load()  # an unknown version is ignored, not misread
    assert future.volumes == {}


def plugin(tmp_path: Path) -> NodePlugin:
    (tmp_path / "mnt").mkdir(exist_ok=True)
    (tmp_path / "pods").mkdir(exist_ok=True)
    return NodePlugin(
        NodeSettings(
            mount_root=str(tmp_path / "mnt"),
            state_dir=str(tmp_path / "state"),
            node_id="n1",
            allowed_target_roots=(str(tmp_path / "pods"),),
        )
    )


CAP = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(),
    access_mode=csi_pb2.VolumeCapability.AccessMode(
        mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_READER_ONLY
    ),
)


def req(target: str, **kw: object) -> csi_pb2.NodePublishVolumeRequest:
    args: dict[str, object] = {"volume_id": "ds", "target_path": target, "volume_capability": CAP}
    args.update(kw)
    return csi_pb2.NodePublishVolumeRequest(**args)  # type: ignore[arg-type]


def test_request_validation(tmp_path: Path) -> None:
    p = plugin(tmp_path)
    pods = tmp_path / "pods"
    ok = p._request(req(str(pods / "a" / "mount/"), volume_context={"subPath": "./m//d/"}))
    assert ok == Published("ds", str(pods / "a" / "mount"), "ds", "m/d")
    assert p._request(req(str(pods / "b"), volume_context={"dataset": "imagenet"})).dataset == (
        "imagenet"
    )
    (pods / "link").symlink_to(tmp_path)
    for bad in (
        req(str(pods / "link")),  # mount(2) would follow it outside the root
        req(""),
        req("relative/mount"),
        req(str(pods)),  # the root itself is no pod's target
        req(str(tmp_path / "podsX" / "a")),  # a sibling that shares the prefix
        req(str(pods / "a"), volume_id=""),
        req(str(pods / "a"), volume_capability=None),
        req(str(pods / "a"), volume_context={"dataset": ".."}),
        req(str(pods / "a"), volume_context={"subPath": "/abs"}),
        req(str(pods / "a"), volume_context={"subPath": "a/../../b"}),
    ):
        with pytest.raises(CsiError) as e:
            p._request(bad)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, bad


def test_publish_needs_a_live_fuse_mount(tmp_path: Path) -> None:
    p = plugin(tmp_path)  # mount_root is a plain directory
    assert not p.fuse_alive()
    with pytest.raises(CsiError) as e:
        p.publish(req(str(tmp_path / "pods" / "a")))
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert not (tmp_path / "pods" / "a").exists()
    assert p.repair() == 0


def test_settings_are_validated(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        NodeSettings(mount_root="mnt", state_dir="s", node_id="n")
    with pytest.raises(InvalidArgument):
        NodeSettings(mount_root="/mnt", state_dir="s", node_id="")
    with pytest.raises(InvalidArgument):
        NodeSettings(mount_root="/mnt", state_dir="s", node_id="n", allowed_target_roots=("x",))
    with pytest.raises(InvalidArgument):
        NodeSettings(mount_root="/mnt", state_dir="s", node_id="n", fuse_timeout=0)


def test_endpoint() -> None:
    assert socket_path("unix:///csi/csi.sock") == "/csi/csi.sock"
    assert socket_path("/csi/csi.sock") == "/csi/csi.sock"
    for bad in ("tcp://127.0.0.1:1", "unix://relative.sock", "csi.sock"):
        with pytest.raises(InvalidArgument):
            socket_path(bad)


def test_the_charts_command_line_parses() -> None:
    """What deploy/helm/shoal runs in the node DaemonSet's csi container."""
    values = yaml.safe_load((ROOT / "deploy/helm/shoal/values.yaml").read_text())
    n = values["node"]
    csi = n["csi"]
    assert csi["driverName"] == "csi.shoal.io"
    argv = [
        a.replace("{socket}", "/csi/csi.sock").replace("{mountRoot}", n["mountRoot"])
        for a in csi["command"][1:] + csi["args"]
    ]
    argv = [a.replace("$(NODE_NAME)", "node-1") for a in argv]
    assert csi["command"][0] == "shoal"
    parser = argparse.ArgumentParser(prog="shoal")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.handler.__name__ == "cmd_node"
    assert socket_path(args.endpoint) == "/csi/csi.sock"
    assert args.mount_root == n["mountRoot"] and args.node_id == "node-1"

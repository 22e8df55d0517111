"""The CSI node plugin for real: a cluster of real processes, a real FUSE mount, the
plugin as a subprocess on a Unix socket and a real gRPC client with the generated stubs.
Bind mounts are checked in /proc/self/mountinfo and read back byte-exact."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from shoal.core.types import Mount
from shoal.csi import mounts
from shoal.csi.proto import csi_pb2, csi_pb2_grpc
from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.fuse import Mounted, can_mount, mount_cli, mounted
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not can_mount(), reason="needs /dev/fuse and root"),
]

Mode = csi_pb2.VolumeCapability.AccessMode.Mode
READER = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(),
    access_mode=csi_pb2.VolumeCapability.AccessMode(mode=Mode.MULTI_NODE_READER_ONLY),
)


def h(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


class Plugin:
    """``python -m shoal.csi node`` as a subprocess, and stubs on its socket."""

    def __init__(self, sock: Path, mount_root: Path, state: Path, pods: Path) -> None:
        self.sock, self.mount_root, self.state, self.pods = sock, mount_root, state, pods
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: grpc.Channel | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shoal.csi", "node", f"--endpoint=unix://{self.sock}",
             f"--mount-root={self.mount_root}", f"--state-dir={self.state}",
             "--node-id=node-a", f"--allowed-target-root={self.pods}",
             "--repair-interval=0.1", "--fuse-timeout=1",
             "--topology=topology.shoal.io/node=node-a"],
        )  # fmt: skip
        self.channel = grpc.insecure_channel(f"unix://{self.sock}")
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)
        self.node = csi_pb2_grpc.NodeStub(self.channel)

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                assert self.proc.wait(timeout=10) == 0
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()

    def ready(self) -> bool:
        r = self.identity.Probe(csi_pb2.ProbeRequest(), timeout=10)
        return bool(r.HasField("ready") and r.ready.value)

    def publish(
        self,
        target: Path | str,
        dataset: str = "ds",
        *,
        volume_id: str | None = None,
        context: dict[str, str] | None = None,
        capability: csi_pb2.VolumeCapability = READER,
    ) -> None:
        req = csi_pb2.NodePublishVolumeRequest(
            volume_id=dataset if volume_id is None else volume_id,
            target_path=str(target),
            volume_capability=capability,
            readonly=True,
            volume_context={"dataset": dataset, **(context or {})},
        )
        self.node.NodePublishVolume(req, timeout=30)

    def unpublish(self, target: Path | str, volume_id: str = "ds") -> None:
        req = csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target))
        self.node.NodeUnpublishVolume(req, timeout=30)


def code_of(call: Callable[..., object], *args: object, **kw: object) -> grpc.StatusCode:
    """The status code of the gRPC error ``call`` must raise."""
    with pytest.raises(grpc.RpcError) as e:
        call(*args, **kw)
    code: grpc.StatusCode = e.value.code()
    return code


@dataclass
class World:
    cluster: TestCluster
    master: str
    base: Path
    files: dict[str, bytes]
    mnt: Mounted
    plugin: Plugin
    pods: Path


def cleanup_targets(pods: Path) -> None:
    """Never leave a bind mount behind, whatever a test did."""
    for m in reversed(mounts.read_mountinfo()):
        if m.point.startswith(str(pods) + "/"):
            mounts.umount_all(m.point)


@pytest.fixture(scope="module")
def world(
    moto: MotoServer, s3_credentials: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    base = tmp_path_factory.mktemp("csi")
    files = sample_files(40, 1, 100_000, seed=21)
    files["top.txt"] = b"hello from shoal\n"
    make_bucket(moto.endpoint, "csi-world", files)
    make_bucket(moto.endpoint, "csi-other", {"other.txt": b"another dataset"})
    cluster = start_cluster(base / "cluster", workers=1)
    pods = base / "pods"
    pods.mkdir()
    # the kubelet's directory is a shared mount on a node: what the plugin mounts under it
    # propagates into pods whose volume mount asks for HostToContainer
    subprocess.run(["mount", "--bind", str(pods), str(pods)], check=True)
    subprocess.run(["mount", "--make-shared", str(pods)], check=True)
    sockdir = Path(tempfile.mkdtemp(prefix="csi", dir="/tmp"))  # short: sun_path is 108 bytes
    try:
        with cluster.client() as c:
            ep = {"endpoint_url": moto.endpoint}
            c.create_dataset("ds", [Mount("data", "s3://csi-world", ep)])
            c.create_dataset("other", [Mount("o", "s3://csi-other", ep)])
        with mounted(cluster.master_url, base, watchdog_s=300) as m:
            plugin = Plugin(sockdir / "csi.sock", m.path, base / "csi-state", pods)
            plugin.start()
            try:
                yield World(cluster, cluster.master_url, base, files, m, plugin, pods)
            finally:
                plugin.stop()
                cleanup_targets(pods)
    finally:
        cleanup_targets(pods)
        mounts.umount_all(str(pods))
        shutil.rmtree(sockdir, ignore_errors=True)
        cluster.stop()


def target(w: World, pod: str, vol: str = "ds") -> Path:
    return w.pods / pod / "volumes/kubernetes.io~csi" / vol / "mount"


def assert_dataset_served(w: World, where: Path) -> None:
    assert os.listdir(where) == ["data"]
    for rel, data in w.files.items():
        assert h((where / "data" / rel).read_bytes()) == h(data), rel


def test_identity_and_node_info(world: World) -> None:
    p = world.plugin
    info = p.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=10)
    assert info.name == "csi.shoal.io" and info.vendor_version
    caps = p.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest(), timeout=10)
    assert list(caps.capabilities) == []
    assert p.ready()
    ni = p.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=10)
    assert ni.node_id == "node-a"
    assert dict(ni.accessible_topology.segments) == {"topology.shoal.io/node": "node-a"}
    nc = p.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest(), timeout=10)
    assert list(nc.capabilities) == []
    stage = csi_pb2.NodeStageVolumeRequest(volume_id="ds", staging_target_path="/x")
    assert code_of(p.node.NodeStageVolume, stage) == grpc.StatusCode.UNIMPLEMENTED


def test_publish_is_a_read_only_bind(world: World) -> None:
    t = target(world, "pod1")
    world.plugin.publish(t)
    top = mounts.top_at(str(t))
    assert top is not None, "target is not in /proc/self/mountinfo"
    assert top.fstype == "fuse.shoal" and top.root == "/ds" and top.read_only
    assert len(mounts.stack_at(str(t))) == 1
    assert_dataset_served(world, t)
    for write in (
        lambda: os.open(t / "data" / "new.bin", os.O_WRONLY | os.O_CREAT),
        lambda: os.mkdir(t / "newdir"),
        lambda: os.unlink(t / "data" / "top.txt"),
    ):
        with pytest.raises(OSError) as e:
            write()
        assert e.value.errno == errno.EROFS
    # the bind is read-only on its own: the FUSE mount's options are untouched
    fuse = mounts.top_at(str(world.mnt.path))
    assert fuse is not None and fuse.mount_id != top.mount_id


def test_publish_twice_is_ok_and_changes_nothing(world: World) -> None:
    t = target(world, "pod2")
    world.plugin.publish(t)
    before = mounts.stack_at(str(t))
    world.plugin.publish(t)
    assert mounts.stack_at(str(t)) == before
    # the same dataset at a second pod's target is a second, independent bind
    t3 = target(world, "pod3")
    world.plugin.publish(t3)
    assert (t3 / "data/top.txt").read_bytes() == b"hello from shoal\n"
    world.plugin.unpublish(t3)
    assert (t / "data/top.txt").read_bytes() == b"hello from shoal\n"


def test_same_target_other_volume_is_already_exists(world: World) -> None:
    t = target(world, "pod4")
    world.plugin.publish(t)
    c = code_of(world.plugin.publish, t, dataset="other")
    assert c == grpc.StatusCode.ALREADY_EXISTS
    top = mounts.top_at(str(t))
    assert top is not None and top.root == "/ds"
    # a target mounted by someone else is not taken over either
    foreign = target(world, "pod5")
    foreign.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(foreign)], check=True)
    try:
        assert code_of(world.plugin.publish, foreign) == grpc.StatusCode.ALREADY_EXISTS
    finally:
        mounts.umount_all(str(foreign))


def test_sub_path_of_a_dataset(world: World) -> None:
    t = target(world, "pod6")
    world.plugin.publish(t, volume_id="ds/data/000", context={"subPath": "data/000"})
    top = mounts.top_at(str(t))
    assert top is not None and top.root == "/ds/data/000"
    for rel, data in world.files.items():
        if rel.startswith("000/"):
            assert (t / rel[4:]).read_bytes() == data
    world.plugin.unpublish(t, "ds/data/000")
    # without a dataset attribute the volume id names the dataset
    t2 = target(world, "pod6b", "other")
    raw = csi_pb2.NodePublishVolumeRequest(
        volume_id="other", target_path=str(t2), volume_capability=READER
    )
    world.plugin.node.NodePublishVolume(raw, timeout=30)
    assert (t2 / "o/other.txt").read_bytes() == b"another dataset"
    world.plugin.unpublish(t2, "other")


def test_bad_requests(world: World) -> None:
    p, t = world.plugin, target(world, "bad")
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(p.publish, "pods/relative/mount") == invalid
    assert code_of(p.publish, t, capability=csi_pb2.VolumeCapability()) == invalid
    assert code_of(p.publish, t, volume_id="") == invalid
    none = csi_pb2.NodePublishVolumeRequest(volume_id="ds", target_path=str(t))
    assert code_of(p.node.NodePublishVolume, none) == invalid  # no capability at all
    block = csi_pb2.VolumeCapability(
        block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=READER.access_mode
    )
    assert code_of(p.publish, t, capability=block) == invalid
    writer = csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=Mode.SINGLE_NODE_WRITER),
    )
    assert code_of(p.publish, t, capability=writer) == invalid
    assert code_of(p.publish, world.base / "elsewhere" / "mount") == invalid
    assert code_of(p.publish, world.pods / ".." / "escape" / "mount") == invalid
    assert code_of(p.publish, t, dataset="a/b") == invalid
    assert code_of(p.publish, t, context={"subPath": "../other"}) == invalid
    assert code_of(p.publish, t, dataset="no-such-dataset") == grpc.StatusCode.NOT_FOUND
    assert code_of(p.publish, t, context={"subPath": "data/nope"}) == grpc.StatusCode.NOT_FOUND
    assert code_of(p.unpublish, world.base / "elsewhere") == invalid
    assert code_of(p.unpublish, t, volume_id="") == invalid
    assert not t.exists()  # no refused request left a directory or a mount
    assert mounts.top_at(str(t)) is None


def test_unpublish_and_idempotency(world: World) -> None:
    t = target(world, "pod7")
    world.plugin.publish(t)
    assert mounts.top_at(str(t)) is not None
    world.plugin.unpublish(t)
    assert mounts.top_at(str(t)) is None, "still in /proc/self/mountinfo"
    assert not t.exists()
    world.plugin.unpublish(t)  # again: OK
    world.plugin.unpublish(target(world, "never-published"))  # a missing path: OK
    # and it can be published again at the same target
    world.plugin.publish(t)
    assert (t / "data/top.txt").read_bytes() == b"hello from shoal\n"
    world.plugin.unpublish(t)
    assert not t.exists()


POD = """
import hashlib, os, subprocess, sys
target, pod, propagation = sys.argv[1:4]
os.makedirs(pod, exist_ok=True)
subprocess.run(["mount", "--rbind", target, pod], check=True)
subprocess.run(["mount", "--make-r" + propagation, pod], check=True)
print("ready", flush=True)
for line in sys.stdin:
    try:
        with open(os.path.join(pod, line.strip()), "rb") as f:
            print("ok", hashlib.sha256(f.read()).hexdigest(), flush=True)
    except OSError as e:
        print("err", e.errno, flush=True)
"""


class Pod:
    """A process in its own mount namespace that sees a published target the way a
    container does: bound at another path, with the volume mount's propagation
    (``slave``: Kubernetes' HostToContainer; ``private``: its default, None)."""

    def __init__(self, target: Path, where: Path, propagation: str) -> None:
        self.proc = subprocess.Popen(
            ["unshare", "--mount", f"--propagation={propagation}", sys.executable, "-c", POD,
             str(target), str(where / "data"), propagation],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"

    def read(self, rel: str) -> str:
        """``ok <sha256>`` or ``err <errno>``: what the pod reads at its volume."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(rel + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def wait_for(pred: Callable[[], bool], deadline_s: float, what: str) -> float:
    """Poll ``pred`` until true; the seconds it took."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > deadline_s:
            raise AssertionError(f"{what}: not within {deadline_s} s")
        time.sleep(0.02)
    return time.monotonic() - t0


def read_errno(path: Path) -> int:
    try:
        path.read_bytes()
    except OSError as e:
        return e.errno or 0
    return 0


def test_a_hung_fuse_daemon_does_not_hang_the_plugin(world: World) -> None:
    p, w = world.plugin, world
    t = target(w, "pod8")
    p.publish(t)
    pid = w.mnt.state["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        # a lookup the kernel cannot answer from its caches waits for the daemon
        fresh = target(w, "pod8b")
        c = code_of(p.publish, fresh, context={"subPath": f"data/never-{time.time_ns()}"})
        assert c == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - t0 < 5  # --fuse-timeout=1
        t1 = time.monotonic()
        p.unpublish(t)  # needs nothing from the daemon, and no check blocks it
        assert time.monotonic() - t1 < 3
        assert mounts.top_at(str(t)) is None and not t.exists()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert p.ready()


def test_fuse_restart_repairs_published_volumes(world: World) -> None:
    """Runs last in this module: it kills the node's FUSE mount and mounts a new one."""
    p, w = world.plugin, world
    t = target(w, "pod9")
    p.publish(t)
    want = "ok " + h(w.files["top.txt"])
    pods = [Pod(t, w.base / f"pod-{prop}", prop) for prop in ("slave", "private")]
    try:
        follows, private = pods
        assert follows.read("data/top.txt") == want == private.read("data/top.txt")
        # the FUSE daemon dies: the bind mount (and every pod's copy) is a dead endpoint
        killed = time.monotonic()
        os.kill(w.mnt.state["pid"], signal.SIGKILL)
        wait_for(lambda: read_errno(t / "data/top.txt") != 0, 10, "reads fail")
        assert read_errno(t / "data/top.txt") == errno.ENOTCONN
        assert follows.read("data/top.txt") == f"err {errno.ENOTCONN}"
        wait_for(lambda: not p.ready(), 10, "Probe says not ready")
        assert code_of(p.publish, target(w, "pod10")) == grpc.StatusCode.UNAVAILABLE
        # a new mount at the same root (the FUSE container restarting: `shoal mount`
        # clears the dead mount first), then the plugin repairs the bind mounts
        r = mount_cli("mount", str(w.mnt.path), "--master", w.master, "--metrics-port", "0",
                      "--state-dir", str(w.mnt.state_dir))  # fmt: skip
        assert r.returncode == 0, r.stderr
        remounted = time.monotonic()
        gap = wait_for(lambda: read_errno(t / "data/top.txt") == 0, 20, "target serves again")
        print(f"\nCSI repair: {gap:.3f} s after the new FUSE mount, "
              f"{time.monotonic() - killed:.3f} s after the kill (remount took "
              f"{remounted - killed:.3f} s)")  # fmt: skip
        assert_dataset_served(w, t)
        assert p.ready()
        stack = mounts.stack_at(str(t))
        assert len(stack) == 2 and stack[-1].root == "/ds" and stack[-1].read_only
        # HostToContainer: the repair reaches the pod; None: the pod keeps the dead mount
        # until it is restarted
        assert follows.read("data/top.txt") == want
        assert follows.read("data/" + next(iter(w.files))) == "ok " + h(
            next(iter(w.files.values()))
        )
        assert private.read("data/top.txt") == f"err {errno.ENOTCONN}"
    finally:
        for pod in pods:
            pod.close()
    # unpublish removes the dead layer too
    p.unpublish(t)
    assert mounts.stack_at(str(t)) == [] and not t.exists()


def test_plugin_restart_keeps_volumes(world: World) -> None:
    p, t = world.plugin, target(world, "pod11")
    p.publish(t)
    p.stop()
    assert (t / "data/top.txt").read_bytes() == b"hello from shoal\n"  # pods keep reading
    p.start()
    assert p.ready()
    p.publish(t)  # the record survived: the same publish is still OK, no second bind
    assert len(mounts.stack_at(str(t))) == 1
    assert code_of(p.publish, t, dataset="other") == grpc.StatusCode.ALREADY_EXISTS
    # a plugin that lost its record recognises its own bind from the mount table
    p.stop()
    (p.state / "volumes.json").unlink()
    p.start()
    p.publish(t)
    assert len(mounts.stack_at(str(t))) == 1
    assert code_of(p.publish, t, dataset="other") == grpc.StatusCode.ALREADY_EXISTS
    p.unpublish(t)
    assert mounts.top_at(str(t)) is None and not t.exists()

"""What the node plugin does, apart from gRPC: validate a publish request, bind-mount
``<mount root>/<dataset>[/<subPath>]`` read-only at the pod's target path, undo it, and
repair the bind mounts after the node's FUSE mount died and came back.

Every method takes the plugin's one lock: the CO may retry a call while the first is
still running (CSI "concurrency"), and the repair loop must not race a publish.
Errors are :class:`CsiError` with the gRPC status code the CSI spec asks for.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from shoal.csi import mounts
from shoal.csi.proto import csi_pb2
from shoal.csi.state import Published, VolumeState

log = logging.getLogger("shoal.csi.node")

DRIVER_NAME = "csi.shoal.io"
DEFAULT_TARGET_ROOTS = ("/var/lib/kubelet/pods",)
_Mode = csi_pb2.VolumeCapability.AccessMode
READER_MODES = frozenset({_Mode.SINGLE_NODE_READER_ONLY, _Mode.MULTI_NODE_READER_ONLY})


class CsiError(Exception):
    """A request the plugin refuses, with the gRPC status code it answers with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class NodeSettings:
    #: the node's shoal FUSE mount (``shoal mount``): datasets are its top directories
    mount_root: str
    #: where the record of published volumes is kept
    state_dir: str
    #: this node's name (Kubernetes: spec.nodeName), returned by NodeGetInfo
    node_id: str
    #: target paths must lie under one of these (the kubelet's pods directory)
    allowed_target_roots: tuple[str, ...] = DEFAULT_TARGET_ROOTS
    #: the CSIDriver name (GetPluginInfo)
    driver_name: str = DRIVER_NAME
    #: NodeGetInfo's accessible topology (empty: none)
    topology: dict[str, str] = field(default_factory=dict)
    #: seconds a stat in the FUSE mount may take before the mount counts as not answering
    fuse_timeout: float = 5.0

    def __post_init__(self) -> None:
        from shoal.errors import InvalidArgument

        if not os.path.isabs(self.mount_root):
            raise InvalidArgument(f"--mount-root must be an absolute path: {self.mount_root}")
        if not self.node_id:
            raise InvalidArgument("--node-id must not be empty")
        if not self.fuse_timeout > 0:
            raise InvalidArgument(f"--fuse-timeout must be positive, got {self.fuse_timeout}")
        for root in self.allowed_target_roots:
            if not os.path.isabs(root):
                raise InvalidArgument(f"--allowed-target-root must be absolute: {root}")


def _normal_target(target: str) -> str:
    """The target as the mount table names it: parent resolved, no trailing slash."""
    target = os.path.normpath(target)
    parent, name = os.path.split(target)
    return os.path.join(os.path.realpath(parent), name)


def _name(what: str, value: str) -> str:
    if not value or value in (".", "..") or "/" in value or "\0" in value:
        raise _invalid(f"invalid {what} {value!r}: one path component is required")
    return value


def _sub_path(value: str) -> str:
    if not value:
        return ""
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if value.startswith("/") or ".." in parts or "\0" in value:
        raise _invalid(f"invalid subPath {value!r}: a relative path inside the dataset")
    return "/".join(parts)


class _PendingStat:
    """One os.stat on a daemon thread of its own, and its outcome."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.done = threading.Event()
        self.outcome: os.stat_result | OSError | None = None

    def start(self, finished: Callable[[], None]) -> None:
        def run() -> None:
            try:
                self.outcome = os.stat(self.path)
            except OSError as exc:
                self.outcome = exc
            finished()
            self.done.set()

        threading.Thread(target=run, name="csi-stat", daemon=True).start()

    def result(self, timeout: float) -> os.stat_result:
        if not self.done.wait(timeout):
            raise TimeoutError(errno.ETIMEDOUT, f"stat {self.path}: no answer in {timeout} s")
        if isinstance(self.outcome, OSError):
            raise self.outcome
        assert self.outcome is not None
        return self.outcome


class NodePlugin:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.mount_root = os.path.realpath(settings.mount_root)
        self.roots = tuple(os.path.realpath(r) for r in settings.allowed_target_roots)
        self.state = VolumeState(settings.state_dir)
        self.state.load()
        self.lock = threading.Lock()
        #: repairs done since start (bind mounts re-made over a dead FUSE connection)
        self.repairs = 0
        self._pending: dict[str, _PendingStat] = {}
        #: targets whose last repair failed (logged once, not at every pass)
        self._failing: set[str] = set()
        self._pending_lock = threading.Lock()

    def _stat(self, path: str) -> os.stat_result:
        """os.stat, or TimeoutError when the file system does not answer in time.

        A FUSE daemon that hangs (alive, not answering) blocks a stat for as long as it
        hangs: the stat runs on a daemon thread of its own, so a hung one costs that
        thread and ``fuse_timeout`` of the caller's time, and never blocks the plugin's exit.
        A path with a stat still pending is not stat'ed again: callers wait on the
        pending one, so a long hang leaves one thread per path, not one per check.
        """
        with self._pending_lock:
            pending = self._pending.get(path)
            if pending is None:
                pending = self._pending[path] = _PendingStat(path)
                pending.start(lambda: self._stat_done(path))
        return pending.result(self.settings.fuse_timeout)

    def _stat_done(self, path: str) -> None:
        with self._pending_lock:
            self._pending.pop(path, None)

    # -- the node's FUSE mount ------------------------------------------------------

    def fuse_alive(self) -> bool:
        """Whether the node's shoal mount is mounted and answers (a getattr of its root)."""
        top = mounts.top_at(self.mount_root)
        if top is None or not mounts.is_fuse(top):
            return False
        try:
            self._stat(self.mount_root)
        except OSError:
            return False
        return True

    # -- publish ----------------------------------------------------------------------

    def _check_target(self, target: str) -> str:
        if not target:
            raise _invalid("target_path is required")
        if not os.path.isabs(target):
            raise _invalid(f"target_path must be absolute: {target!r}")
        norm = _normal_target(target)
        if not any(os.path.commonpath([norm, r]) == r and norm != r for r in self.roots):
            raise _invalid(f"target_path {target} is outside the allowed roots {list(self.roots)}")
        if os.path.islink(norm):  # mount(2) would follow it out of the allowed roots
            raise _invalid(f"target_path {target} is a symbolic link")
        return norm

    def _request(self, req: csi_pb2.NodePublishVolumeRequest) -> Published:
        if not req.volume_id:
            raise _invalid("volume_id is required")
        target = self._check_target(req.target_path)
        if not req.HasField("volume_capability"):
            raise _invalid("volume_capability is required")
        cap = req.volume_capability
        if cap.HasField("block"):
            raise _invalid("block access is not supported: shoal volumes are file systems")
        if not cap.HasField("mount"):
            raise _invalid("volume_capability needs the mount access type")
        if cap.access_mode.mode not in READER_MODES:
            mode = _Mode.Mode.Name(cap.access_mode.mode)
            raise _invalid(f"access mode {mode} is not supported: shoal volumes are read-only")
        ctx = req.volume_context
        dataset = _name("dataset", ctx.get("dataset") or req.volume_id)
        return Published(req.volume_id, target, dataset, _sub_path(ctx.get("subPath", "")))

    def publish(self, req: csi_pb2.NodePublishVolumeRequest) -> None:
        want = self._request(req)
        with self.lock:
            if not self.fuse_alive():
                raise CsiError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the node's shoal mount at {self.mount_root} is not serving",
                )
            source = os.path.join(self.mount_root, want.rel_source)
            try:
                st = self._stat(source)
            except FileNotFoundError:
                raise CsiError(
                    grpc.StatusCode.NOT_FOUND,
                    f"dataset path {want.rel_source!r} not found in the node's shoal mount",
                ) from None
            except OSError as exc:
                raise CsiError(
                    grpc.StatusCode.UNAVAILABLE, f"stat {source}: {exc.strerror}"
                ) from None
            if not stat.S_ISDIR(st.st_mode):
                raise CsiError(
                    grpc.StatusCode.FAILED_PRECONDITION, f"{want.rel_source!r} is not a directory"
                )
            self._publish_locked(want, source)

    def _publish_locked(self, want: Published, source: str) -> None:
        have = self.state.get(want.target)
        top = mounts.top_at(want.target)
        if have is not None and have != want:
            raise CsiError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"{want.target} is published for volume {have.volume_id} "
                f"(dataset path {have.rel_source!r})",
            )
        if have is None and top is not None:
            if not (mounts.is_fuse(top) and top.root == "/" + want.rel_source):
                raise CsiError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"{want.target} is already a mount point ({top.fstype} {top.root})",
                )
            log.info("adopting the existing bind mount at %s", want.target)
        if self._fresh(want):
            self.state.put(want)  # published already: the same answer again (idempotent)
            return
        if top is None:  # over a (dead) mount the directory is there, but stat fails
            os.makedirs(want.target, exist_ok=True)
        try:
            mounts.bind_read_only(source, want.target)
        except OSError as exc:
            raise CsiError(grpc.StatusCode.INTERNAL, str(exc)) from None
        self.state.put(want)
        log.info(
            "published %s (dataset path %s) at %s", want.volume_id, want.rel_source, want.target
        )

    def _fresh(self, p: Published) -> bool:
        """Whether the mount a lookup of ``p.target`` lands on is a read-only bind of
        ``p``'s directory of the FUSE mount now at the mount root (from the mount table
        alone: nothing here waits for the FUSE daemon)."""
        table = mounts.read_mountinfo()
        top, fuse = mounts.top_at(p.target, table), mounts.top_at(self.mount_root, table)
        return (
            top is not None
            and fuse is not None
            and top.dev == fuse.dev
            and top.root == "/" + p.rel_source
            and top.read_only
        )

    # -- unpublish --------------------------------------------------------------------

    def unpublish(self, req: csi_pb2.NodeUnpublishVolumeRequest) -> None:
        if not req.volume_id:
            raise _invalid("volume_id is required")
        target = self._check_target(req.target_path)
        with self.lock:
            have = self.state.get(target)
            if have is not None and have.volume_id != req.volume_id:
                log.warning(
                    "unpublishing %s for volume %s, recorded for volume %s",
                    target,
                    req.volume_id,
                    have.volume_id,
                )
            n = 0
            try:
                n = mounts.umount_all(target)
                os.rmdir(target)
            except FileNotFoundError:
                pass  # not there (any more): unpublished already, which is OK (idempotent)
            except NotADirectoryError:
                os.unlink(target)
            except OSError as exc:
                raise CsiError(grpc.StatusCode.INTERNAL, str(exc)) from None
            self.state.drop(target)
            log.info("unpublished %s from %s (%d mounts removed)", req.volume_id, target, n)

    # -- repair -------------------------------------------------------------------------

    def repair(self) -> int:
        """Bind every published target again whose mount no longer serves the live FUSE
        mount (it died and a new one took its place). Returns the number repaired.

        The new bind is stacked on the stale one rather than replacing it: a pod whose
        volume mount has HostToContainer propagation receives a mount made *on* the
        target, while an unmount and a fresh mount at the target would never reach it.
        The stale layers go when the volume is unpublished.

        The checks read the mount table only (a stat in a hung FUSE mount would wait
        for it) and the lock is taken only to re-bind.
        """
        if not self.fuse_alive():
            return 0
        done = 0
        for p in list(self.state.volumes.values()):
            if self._fresh(p):
                continue
            with self.lock:
                if self.state.get(p.target) != p or self._fresh(p):
                    continue  # unpublished, or published anew, meanwhile
                done += self._rebind(p)
        self.repairs += done
        return done

    def _rebind(self, p: Published) -> int:
        source = os.path.join(self.mount_root, p.rel_source)
        if mounts.top_at(p.target) is None and not os.path.lexists(p.target):
            log.info("forgetting %s: the target directory is gone", p.target)
            self.state.drop(p.target)
            return 0
        try:
            mounts.bind_read_only(source, p.target)
        except OSError as exc:
            level = logging.DEBUG if p.target in self._failing else logging.WARNING
            log.log(level, "repairing %s failed: %s", p.target, exc)
            self._failing.add(p.target)
            return 0
        self._failing.discard(p.target)
        log.warning("repaired %s: bound %s again over a dead mount", p.target, source)
        return 1

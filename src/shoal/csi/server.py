"""The CSI node plugin as a gRPC server on a Unix socket: the Identity and Node
services over :class:`~shoal.csi.node.NodePlugin`, and the loop that repairs bind
mounts after the node's FUSE mount was remounted."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any, TypeVar

import grpc
from google.protobuf import wrappers_pb2

from shoal import __version__
from shoal.csi.node import CsiError, NodePlugin, NodeSettings
from shoal.csi.proto import csi_pb2, csi_pb2_grpc

log = logging.getLogger("shoal.csi.server")

Resp = TypeVar("Resp")


def _answer(context: grpc.ServicerContext, call: Callable[[], Resp]) -> Resp:
    """Run ``call``; a CsiError becomes its status code, anything else INTERNAL."""
    try:
        return call()
    except CsiError as exc:
        context.abort(exc.code, exc.message)
    except Exception as exc:
        log.exception("internal error")
        context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
    raise AssertionError("unreachable: abort raises")


class Identity(csi_pb2_grpc.IdentityServicer):
    def __init__(self, plugin: NodePlugin) -> None:
        self.plugin = plugin

    def GetPluginInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return csi_pb2.GetPluginInfoResponse(
            name=self.plugin.settings.driver_name, vendor_version=__version__
        )

    def GetPluginCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        # a node-only plugin: no controller service, no topology constraints
        return csi_pb2.GetPluginCapabilitiesResponse()

    def Probe(self, request: Any, context: grpc.ServicerContext) -> Any:
        ready = self.plugin.fuse_alive()
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=ready))


class Node(csi_pb2_grpc.NodeServicer):
    def __init__(self, plugin: NodePlugin) -> None:
        self.plugin = plugin

    def NodePublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        def call() -> Any:
            self.plugin.publish(request)
            return csi_pb2.NodePublishVolumeResponse()

        return _answer(context, call)

    def NodeUnpublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        def call() -> Any:
            self.plugin.unpublish(request)
            return csi_pb2.NodeUnpublishVolumeResponse()

        return _answer(context, call)

    def NodeGetCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        # no STAGE_UNSTAGE_VOLUME: there is nothing to stage, a publish is one bind mount
        return csi_pb2.NodeGetCapabilitiesResponse()

    def NodeGetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        s = self.plugin.settings
        topology = csi_pb2.Topology(segments=s.topology) if s.topology else None
        return csi_pb2.NodeGetInfoResponse(node_id=s.node_id, accessible_topology=topology)

    # none of these is advertised in NodeGetCapabilities; a CO that calls one anyway
    # gets UNIMPLEMENTED (without the generated servicer's logged traceback)
    def NodeStageVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        _unimplemented(context, "NodeStageVolume")

    def NodeUnstageVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        _unimplemented(context, "NodeUnstageVolume")

    def NodeGetVolumeStats(self, request: Any, context: grpc.ServicerContext) -> Any:
        _unimplemented(context, "NodeGetVolumeStats")

    def NodeExpandVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        _unimplemented(context, "NodeExpandVolume")


def _unimplemented(context: grpc.ServicerContext, method: str) -> None:
    context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not supported by shoal's plugin")


def socket_path(endpoint: str) -> str:
    """``unix:///csi/csi.sock`` (or a bare path) -> ``/csi/csi.sock``."""
    from shoal.errors import InvalidArgument

    if endpoint.startswith("unix://"):
        path = endpoint[len("unix://") :]
    elif "://" in endpoint:
        raise InvalidArgument(f"--endpoint must be unix://PATH, got {endpoint}")
    else:
        path = endpoint
    if not os.path.isabs(path):
        raise InvalidArgument(f"--endpoint needs an absolute socket path, got {endpoint}")
    return path


class NodeServer:
    """The gRPC server and the repair loop: ``start``, then ``stop``."""

    def __init__(self, settings: NodeSettings, socket: str, repair_interval: float = 1.0) -> None:
        self.plugin = NodePlugin(settings)
        self.socket = socket
        self.repair_interval = repair_interval
        self._stop = threading.Event()
        self._server: grpc.Server | None = None
        self._loop: threading.Thread | None = None

    def start(self) -> None:
        os.makedirs(os.path.dirname(self.socket), exist_ok=True)
        if os.path.exists(self.socket):
            os.unlink(self.socket)  # left by a plugin that died: the kubelet dials this path
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        csi_pb2_grpc.add_IdentityServicer_to_server(Identity(self.plugin), server)
        csi_pb2_grpc.add_NodeServicer_to_server(Node(self.plugin), server)
        server.add_insecure_port(f"unix://{self.socket}")
        # a plugin restarted while its FUSE mount was away repairs before it serves
        self.plugin.repair()
        server.start()
        self._server = server
        self._loop = threading.Thread(target=self._repair_loop, name="csi-repair", daemon=True)
        self._loop.start()
        log.info(
            "CSI node plugin %s serving on %s (mount root %s, node %s)",
            self.plugin.settings.driver_name,
            self.socket,
            self.plugin.mount_root,
            self.plugin.settings.node_id,
        )

    def _repair_loop(self) -> None:
        while not self._stop.wait(self.repair_interval):
            try:
                self.plugin.repair()
            except Exception:
                log.exception("repair pass failed")

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.stop(grace=2).wait()
        if self._loop is not None:
            self._loop.join(timeout=5)


def serve(settings: NodeSettings, socket: str, repair_interval: float = 1.0) -> int:
    """Run until SIGTERM or SIGINT. Bind mounts stay: pods keep their volumes while the
    plugin restarts, and the next plugin finds them in its state file."""
    # the signals are blocked before any thread starts (threads inherit the mask) and
    # taken with sigwait: no handler runs at a random point of the main thread, where
    # setting an Event could deadlock on a lock that thread holds
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    server = NodeServer(settings, socket, repair_interval)
    server.start()
    got = signal.sigwait(signals)
    log.info("stopping on %s", signal.Signals(got).name)
    server.stop()
    return 0

"""A mount's life: check the master, mount(2), answer INIT, serve until unmounted or
SIGTERM, and clean up; detach into the background; find and unmount a mount again,
also after its daemon crashed (a lazy unmount leaves no dead endpoint behind).

Each mount keeps ``<state_dir>/<name>.json`` (pid, mount point, metrics port) and
``<name>.log`` where ``<name>`` is derived from the mount point.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shoal.client.aio import AsyncClient
from shoal.config import ClientSettings, shoal_home
from shoal.errors import InvalidArgument, ShoalError, Unavailable, from_code
from shoal.fuse import kernel
from shoal.fuse.daemon import MAX_READ, Daemon, Metrics
from shoal.fuse.ops import FileSystem
from shoal.fuse.watch import Watcher

log = logging.getLogger("shoal.fuse.service")

Notify = Callable[[str | None], None]


@dataclass(frozen=True)
class MountOptions:
    mountpoint: str
    master: str
    #: datasets to show at the top level (empty: every dataset)
    datasets: tuple[str, ...] = ()
    #: serve files complete on the local worker by kernel passthrough
    passthrough: bool = True
    #: let the kernel open files without asking the daemon (fastest for many small
    #: files; turns passthrough off)
    kernel_open: bool = False
    #: port for /metrics (None: no metrics server; 0: any free port)
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: kernel readahead of the mount in KiB
    readahead_kb: int = 8192
    #: where pid, state and log files of mounts live
    state_dir: str = field(default_factory=lambda: str(default_state_dir()))
    #: seconds before a worker request is abandoned and the next owner tried
    request_timeout: float = 10.0


def default_state_dir() -> Path:
    return shoal_home() / "mounts"


def state_base(state_dir: str, mountpoint: str) -> Path:
    mp = os.path.abspath(mountpoint)
    tag = hashlib.sha1(mp.encode()).hexdigest()[:8]
    slug = mp.strip("/").replace("/", "_")[-60:] or "root"
    return Path(state_dir) / f"{slug}-{tag}"


def read_state(state_dir: str, mountpoint: str) -> dict[str, Any] | None:
    try:
        data = json.loads(state_base(state_dir, mountpoint).with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _prepare_mountpoint(mp: str) -> None:
    if kernel.is_mounted(mp):
        try:
            os.stat(mp)
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                raise
            log.info("clearing a dead mount at %s", mp)
            kernel.umount(mp, lazy=True)
        else:
            raise InvalidArgument(f"{mp} is already a shoal mount: `shoal umount {mp}` first")
    if not os.path.isdir(mp):
        raise InvalidArgument(f"mount point {mp} is not a directory")


def _mount_dev(mp: str) -> tuple[int, int] | None:
    """major:minor of the file system mounted at ``mp`` (without a stat through it)."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            if fields[4].encode().decode("unicode_escape") == mp and fields[-3] == kernel.FSTYPE:
                major, minor = fields[2].split(":")
                return int(major), int(minor)
    return None


def _set_readahead(mp: str, kib: int) -> None:
    dev = _mount_dev(mp)
    if dev is None:
        return
    try:
        Path(f"/sys/class/bdi/{dev[0]}:{dev[1]}/read_ahead_kb").write_text(str(kib))
    except OSError as exc:
        log.info("could not raise readahead: %s", exc)


async def serve(opts: MountOptions, notify: Notify | None = None) -> None:
    """Mount and serve in this process until unmounted or SIGTERM."""
    mp = os.path.abspath(opts.mountpoint)
    settings = ClientSettings(master=opts.master, request_timeout=opts.request_timeout)
    client = AsyncClient(settings)
    devfd = -1
    metrics_server: Any = None
    base = state_base(opts.state_dir, mp)
    wrote_state = False
    try:
        _prepare_mountpoint(mp)
        known = {d.name for d in await client.datasets()}
        missing = [d for d in opts.datasets if d not in known]
        if missing:
            raise InvalidArgument(f"no dataset {missing[0]!r} at {opts.master}")
        await client.refresh_ring()
        fs = FileSystem(client, list(opts.datasets) or None, opts.kernel_open)
        devfd = kernel.open_device()
        kernel.mount(devfd, mp, MAX_READ)
        daemon = Daemon(devfd, fs, opts.passthrough and not opts.kernel_open)
        try:
            daemon.handshake()
        except OSError:
            kernel.umount(mp, lazy=True)
            raise
        if daemon.passthrough:
            fs.backing_open = lambda fd: kernel.backing_open(devfd, fd)
            fs.backing_close = lambda bid: kernel.backing_close(devfd, bid)
        _set_readahead(mp, opts.readahead_kb)
        port = None
        if opts.metrics_port is not None:
            from prometheus_client import CollectorRegistry, start_http_server

            registry = CollectorRegistry()
            registry.register(Metrics(daemon))
            metrics_server, _ = start_http_server(
                opts.metrics_port, opts.metrics_host, registry=registry
            )
            port = metrics_server.server_port
        base.parent.mkdir(parents=True, exist_ok=True)
        state = {"pid": os.getpid(), "mountpoint": mp, "metrics_port": port}
        state.update({k: v for k, v in asdict(opts).items() if k in ("master", "passthrough")})
        state["passthrough"] = daemon.passthrough
        tmp = base.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(base.with_suffix(".json"))
        wrote_state = True

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: loop.create_task(_shutdown(mp, daemon)))
        log.info("mounted %s (pid %d, metrics port %s)", mp, os.getpid(), port)
        if notify is not None:
            notify(None)
            notify = None
        # syncs and dataset changes invalidate the kernel's caches (see fuse.watch)
        watching = loop.create_task(Watcher(fs).run())
        try:
            await daemon.serve()
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
        fs.close_backing()
        log.info("unmounted %s", mp)
    except (ShoalError, OSError) as exc:
        if notify is not None:
            code = exc.code if isinstance(exc, ShoalError) else ShoalError.code
            notify(f"{code}\n{exc.message if isinstance(exc, ShoalError) else exc}")
        raise
    finally:
        if devfd >= 0:
            with contextlib.suppress(OSError):
                kernel.umount_any(mp)
            os.close(devfd)
        if metrics_server is not None:
            metrics_server.shutdown()
        await client.close()
        if wrote_state:
            with contextlib.suppress(OSError):
                base.with_suffix(".json").unlink()


async def _shutdown(mp: str, daemon: Daemon) -> None:
    log.info("signal: unmounting %s", mp)
    try:
        await asyncio.to_thread(kernel.umount_any, mp)
    except OSError as exc:
        log.warning("unmount of %s failed: %s", mp, exc)
    await asyncio.sleep(0.5)  # normally /dev/fuse reports ENODEV before this
    daemon.stop()


def unmount(mountpoint: str, state_dir: str | None = None, timeout: float = 10.0) -> bool:
    """Unmount ``mountpoint`` and stop its daemon; works after the daemon crashed.
    True if a mount was removed."""
    mp = os.path.abspath(mountpoint)
    sdir = state_dir or str(default_state_dir())
    state = read_state(sdir, mp)
    removed = kernel.umount_any(mp)
    pid = int(state["pid"]) if state and state.get("pid") else 0
    if pid and _alive(pid):
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(OSError):
        state_base(sdir, mp).with_suffix(".json").unlink()
    return removed


def daemonize(log_path: Path, timeout: float = 60.0) -> Notify | None:
    """Detach into the background (double fork, new session, output to ``log_path``).

    Returns in both processes: in the original one None, once the daemon reported that
    it is mounted (raises the daemon's error if it failed); in the daemon a callable to
    report with (None for success, else "<error code>\\n<message>").
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        os.waitpid(pid, 0)
        chunks = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(r)
        msg = b"".join(chunks).decode(errors="replace")
        if msg == "ok":
            return None
        code, _, text = msg.partition("\n")
        if not text:
            raise Unavailable(f"the mount daemon exited (see {log_path})")
        raise from_code(code, text)
    os.close(r)
    os.setsid()
    if os.fork():
        os._exit(0)
    os.chdir("/")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)

    def notify(error: str | None) -> None:
        with contextlib.suppress(OSError):
            os.write(w, b"ok" if error is None else error.encode())
            os.close(w)

    return notify

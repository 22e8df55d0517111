"""Mounts for tests: `shoal mount` started as a daemon the way users start it, with a
watchdog, always unmounted afterwards; its metrics read back as numbers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.fuse import kernel
from shoal.fuse.service import read_state


def can_mount() -> bool:
    """Whether this machine lets tests mount (a /dev/fuse and root)."""
    return os.path.exists("/dev/fuse") and os.geteuid() == 0


def mount_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shoal.cli.mount", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass
class Mounted:
    path: Path
    state_dir: Path

    @property
    def state(self) -> dict[str, Any]:
        s = read_state(str(self.state_dir), str(self.path))
        assert s is not None
        return s

    def metrics(self) -> dict[str, float]:
        url = f"http://127.0.0.1:{self.state['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("shoal_fuse_"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def requests(self, op: str) -> int:
        return int(self.metrics().get(f'shoal_fuse_requests_total{{op="{op}"}}', 0))


@contextmanager
def mounted(master: str, where: Path, *extra: str, watchdog_s: float = 120) -> Iterator[Mounted]:
    """`shoal mount` as a daemon; always unmounted (lazily if need be) afterwards."""
    mp, state = where / "mnt", where / "mounts"
    mp.mkdir(parents=True, exist_ok=True)
    r = mount_cli("mount", str(mp), "--master", master, "--metrics-port", "0",
                  "--state-dir", str(state), *extra)  # fmt: skip
    assert r.returncode == 0, r.stderr
    m = Mounted(mp, state)
    # a request the daemon never answers would block the test in the kernel for good:
    # past the deadline, kill the daemon (the kernel then fails every request)
    watchdog = threading.Timer(watchdog_s, os.kill, (m.state["pid"], signal.SIGKILL))
    watchdog.daemon = True
    watchdog.start()
    try:
        yield m
    finally:
        watchdog.cancel()
        mount_cli("umount", str(mp), "--state-dir", str(state), timeout=30)
        if kernel.is_mounted(str(mp)):
            kernel.umount(str(mp), lazy=True)

"""A whole cluster on this host: a master and N workers as background processes.

``shoal up`` and the test fixtures use this same code. State (pids, URLs) is kept in
``<dir>/cluster.json`` so ``shoal down`` and later commands find the cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.config import shoal_home
from shoal.errors import InvalidArgument, ShoalError, Unavailable

STATE = "cluster.json"


def default_dir() -> Path:
    return shoal_home() / "cluster"


async def _ring_reaches(
    master: str, n: int, timeout: float, token: str | None = None, tls_ca: str | None = None
) -> bool:
    """Poll the master's ring until it has ``n`` workers; False after ``timeout``."""
    import asyncio

    import aiohttp

    from shoal.proto.control import ring_from_response
    from shoal.proto.master_api import MasterAPI

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        master_api = MasterAPI(master, lambda: http, token=token, tls_ca=tls_ca)
        while loop.time() < deadline:
            try:
                if len(ring_from_response(await master_api.ring()).members) == n:
                    return True
            except ShoalError:
                pass  # not up yet, or restarting: ask again
            # the master offers no event for "a worker joined": poll, as briefly as before
            await asyncio.sleep(0.05)
    return False


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        if proc.poll() is not None:
            tail = log.read_text()[-2000:] if log.exists() else ""
            last = tail.strip().splitlines()[-1:] or ["(no output)"]
            raise Unavailable(
                f"{path.stem} exited with code {proc.returncode}: {last[0]} (see {log})"
            )
        time.sleep(0.02)
    raise Unavailable(f"{path.stem} did not start within {timeout:.0f}s (see {log})")


@dataclass
class LocalCluster:
    dir: Path
    workers: int = 2
    #: memory tier (/dev/shm) per worker; "0" = none. On this machine kind tmpfs reads
    #: ran at ~8 GB/s against ~25 GB/s from the page cache of a disk file, so by default
    #: the disk tier plus the kernel's page cache serve warm data
    mem: str = "0"
    disk: str = "4GiB"
    host: str = "127.0.0.1"
    #: concurrent under-storage requests per worker
    ufs_concurrency: int = 32
    heartbeat: float = 1.0
    expiry: float = 5.0
    #: directories file:// mounts may read (the master's --file-root); the default,
    #: the system temp directory, is what a local trial and the tests need
    file_roots: tuple[str, ...] = field(default_factory=lambda: (tempfile.gettempdir(),))
    #: extra environment for the processes (e.g. AWS credentials for a test store)
    env: dict[str, str] = field(default_factory=dict)
    #: tokens required (a cluster secret in ``dir``; see shoal.core.tokens)
    auth: bool = False
    #: workers drain on SIGTERM for at most this many seconds (0: stop at once)
    drain_timeout: float = 0.0
    #: TLS for the master's API and the workers' TCP ports, with a CA and certificate
    #: generated in ``dir/tls`` (shoal.cli.pki); clients trust ``tls_ca``
    tls: bool = False
    #: gateways started with the cluster: kind (s3, webhdfs) -> port (0: any free)
    gateways: dict[str, int] = field(default_factory=dict)
    #: flags every gateway gets (--credentials FILE, --allow-anonymous, --writable DS)
    gateway_args: list[str] = field(default_factory=list)
    gateway_urls: dict[str, str] = field(default_factory=dict)
    master_url: str = ""
    master_port: int = 0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)

    # -- processes ------------------------------------------------------------------

    def command(self, name: str, args: list[str]) -> list[str]:
        """The argv that runs ``shoal ARGS`` as process ``name``; a subclass may wrap it
        (``ip netns exec``) or append flags (argparse: the last of a repeated one wins)."""
        return [sys.executable, "-m", "shoal", *args]

    # -- authentication ---------------------------------------------------------------

    @property
    def secret_file(self) -> Path:
        return self.dir / "secret"

    @property
    def admin_token_file(self) -> Path:
        """The admin's token (``shoal up`` also stores it for the CLI and clients)."""
        return self.dir / "admin.token"

    @property
    def worker_token_file(self) -> Path:
        return self.dir / "worker.token"

    def prepare_auth(self) -> None:
        """The cluster secret and the admin's and the workers' tokens (kept across
        restarts of the cluster from the same directory)."""
        from shoal.core.tokens import ADMIN, WORKER, load_secret, mint, new_secret, write_token

        secret = load_secret(self.secret_file) if self.secret_file.exists() else None
        if secret is None:
            secret = new_secret(self.secret_file)
        if not self.admin_token_file.exists():
            write_token(self.admin_token_file, mint(secret, "admin", ADMIN))
        if not self.worker_token_file.exists():
            write_token(self.worker_token_file, mint(secret, "workers", WORKER))

    @property
    def tls_ca(self) -> Path | None:
        """The CA clients trust (``shoal up --tls``); None: plain."""
        return self.dir / "tls" / "ca.pem" if self.tls else None

    def _spawn(self, name: str, args: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.dir / f"{name}.log"
        env = dict(os.environ)
        env.update(self.env)
        if self.tls:
            from shoal.cli.pki import local_pki

            pki = local_pki(self.dir / "tls", self.host)
            env["SHOAL_TLS_CA"] = str(pki.ca)  # peers, gateways: the master's and workers' CA
            if name == "master" or name.startswith("worker"):
                args = [*args, "--tls-cert", str(pki.cert), "--tls-key", str(pki.key)]
        if self.auth:
            if name == "master":
                args = [*args, "--secret-file", str(self.secret_file)]
            elif name.startswith("worker"):
                # the secret checks its clients' tokens; the token registers it
                args = [*args, "--secret-file", str(self.secret_file)]
                env["SHOAL_TOKEN_FILE"] = str(self.worker_token_file)
                env.pop("SHOAL_TOKEN", None)
            elif name.startswith("gateway"):
                # a gateway reads for its callers and runs the sync after a write
                env["SHOAL_TOKEN_FILE"] = str(self.admin_token_file)
                env.pop("SHOAL_TOKEN", None)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                self.command(name, args),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.procs[name] = proc
        self.pids[name] = proc.pid
        return proc, log

    def master_args(
        self, port: int, url_file: Path, state_dir: Path | None = None, *extra: str
    ) -> list[str]:
        """``shoal master`` arguments for this cluster's master (default state dir)."""
        return [
            "master",
            "--host",
            self.host,
            "--port",
            str(port),
            "--state-dir",
            str(state_dir or self.dir / "master"),
            "--url-file",
            str(url_file),
            "--heartbeat-interval",
            str(self.heartbeat),
            "--worker-expiry",
            str(self.expiry),
            *(arg for root in self.file_roots for arg in ("--file-root", root)),
            *extra,
        ]

    def start_master(self, timeout: float = 20.0) -> str:
        url_file = self.dir / "master.url"
        url_file.unlink(missing_ok=True)
        proc, log = self._spawn("master", self.master_args(self.master_port, url_file))
        self.master_url = _wait_file(url_file, proc, timeout, log).strip()
        self.master_port = int(self.master_url.rsplit(":", 1)[1])
        return self.master_url

    def worker_dir(self, i: int) -> Path:
        return self.dir / f"worker-{i}"

    def start_worker(self, i: int, timeout: float = 20.0) -> dict[str, Any]:
        wdir = self.worker_dir(i)
        wdir.mkdir(parents=True, exist_ok=True)
        url_file = wdir / "worker.json"
        url_file.unlink(missing_ok=True)
        tiers = []
        if self.mem and self.mem != "0":
            shm = Path("/dev/shm")
            base = shm if shm.is_dir() and os.access(shm, os.W_OK) else wdir
            tiers += ["--tier", f"mem:{base}/{mem_prefix(self.dir)}{i}:{self.mem}"]
        tiers += ["--tier", f"ssd:{wdir / 'cache'}:{self.disk}"]
        proc, log = self._spawn(
            f"worker-{i}",
            [
                "worker",
                "--master",
                self.master_url,
                "--host",
                self.host,
                "--port",
                "0",
                "--dir",
                str(wdir),
                "--url-file",
                str(url_file),
                "--ufs-concurrency",
                str(self.ufs_concurrency),
                *tiers,
                *(["--drain-timeout", str(self.drain_timeout)] if self.drain_timeout else []),
            ],
        )
        return json.loads(_wait_file(url_file, proc, timeout, log))

    def start_gateway(self, kind: str, port: int = 0, timeout: float = 20.0) -> str:
        """Start the ``kind`` gateway (s3 or webhdfs) over this cluster; its URL."""
        url_file = self.dir / f"gateway-{kind}.url"
        url_file.unlink(missing_ok=True)
        proc, log = self._spawn(
            f"gateway-{kind}",
            [
                "gateway",
                kind,
                "--master",
                self.master_url,
                "--host",
                self.host,
                "--port",
                str(port),
                "--url-file",
                str(url_file),
                *self.gateway_args,
            ],
        )
        self.gateway_urls[kind] = _wait_file(url_file, proc, timeout, log).strip()
        return self.gateway_urls[kind]

    def start(self) -> str:
        """Start the master, the workers and the gateways; on any failure stop what
        was started (a half-started cluster would outlive its caller)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.auth:
                self.prepare_auth()
            self.start_master()
            for i in range(self.workers):
                self.start_worker(i)
            self.save()
            self.wait_ring(self.workers)
            for kind, port in self.gateways.items():
                self.start_gateway(kind, port)
            self.save()
        except BaseException:
            self.stop()
            raise
        return self.master_url

    def wait_ring(self, n: int, timeout: float = 20.0) -> None:
        """Return once the master's ring has ``n`` workers; Unavailable after ``timeout``.
        Called from synchronous code (the CLI, test fixtures), never inside a loop."""
        import asyncio

        token = self.admin_token_file.read_text().strip() if self.auth else None
        ca = str(self.tls_ca) if self.tls_ca else None
        if not asyncio.run(_ring_reaches(self.master_url, n, timeout, token, ca)):
            raise Unavailable(f"{n} workers did not join the ring within {timeout:.0f}s")

    def save(self) -> None:
        state = {
            "master": self.master_url,
            "pids": self.pids,
            "workers": self.workers,
            "gateways": self.gateway_urls,
        }
        tmp = self.dir / (STATE + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.dir / STATE)

    def stop_process(self, name: str, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        proc = self.procs.pop(name, None)
        pid = self.pids.pop(name, None)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        elif pid is not None:
            _kill_pid(pid, sig, timeout)

    def stop(self) -> None:
        for name in sorted(self.pids, key=lambda n: n == "master"):
            self.stop_process(name)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / STATE).unlink()
        remove_mem_tiers(self.dir)


def mem_prefix(dir: Path) -> str:
    """Memory-tier directory name prefix for a cluster dir (stable across processes)."""
    return "shoal-" + hashlib.sha1(str(dir.resolve()).encode()).hexdigest()[:10] + "-w"


def remove_mem_tiers(dir: Path) -> None:
    shm = Path("/dev/shm")
    if shm.is_dir():
        for p in shm.glob(mem_prefix(dir) + "*"):
            shutil.rmtree(p, ignore_errors=True)


def _kill_pid(pid: int, sig: int, timeout: float) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def load_state(dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((dir / STATE).read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise InvalidArgument(f"unreadable cluster state {dir / STATE}: {exc}") from None


def down(dir: Path) -> list[str]:
    state = load_state(dir)
    if state is None:
        raise ShoalError(f"no local cluster running from {dir}")
    names = sorted(state["pids"], key=lambda n: n == "master")
    for name in names:
        _kill_pid(int(state["pids"][name]), signal.SIGTERM, 10.0)
    (dir / STATE).unlink(missing_ok=True)
    remove_mem_tiers(dir)
    return names

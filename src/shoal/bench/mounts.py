"""Benchmark contenders that mount the bucket with FUSE (rclone, s3fs-fuse), run as a
child process; the base :class:`FuseMount` is shoal's FUSE contender's too."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from shoal.bench.contender import (
    KEY,
    SECRET,
    Contender,
    RangeFn,
    ReadFn,
    file_lister,
    file_readers,
    register,
)


class FuseMount(Contender):
    """A FUSE mount of the bucket run as a child process; cold = remount on an empty
    cache directory (after drop_caches, so the kernel's page cache is gone too)."""

    binary = ""

    def available(self) -> str | None:
        if not shutil.which(self.binary):
            return f"{self.binary} not installed (Debian package)"
        if not os.path.exists("/dev/fuse"):
            return "/dev/fuse missing"
        return None

    def setup(self) -> None:
        self._gen = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.mnt = self.env.workdir / "mnt" / self.name
        self.mount()

    @property
    def cache_dir(self) -> Path:
        return self.env.workdir / "cache" / f"{self.name}-{self._gen}"

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def mount(self) -> None:
        self._gen += 1
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        argv, extra = self.command()
        env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
        env.update(extra)
        log = open(self.env.workdir / f"{self.name}.log", "ab")  # noqa: SIM115 - the child's
        with log:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.ismount(self.mnt):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}; see {log.name}")
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not mount within 30 s")

    def unmount(self) -> None:
        if os.path.ismount(self.mnt):
            for cmd in (["fusermount3", "-u", str(self.mnt)], ["umount", "-l", str(self.mnt)]):
                if (
                    shutil.which(cmd[0])
                    and subprocess.run(cmd, capture_output=True).returncode == 0
                ):
                    break
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        shutil.rmtree(self.cache_dir, ignore_errors=True)

    def cold(self) -> None:
        self.unmount()
        self.mount()

    def teardown(self) -> None:
        self.unmount()

    def daemon_pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None else []

    @property
    def root(self) -> Path:
        """Where the bucket's keys start inside the mount."""
        return self.mnt

    def reader(self) -> ReadFn:
        return file_readers(self.root)[0]

    def range_reader(self) -> RangeFn:
        return file_readers(self.root)[1]

    def lister(self) -> tuple[Callable[[str], int], Callable[[str], int]]:
        return file_lister(self.root)


@register
class Rclone(FuseMount):
    name = "rclone-vfs"
    binary = "rclone"
    about = "rclone mount --vfs-cache-mode full (Debian rclone)"

    def command(self) -> tuple[list[str], dict[str, str]]:
        env = {
            "RCLONE_CONFIG_BENCHS3_TYPE": "s3",
            "RCLONE_CONFIG_BENCHS3_PROVIDER": "Other",
            "RCLONE_CONFIG_BENCHS3_ACCESS_KEY_ID": KEY,
            "RCLONE_CONFIG_BENCHS3_SECRET_ACCESS_KEY": SECRET,
            "RCLONE_CONFIG_BENCHS3_ENDPOINT": self.env.endpoint,
            "RCLONE_CONFIG_BENCHS3_FORCE_PATH_STYLE": "true",
        }
        argv = [
            "rclone", "mount", f"benchs3:{self.env.bucket}", str(self.mnt),
            "--vfs-cache-mode", "full", "--cache-dir", str(self.cache_dir),
            "--vfs-cache-max-size", "40G", "--dir-cache-time", "1h", "--attr-timeout", "1h",
            "--no-modtime", "--read-only", "--config", "/dev/null",
        ]  # fmt: skip
        return argv, env


@register
class S3fsFuse(FuseMount):
    name = "s3fs-fuse"
    binary = "s3fs"
    about = "s3fs-fuse with use_cache, stat cache and kernel_cache (Debian s3fs)"

    def command(self) -> tuple[list[str], dict[str, str]]:
        pw = self.env.workdir / "s3fs.passwd"
        pw.write_text(f"{KEY}:{SECRET}\n")
        pw.chmod(0o600)
        argv = [
            "s3fs", self.env.bucket, str(self.mnt), "-f",
            "-o", f"url={self.env.endpoint}", "-o", "use_path_request_style",
            "-o", f"passwd_file={pw}", "-o", f"use_cache={self.cache_dir}", "-o", "ro",
            "-o", "max_stat_cache_size=500000", "-o", "stat_cache_expire=3600",
            "-o", "kernel_cache", "-o", "parallel_count=16", "-o", "multireq_max=32",
            "-o", "enable_noobj_cache",
        ]  # fmt: skip
        return argv, {}

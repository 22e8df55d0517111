"""The contenders: every way of reading the same files, in one registry.

A contender is set up once per suite (mount, cluster, cache directory), told to go
cold before a cold epoch, and asked *inside each reader process* for the functions
that read (so clients are created after fork). Add one with ``@register``; a
contender whose ``available()`` returns a reason is skipped and the reason reported.

Hooks for shoal's own integrations: ``shoal-fsspec`` and ``shoal-fuse`` register
themselves here and run when ``shoal.fsspec`` / ``shoal.fuse`` import.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: read one whole file by its key ("small/000/f000001.bin"): bytes read
ReadFn = Callable[[str], int]
#: read one range of a file: bytes read
RangeFn = Callable[[str, int, int], int]
#: read many files in one call: bytes read
BatchFn = Callable[[list[str]], int]

KEY, SECRET = "testing", "testing"


@dataclass
class BenchEnv:
    workdir: Path
    endpoint: str  # the shaped S3 endpoint every remote reader uses
    bucket: str
    local_root: Path  # the same files in a local directory
    master: str = ""  # shoal's master, once a cluster is up
    dataset: str = "bench"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def s3_env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1",
        }


class Contender:
    name = ""
    #: "local" (the physical limit), "remote" (no cache), "cache"
    kind = "cache"
    #: reads in batches (cat_many) instead of one file per call
    batch = False
    #: a one-line description for the report
    about = ""
    #: most requests in flight per reader process (None: whatever the workload asks)
    max_threads: int | None = None

    def __init__(self, env: BenchEnv) -> None:
        self.env = env

    def available(self) -> str | None:
        return None

    def setup(self) -> None:
        pass

    def cold(self) -> None:
        """Forget everything cached, so the next epoch reads from the store."""

    def teardown(self) -> None:
        pass

    def daemon_pids(self) -> list[int]:
        """Processes that serve this contender's reads (their CPU is counted)."""
        return []

    # called in the reader process
    def reader(self) -> ReadFn:
        raise NotImplementedError

    def range_reader(self) -> RangeFn:
        read = self.reader()

        def whole_then_slice(key: str, off: int, n: int) -> int:  # pragma: no cover
            return min(n, max(0, read(key) - off))

        return whole_then_slice

    def batch_reader(self) -> BatchFn:
        read = self.reader()
        return lambda keys: sum(read(k) for k in keys)

    def lister(self) -> tuple[Callable[[str], int], Callable[[str], int]] | None:
        """(ls(dir_key) -> entries, stat(key) -> size), or None when not supported."""
        return None

    def close_reader(self) -> None:
        """Called in the reader process after its last read."""


REGISTRY: dict[str, type[Contender]] = {}


def register(cls: type[Contender]) -> type[Contender]:
    REGISTRY[cls.name] = cls
    return cls


def _file_readers(root: Path) -> tuple[ReadFn, RangeFn]:
    def read(key: str) -> int:
        with open(root / key, "rb", buffering=0) as f:
            return len(f.read())

    fds: dict[str, int] = {}

    def read_range(key: str, off: int, n: int) -> int:
        fd = fds.get(key)
        if fd is None:
            fd = fds[key] = os.open(root / key, os.O_RDONLY)
        return len(os.pread(fd, n, off))

    return read, read_range


def _file_lister(root: Path) -> tuple[Callable[[str], int], Callable[[str], int]]:
    return (lambda d: len(os.listdir(root / d))), (lambda k: os.stat(root / k).st_size)


@register
class Local(Contender):
    name = "local-dir"
    kind = "local"
    about = "the same files in a local directory (open/read; cold = after drop_caches)"

    def reader(self) -> ReadFn:
        return _file_readers(self.env.local_root)[0]

    def range_reader(self) -> RangeFn:
        return _file_readers(self.env.local_root)[1]

    def lister(self) -> tuple[Callable[[str], int], Callable[[str], int]]:
        return _file_lister(self.env.local_root)


def boto3_client(endpoint: str, pool: int = 64) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
        config=Config(max_pool_connections=pool, retries={"max_attempts": 3}),
    )


@register
class Boto3(Contender):
    name = "boto3"
    kind = "remote"
    about = "direct GetObject per file (thread pool), no cache: raw parallel GETs"

    def reader(self) -> ReadFn:
        s3, bucket = boto3_client(self.env.endpoint), self.env.bucket
        return lambda key: len(s3.get_object(Bucket=bucket, Key=key)["Body"].read())

    def range_reader(self) -> RangeFn:
        s3, bucket = boto3_client(self.env.endpoint), self.env.bucket

        def read(key: str, off: int, n: int) -> int:
            r = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={off}-{off + n - 1}")
            return len(r["Body"].read())

        return read

    def lister(self) -> tuple[Callable[[str], int], Callable[[str], int]]:
        s3, bucket = boto3_client(self.env.endpoint), self.env.bucket

        def ls(d: str) -> int:
            n = 0
            for page in s3.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=d.rstrip("/") + "/", Delimiter="/"
            ):
                n += len(page.get("Contents", [])) + len(page.get("CommonPrefixes", []))
            return n

        return ls, lambda k: int(s3.head_object(Bucket=bucket, Key=k)["ContentLength"])


def _ranges_through(fs: Any, bucket: str) -> RangeFn:
    """Ranged reads through an fsspec filesystem, one open file object per key."""
    files: dict[str, Any] = {}

    def read(key: str, off: int, n: int) -> int:
        f = files.get(key)
        if f is None:
            f = files[key] = fs.open(f"{bucket}/{key}", "rb")
        f.seek(off)
        return len(f.read(n))

    return read


def _s3fs(endpoint: str) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        key=KEY,
        secret=SECRET,
        endpoint_url=endpoint,
        client_kwargs={"region_name": "us-east-1"},
        skip_instance_cache=True,
    )


@register
class S3fs(Contender):
    name = "s3fs"
    kind = "remote"
    about = "fsspec s3fs cat_file per file, no cache"

    def reader(self) -> ReadFn:
        fs, b = _s3fs(self.env.endpoint), self.env.bucket
        return lambda key: len(fs.cat_file(f"{b}/{key}"))

    def range_reader(self) -> RangeFn:
        return _ranges_through(_s3fs(self.env.endpoint), self.env.bucket)

    def lister(self) -> tuple[Callable[[str], int], Callable[[str], int]]:
        fs, b = _s3fs(self.env.endpoint), self.env.bucket
        return (lambda d: len(fs.ls(f"{b}/{d}", refresh=True))), (
            lambda k: int(fs.info(f"{b}/{k}", refresh=True)["size"])
        )


class _FsspecCache(Contender):
    protocol = ""

    def setup(self) -> None:
        self._gen = 0
        self.cold()

    @property
    def cache_dir(self) -> Path:
        return self.env.workdir / "cache" / f"{self.name}-{self._gen}"

    def cold(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.cache_dir)
        self._gen += 1
        self.cache_dir.mkdir(parents=True, exist_ok=True)

    def teardown(self) -> None:
        shutil.rmtree(self.cache_dir, ignore_errors=True)

    def _fs(self) -> Any:
        import fsspec

        return fsspec.filesystem(
            self.protocol,
            target_protocol="s3",
            target_options={
                "key": KEY,
                "secret": SECRET,
                "endpoint_url": self.env.endpoint,
                "client_kwargs": {"region_name": "us-east-1"},
                "skip_instance_cache": True,
            },
            cache_storage=str(self.cache_dir),
            skip_instance_cache=True,
        )

    def reader(self) -> ReadFn:
        fs, b = self._fs(), self.env.bucket

        def read(key: str) -> int:
            with fs.open(f"{b}/{key}", "rb") as f:
                return len(f.read())

        return read

    def range_reader(self) -> RangeFn:
        return _ranges_through(self._fs(), self.env.bucket)


@register
class FilecacheFsspec(_FsspecCache):
    name = "fsspec-filecache"
    protocol = "filecache"
    about = (
        "fsspec filecache:: over s3fs (whole files, metadata file, default expiry); not "
        "thread-safe (concurrent opens fail), so 1 request in flight per process"
    )
    max_threads = 1


@register
class SimplecacheFsspec(_FsspecCache):
    name = "fsspec-simplecache"
    protocol = "simplecache"
    about = "fsspec simplecache:: over s3fs (whole files, no metadata)"


class _FuseMount(Contender):
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
        return _file_readers(self.root)[0]

    def range_reader(self) -> RangeFn:
        return _file_readers(self.root)[1]

    def lister(self) -> tuple[Callable[[str], int], Callable[[str], int]]:
        return _file_lister(self.root)


@register
class Rclone(_FuseMount):
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
class S3fsFuse(_FuseMount):
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


class _Shoal(Contender):
    """Shared: the cluster is the suite's (``env.extra["cluster"]``); cold = a fresh
    cluster, started by the suite through ``env.extra["shoal_cold"]``."""

    def cold(self) -> None:
        self.env.extra["shoal_cold"]()

    def daemon_pids(self) -> list[int]:
        cluster = self.env.extra.get("cluster")
        return [p for n, p in cluster.pids.items() if n.startswith("worker")] if cluster else []

    def ns(self, key: str) -> str:
        return f"/{self.env.dataset}/data/{key}"


@register
class ShoalClient(_Shoal):
    name = "shoal-client"
    about = "shoal Python client, Client.read per file"

    def _client(self) -> Any:
        from shoal.client import Client

        self._c = Client(self.env.master)
        return self._c

    def close_reader(self) -> None:
        c = getattr(self, "_c", None)
        if c is not None:
            c.close()

    def reader(self) -> ReadFn:
        c = self._client()
        ns = self.ns
        return lambda key: len(c.read(ns(key)))

    def range_reader(self) -> RangeFn:
        c = self._client()
        ns = self.ns
        return lambda key, off, n: len(c.read(ns(key), off, n))

    def lister(self) -> tuple[Callable[[str], int], Callable[[str], int]]:
        c = self._client()
        return (lambda d: len(c.ls(self.ns(d)))), (lambda k: int(c.stat(self.ns(k)).size))


@register
class ShoalCatMany(ShoalClient):
    name = "shoal-cat_many"
    batch = True
    about = "shoal Python client, Client.cat_many in batches"

    def batch_reader(self) -> BatchFn:
        from shoal.errors import ShoalError

        c = self._client()
        ns = self.ns

        def read(keys: list[str]) -> int:
            out = c.cat_many([ns(k) for k in keys])
            n = 0
            for v in out.values():
                if isinstance(v, ShoalError):
                    raise v
                n += len(v)
            return n

        return read

    def lister(self) -> tuple[Callable[[str], int], Callable[[str], int]] | None:  # type: ignore[override]
        return None


@register
class ShoalFsspec(_Shoal):
    """Hook: runs once ``shoal.fsspec`` exists (ShoalFileSystem, protocol "shoal")."""

    name = "shoal-fsspec"
    about = "shoal through fsspec (shoal.fsspec.ShoalFileSystem)"

    def available(self) -> str | None:
        if importlib.util.find_spec("shoal.fsspec") is None:
            return "shoal.fsspec not built yet"
        return None

    def _fs(self) -> Any:
        import fsspec

        return fsspec.filesystem("shoal", master=self.env.master, skip_instance_cache=True)

    def reader(self) -> ReadFn:
        fs, ns = self._fs(), self.ns
        return lambda key: len(fs.cat_file(ns(key)))

    def range_reader(self) -> RangeFn:
        fs, ns = self._fs(), self.ns
        return lambda key, off, n: len(fs.cat_file(ns(key), off, off + n))


@register
class ShoalFuse(_Shoal, _FuseMount):
    """Runs once ``shoal.fuse`` exists: ``python -m shoal.cli.mount mount MNT`` in the
    foreground with its defaults (kernel passthrough for files complete on the local
    worker)."""

    name = "shoal-fuse"
    about = "shoal FUSE mount (shoal.fuse)"

    def available(self) -> str | None:
        if importlib.util.find_spec("shoal.fuse") is None:
            return "shoal.fuse not built yet"
        return None

    def setup(self) -> None:
        _FuseMount.setup(self)

    def command(self) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, "-m", "shoal.cli.mount", "mount", str(self.mnt),
                "--master", self.env.master, "--foreground", "--dataset", self.env.dataset,
                "--state-dir", str(self.env.workdir / "fuse-state")]  # fmt: skip
        return argv, self.env.s3_env

    @property
    def root(self) -> Path:
        return self.mnt / self.env.dataset / "data"

    def cold(self) -> None:
        _FuseMount.unmount(self)
        _Shoal.cold(self)
        _FuseMount.mount(self)

    def teardown(self) -> None:
        _FuseMount.teardown(self)

    def daemon_pids(self) -> list[int]:
        return _Shoal.daemon_pids(self) + _FuseMount.daemon_pids(self)

    def reader(self) -> ReadFn:
        return _FuseMount.reader(self)

    def range_reader(self) -> RangeFn:
        return _FuseMount.range_reader(self)

    def lister(self) -> tuple[Callable[[str], int], Callable[[str], int]]:
        return _FuseMount.lister(self)

    def close_reader(self) -> None:
        pass

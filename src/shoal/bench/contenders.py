"""The contenders: every way of reading the same files, in one registry.

A contender is set up once per suite (mount, cluster, cache directory), told to go
cold before a cold epoch, and asked *inside each reader process* for the functions
that read (so clients are created after fork). Add one with ``@register``; a
contender whose ``available()`` returns a reason is skipped and the reason reported.

Hooks for shoal's own integrations: ``shoal-fsspec`` and ``shoal-fuse`` register
themselves here and run when ``shoal.fsspec`` / ``shoal.fuse`` import.

The base class and registry are :mod:`shoal.bench.contender`; the FUSE mounts of the
bucket (rclone, s3fs-fuse) :mod:`shoal.bench.mounts`; shoal's own ways in
:mod:`shoal.bench.shoal_contenders`. This module registers the plain ones (local
directory, boto3, s3fs, fsspec caches), then imports those two (the registry's order
is the report's), and re-exports every name.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.bench.contender import (
    KEY,
    REGISTRY,
    SECRET,
    BatchFn,
    BenchEnv,
    Contender,
    RangeFn,
    ReadFn,
    file_lister,
    file_readers,
    register,
)


@register
class Local(Contender):
    name = "local-dir"
    kind = "local"
    about = "the same files in a local directory (open/read; cold = after drop_caches)"

    def reader(self) -> ReadFn:
        return file_readers(self.env.local_root)[0]

    def range_reader(self) -> RangeFn:
        return file_readers(self.env.local_root)[1]

    def lister(self) -> tuple[Callable[[str], int], Callable[[str], int]]:
        return file_lister(self.env.local_root)


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


# registered after the plain ones, in this order (the report lists them so)
from shoal.bench.mounts import Rclone, S3fsFuse  # noqa: E402
from shoal.bench.shoal_contenders import (  # noqa: E402
    ShoalCatMany,
    ShoalClient,
    ShoalFsspec,
    ShoalFuse,
)

__all__ = [
    "KEY",
    "REGISTRY",
    "SECRET",
    "BatchFn",
    "BenchEnv",
    "Boto3",
    "Contender",
    "FilecacheFsspec",
    "Local",
    "RangeFn",
    "Rclone",
    "ReadFn",
    "S3fs",
    "S3fsFuse",
    "ShoalCatMany",
    "ShoalClient",
    "ShoalFsspec",
    "ShoalFuse",
    "SimplecacheFsspec",
    "boto3_client",
    "register",
]

"""What a benchmark contender is: :class:`Contender`, the :class:`BenchEnv` it reads in,
the registry (``@register``), and the reader helpers over a local directory that
several contenders share. The contenders themselves: :mod:`shoal.bench.contenders`."""

from __future__ import annotations

import os
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


def file_readers(root: Path) -> tuple[ReadFn, RangeFn]:
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


def file_lister(root: Path) -> tuple[Callable[[str], int], Callable[[str], int]]:
    return (lambda d: len(os.listdir(root / d))), (lambda k: os.stat(root / k).st_size)

"""shoal's own benchmark contenders: the Python client (one read per file, and
``cat_many`` batches), the fsspec filesystem, and the FUSE mount. The cluster is the
suite's."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.bench.contender import (
    BatchFn,
    Contender,
    RangeFn,
    ReadFn,
    register,
)
from shoal.bench.mounts import FuseMount


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
        # the first contact with the master (dataset, ring) outside the timed pass, as
        # boto3 and s3fs build their clients before it
        c.dataset(self.env.dataset)
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
class ShoalFuse(_Shoal, FuseMount):
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
        FuseMount.setup(self)

    def command(self) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, "-m", "shoal.cli.mount", "mount", str(self.mnt),
                "--master", self.env.master, "--foreground", "--dataset", self.env.dataset,
                "--state-dir", str(self.env.workdir / "fuse-state")]  # fmt: skip
        return argv, self.env.s3_env

    @property
    def root(self) -> Path:
        return self.mnt / self.env.dataset / "data"

    def cold(self) -> None:
        FuseMount.unmount(self)
        _Shoal.cold(self)
        FuseMount.mount(self)

    def teardown(self) -> None:
        FuseMount.teardown(self)

    def daemon_pids(self) -> list[int]:
        return _Shoal.daemon_pids(self) + FuseMount.daemon_pids(self)

    def reader(self) -> ReadFn:
        return FuseMount.reader(self)

    def range_reader(self) -> RangeFn:
        return FuseMount.range_reader(self)

    def lister(self) -> tuple[Callable[[str], int], Callable[[str], int]]:
        return FuseMount.lister(self)

    def close_reader(self) -> None:
        pass

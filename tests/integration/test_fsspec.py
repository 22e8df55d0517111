"""shoal:// through fsspec over a real cluster: fsspec's own abstract suite for what a
read-only cache supports (files written through the backing directory of a file://
mount), batched cat, ranges, opened files, pickling and fork, the chained
``shoal::s3://`` form and the entry point."""

from __future__ import annotations

import errno
import hashlib
import itertools
import multiprocessing
import os
import pickle
import posixpath
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.tests.abstract import AbstractFixtures
from fsspec.tests.abstract.copy import AbstractCopyTests
from fsspec.tests.abstract.get import AbstractGetTests
from fsspec.tests.abstract.open import AbstractOpenTests
from fsspec.tests.abstract.pipe import AbstractPipeTests
from fsspec.tests.abstract.put import AbstractPutTests

from shoal.core.types import Mount
from shoal.fsspec import ShoalFileSystem
from shoal.testing.cluster import TestCluster, sample_files
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration

MiB = 1 << 20
BUCKET = "fsspec-src"
FILES = sample_files(200, 1, 40_000, seed=11, prefix="small/")
BIG = random.Random(12).randbytes(5 * MiB + 77)
_dirs = itertools.count()


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory, moto: MotoServer, module_cluster: TestCluster
) -> tuple[TestCluster, Path]:
    """One cluster for the module: dataset ``ds`` over S3, ``fsx`` over a local dir."""
    root = tmp_path_factory.mktemp("fsspec")
    back = root / "back"
    back.mkdir()
    make_bucket(moto.endpoint, BUCKET, {**FILES, "big/large.bin": BIG})
    with module_cluster.client() as cl:
        mount = Mount("data", f"s3://{BUCKET}", {"endpoint_url": moto.endpoint})
        cl.create_dataset("ds", [mount])
        cl.create_dataset("fsx", [Mount("data", back.as_uri())], {"staleness": "always"})
    return module_cluster, back


@pytest.fixture
def fs(env: tuple[TestCluster, Path]) -> Iterator[ShoalFileSystem]:
    fs = ShoalFileSystem(master=env[0].master_url, skip_instance_cache=True)
    yield fs
    fs.close()  # idle connections would hold up the workers' shutdown


def h(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# -- fsspec's abstract suite ---------------------------------------------------------


class _WriteThroughBacking(ShoalFileSystem):
    """The suite's own writes (mkdir, touch, pipe, rm in test bodies) go to the backing
    directory of the ``fsx`` dataset, as a producer would write to under storage."""

    def __init__(self, back: Path, **kw: Any) -> None:
        super().__init__(**kw)
        self.back = back
        self.local = fsspec.filesystem("file", auto_mkdir=True)

    def _local(self, path: str) -> str:
        p = self._strip_protocol(path)
        assert p.startswith("fsx/data/"), p
        return str(self.back / p[len("fsx/data/") :])

    async def _mkdir(self, path: str, create_parents: bool = True, **kw: Any) -> None:
        self.local.makedirs(self._local(path), exist_ok=True)

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.local.makedirs(self._local(path), exist_ok=exist_ok)

    async def _pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kw: Any) -> None:
        self.local.pipe_file(self._local(path), value)

    def touch(self, path: str, truncate: bool = True, **kw: Any) -> None:
        self.local.touch(self._local(path), truncate=truncate)

    async def _rm(self, path: Any, recursive: bool = False, **kw: Any) -> None:
        for p in path if isinstance(path, list) else [path]:
            self.local.rm(self._local(p), recursive=recursive)


class TestShoalAbstractGet(AbstractGetTests, AbstractFixtures):  # type: ignore[misc]
    """Every ``get`` test, with the scenarios written through the backing directory."""

    @pytest.fixture
    def fs(self, env: tuple[TestCluster, Path]) -> Iterator[ShoalFileSystem]:
        fs = _WriteThroughBacking(env[1], master=env[0].master_url, skip_instance_cache=True)
        yield fs
        fs.close()

    @pytest.fixture
    def fs_join(self) -> Any:
        return posixpath.join

    @pytest.fixture
    def fs_path(self, env: tuple[TestCluster, Path]) -> str:
        name = f"t{next(_dirs)}"
        (env[1] / name).mkdir()
        return f"fsx/data/{name}"

    def _backed(self, env: tuple[TestCluster, Path], fs_path: str, make: Any) -> Iterator[str]:
        back = str(env[1] / fs_path.split("/", 2)[2])
        local = fsspec.filesystem("file", auto_mkdir=True)
        source = make(local, os.path.join, back)
        yield posixpath.join(fs_path, os.path.relpath(source, back))
        local.rm(source, recursive=True)

    @pytest.fixture
    def fs_bulk_operations_scenario_0(self, env: Any, fs_path: str) -> Iterator[str]:
        yield from self._backed(env, fs_path, self._bulk_operations_scenario_0)

    @pytest.fixture
    def fs_glob_edge_cases_files(self, env: Any, fs_path: str) -> Iterator[str]:
        yield from self._backed(env, fs_path, self._glob_edge_cases_files)

    @pytest.fixture
    def fs_dir_and_file_with_same_name_prefix(self, env: Any, fs_path: str) -> Iterator[str]:
        yield from self._backed(env, fs_path, self._dir_and_file_with_same_name_prefix)

    @pytest.fixture
    def fs_10_files_with_hashed_names(self, env: Any, fs_path: str) -> Iterator[str]:
        yield from self._backed(env, fs_path, self._10_files_with_hashed_names)


@pytest.mark.skip(reason="writes: shoal is a read-only cache (see test_writes_are_refused)")
class TestShoalAbstractWrites(  # type: ignore[misc]
    AbstractCopyTests, AbstractPutTests, AbstractOpenTests, AbstractPipeTests, AbstractFixtures
):
    pass


# -- reads -----------------------------------------------------------------------------


def test_cat_of_many_files_is_one_request_per_worker(fs: ShoalFileSystem) -> None:
    paths = [f"ds/data/{k}" for k in FILES]
    got = fs.cat(paths)  # cold: the workers read S3
    assert {p: h(v) for p, v in got.items()} == {f"ds/data/{k}": h(v) for k, v in FILES.items()}
    c = fs.client_cache.counters
    assert c.local + c.remote <= 2  # two workers: at most two batch requests
    t0 = time.perf_counter()
    assert fs.cat(paths) == got
    batched = time.perf_counter() - t0
    assert c.local + c.remote <= 4
    # per-file reads through a second filesystem (cold client, warm workers)
    other = ShoalFileSystem(master=fs.settings.master, skip_instance_cache=True)
    t0 = time.perf_counter()
    for p in paths:
        other.cat_file(p)
    single = time.perf_counter() - t0
    other.close()
    oc = other.client_cache.counters
    assert oc.short_circuit + oc.local + oc.remote == len(paths)
    # a new client learns each directory's cached files once per worker (LOCATE_DIR):
    # 2 directories x 2 workers, then every read is a pread on the caller's thread
    assert oc.short_circuit >= len(paths) - 4
    print(
        f"\nwarm workers: cat of {len(paths)} files {len(paths) / batched:.0f} files/s, "
        f"one cat_file per file {len(paths) / single:.0f} files/s"
    )
    assert fs.cat("ds/data/big/large.bin") == BIG
    with pytest.raises(FileNotFoundError):
        fs.cat(["ds/data/small/nope.bin"])
    out = fs.cat(["ds/data/small/nope.bin", paths[0]], on_error="omit")
    assert list(out) == [paths[0]]


def test_cat_ranges_small_and_large(fs: ShoalFileSystem) -> None:
    keys = list(FILES)[:20]
    fs.ls("ds/data/small/000")  # sizes become known: small-file ranges ride the batch
    before = fs.client_cache.counters.local + fs.client_cache.counters.remote
    paths = [f"ds/data/{k}" for k in keys]
    starts = [len(FILES[k]) // 3 for k in keys]
    ends = [len(FILES[k]) // 2 for k in keys]
    got = fs.cat_ranges(paths, starts, ends)
    assert got == [FILES[k][s:e] for k, s, e in zip(keys, starts, ends, strict=True)]
    assert fs.client_cache.counters.local + fs.client_cache.counters.remote - before <= 2
    big = "ds/data/big/large.bin"
    rng = random.Random(3)
    spans = [
        (o, o + rng.randrange(1, 3 * MiB)) for o in (rng.randrange(len(BIG)) for _ in range(6))
    ]
    got = fs.cat_ranges([big] * 6, [s for s, _ in spans], [e for _, e in spans])
    assert got == [BIG[s:e] for s, e in spans]
    assert fs.cat_file(big, start=-1000) == BIG[-1000:]
    assert fs.cat_file(big, start=10, end=-10) == BIG[10:-10]


def test_open_reads_ahead_and_is_byte_exact(fs: ShoalFileSystem) -> None:
    with fs.open("ds/data/big/large.bin", block_size=MiB) as f:
        parts = []
        while chunk := f.read(64 * 1024):
            parts.append(chunk)
        f.seek(3 * MiB + 5)
        tail = f.read(100)
    assert b"".join(parts) == BIG and tail == BIG[3 * MiB + 5 : 3 * MiB + 105]
    c = fs.client_cache.counters
    # 80 reads of 64 KiB cost one fetch per 1 MiB block, not one per read()
    assert c.local + c.remote + c.short_circuit <= 8
    with fs.open("ds/data/big/large.bin", "rt", encoding="latin-1") as t:
        assert t.read(10) == BIG[:10].decode("latin-1")


def test_metadata_and_errors(fs: ShoalFileSystem) -> None:
    assert fs.ls("", detail=False) == ["ds", "fsx"] or set(fs.ls("", detail=False)) >= {"ds"}
    assert fs.ls("ds", detail=False) == ["ds/data"]
    info = fs.info("ds/data/big/large.bin")
    assert info["size"] == len(BIG) and info["type"] == "file" and info["version"]
    assert fs.isdir("ds/data/small") and not fs.isfile("ds/data/small")
    assert fs.ls("ds/data/big/large.bin", detail=False) == ["ds/data/big/large.bin"]
    assert len(fs.find("ds/data/small")) == len(FILES)
    assert fs.du("ds/data/small") == sum(map(len, FILES.values()))
    assert not fs.exists("ds/data/nope") and not fs.exists("nods/data/x")
    assert not fs.exists("ds/nomount/x")
    for bad in ("ds/data/nope", "nods/data/x"):
        with pytest.raises(FileNotFoundError):
            fs.cat_file(bad)
    assert fs.modified("ds/data/big/large.bin").year >= 2020


def test_writes_are_refused(fs: ShoalFileSystem, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    attempts = [
        lambda: fs.pipe("ds/data/new.bin", b"x"),
        lambda: fs.open("ds/data/new.bin", "wb"),
        lambda: fs.rm("ds/data/big/large.bin"),
        lambda: fs.mkdir("ds/data/newdir"),
        lambda: fs.makedirs("ds/data/newdir"),
        lambda: fs.touch("ds/data/new.bin"),
        lambda: fs.put(str(tmp_path / "f"), "ds/data/new.bin"),
        lambda: fs.cp("ds/data/big/large.bin", "ds/data/copy.bin"),
        lambda: fs.mv("ds/data/big/large.bin", "ds/data/moved.bin"),
    ]
    for attempt in attempts:
        with pytest.raises(PermissionError, match="read-only") as e:
            attempt()
        assert e.value.errno == errno.EROFS


# -- instances: pickling, fork, entry point, chaining ----------------------------------


def _read_in_child(fs: ShoalFileSystem, paths: list[str]) -> list[str]:
    return [h(v) for v in fs.cat(paths).values()] + [h(fs.cat_file(paths[0]))]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pickles_and_survives_fork(fs: ShoalFileSystem, method: str) -> None:
    paths = [f"ds/data/{k}" for k in list(FILES)[:5]]
    fs.cat(paths)  # the parent has a live client and io loop before the fork
    clone = pickle.loads(pickle.dumps(fs))
    assert clone.cat_file(paths[1]) == FILES[paths[1][len("ds/data/") :]]
    with multiprocessing.get_context(method).Pool(1) as pool:
        got = pool.apply(_read_in_child, (fs, paths))
    want = [h(FILES[p[len("ds/data/") :]]) for p in paths]
    assert got == [*want, want[0]]
    assert fs.cat_file(paths[2]) == FILES[paths[2][len("ds/data/") :]]  # parent still fine


def test_entry_point_needs_no_import(env: tuple[TestCluster, Path]) -> None:
    code = (
        "import sys, fsspec\n"
        "with fsspec.open('shoal://ds/data/big/large.bin') as f: data = f.read()\n"
        "print(len(data), 'shoal.fsspec' in sys.modules)\n"
    )
    run_env = {**os.environ, "SHOAL_MASTER": env[0].master_url}
    out = subprocess.run(
        [sys.executable, "-c", code], env=run_env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(len(BIG)), "True"]


def test_chained_url_keeps_original_paths(env: tuple[TestCluster, Path]) -> None:
    opts = {"shoal": {"master": env[0].master_url}}
    key = next(iter(FILES))
    with fsspec.open(f"shoal::s3://{BUCKET}/{key}", **opts) as f:
        assert f.read() == FILES[key]
    fs, path = fsspec.core.url_to_fs(f"shoal::s3://{BUCKET}/big/large.bin", **opts)
    assert isinstance(fs, ShoalFileSystem) and path == f"{BUCKET}/big/large.bin"
    assert fs.cat_file(path, 0, 100) == BIG[:100]
    assert fs.ls(f"{BUCKET}/big", detail=False) == [f"{BUCKET}/big/large.bin"]
    keys = list(FILES)[:10]
    got = fs.cat([f"s3://{BUCKET}/{k}" for k in keys])
    assert got == {f"{BUCKET}/{k}": FILES[k] for k in keys}
    assert fs.client_cache.counters.ufs_fallback == 0  # served by shoal, not by S3 directly
    # a URL no dataset mounts is read through s3fs by default (test_fsspec_ecosystem);
    # unmounted="raise" refuses it
    strict, _ = fsspec.core.url_to_fs(
        f"shoal::s3://{BUCKET}/x", shoal={**opts["shoal"], "unmounted": "raise"}
    )
    with pytest.raises(FileNotFoundError, match="no shoal dataset mounts"):
        strict.cat_file("s3://other-bucket/x")
    fs.close()
    strict.close()

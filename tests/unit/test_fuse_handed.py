"""The mount's first open of a large file takes its data file's descriptor from its
directory's answer (one round trip for the directory, not one per file), uses a handed
descriptor only for the version the kernel was told of, and never keeps one past its
time: each is closed once used, refused or expired."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace

from shoal.client.cache import ClientCache
from shoal.core.types import Dataset, FileInfo, Mount
from shoal.fuse import nodes
from shoal.fuse.nodes import Node
from shoal.fuse.ops import FileSystem

MiB = 1 << 20


class Worker:
    """The local worker as the mount's client sees it: descriptors of files kept whole,
    by directory or one at a time, with every ask counted."""

    def __init__(self, root: Path, files: dict[str, tuple[str, int]]) -> None:
        self.root, self.files = root, files  # path -> (version, size)
        self.dir_asks: list[str] = []
        self.file_asks: list[str] = []
        self.handed: list[int] = []

    def _fd(self, path: str) -> tuple[int, FileInfo]:
        fd = os.open(self.root / "data", os.O_RDONLY)
        self.handed.append(fd)
        version, size = self.files[path]
        return fd, FileInfo(path, size, version, 1.0)

    async def open_local_dir(self, d: str) -> dict[str, tuple[int, FileInfo]]:
        self.dir_asks.append(d)
        await asyncio.sleep(0)  # an answer takes a round trip
        return {p: self._fd(p) for p in self.files if p.rpartition("/")[0] == d}

    async def open_local(self, path: str, load: bool) -> tuple[int, FileInfo] | None:
        assert not load
        self.file_asks.append(path)
        return self._fd(path) if path in self.files else None


def _fs(tmp_path: Path, files: dict[str, tuple[str, int]]) -> tuple[FileSystem, Worker]:
    (tmp_path / "data").write_bytes(b"x")
    w = Worker(tmp_path, files)
    cache = ClientCache()
    cache.datasets["ds"] = (Dataset("ds", (Mount("m", "file:///x"),)), time.monotonic())
    fs = FileSystem(
        SimpleNamespace(cache=cache, open_local=w.open_local, open_local_dir=w.open_local_dir)
    )  # type: ignore[arg-type]
    registered: list[int] = []

    def backing_open(fd: int) -> int:
        os.fstat(fd)  # a descriptor still open
        registered.append(fd)
        return len(registered)

    fs.backing_open = backing_open
    fs.backing_close = lambda bid: None
    return fs, w


def _node(fs: FileSystem, path: str, version: str, size: int) -> Node:
    ds = fs._child(fs.nodes[1], "ds", None)
    m = fs._child(ds, "m", None)
    parent = m
    for name in path.split("/")[3:-1]:
        parent = fs._child(parent, name, None)
    key = path.split("/", 2)[2]
    return fs._child(parent, path.rpartition("/")[2], FileInfo(key, size, version, 1.0))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_directory_is_asked_once_for_all_its_large_files(tmp_path: Path) -> None:
    files = {f"/ds/m/d/f{i}": ("v1", 3 * MiB) for i in range(4)}
    files["/ds/m/e/g"] = ("v1", 2 * MiB)

    async def run() -> None:
        fs, w = _fs(tmp_path, files)
        before = _open_fds()
        got = await asyncio.gather(
            *(fs._open_async(_node(fs, p, "v1", 3 * MiB), False) for p in sorted(files)[:4])
        )
        assert all(fs._backing_ok(fs.by_path[p]) for p in sorted(files)[:4])
        assert w.dir_asks == ["/ds/m/d"] and w.file_asks == []  # four opens, one ask
        assert len(got) == 4 and fs.stats.client_calls == 1
        # another directory is asked for by itself
        await fs._open_async(_node(fs, "/ds/m/e/g", "v1", 2 * MiB), False)
        assert w.dir_asks == ["/ds/m/d", "/ds/m/e"]
        assert len(w.handed) == 5 and not fs._handed and _open_fds() == before

    asyncio.run(run())


def test_a_handed_descriptor_of_another_version_is_never_used(tmp_path: Path) -> None:
    files = {"/ds/m/d/a": ("v1", 3 * MiB), "/ds/m/d/b": ("v1", 3 * MiB)}

    async def run() -> None:
        fs, w = _fs(tmp_path, files)
        before = _open_fds()
        await fs._open_async(_node(fs, "/ds/m/d/a", "v1", 3 * MiB), False)
        assert fs._handed  # b's descriptor waits for b's first open
        b = _node(fs, "/ds/m/d/b", "v2", 3 * MiB)  # the kernel was told of v2
        await fs._open_async(b, False)
        assert not b.backing and b.opens == 1  # read through the daemon instead
        assert len(w.handed) == 2 and not fs._handed and _open_fds() == before

    asyncio.run(run())


def test_handed_descriptors_expire_and_a_file_cached_later_asks_again(
    tmp_path: Path, monkeypatch
) -> None:
    files = {"/ds/m/d/a": ("v1", 3 * MiB), "/ds/m/d/b": ("v1", 3 * MiB)}

    async def run() -> None:
        monkeypatch.setattr("shoal.fuse.passthrough.HANDED_FOR", 0.05)
        fs, w = _fs(tmp_path, files)
        fs._handed.keep_for = 0.05
        before = _open_fds()
        await fs._open_async(_node(fs, "/ds/m/d/a", "v1", 3 * MiB), False)
        assert list(fs._handed) == ["/ds/m/d/b"] and _open_fds() == before + 1
        await asyncio.sleep(0.06)
        # a cold pass: the directory was asked before c was cached; the expired
        # descriptor of b is closed on the next ask
        w.files["/ds/m/d/c"] = ("v1", 3 * MiB)
        c = _node(fs, "/ds/m/d/c", "v1", 3 * MiB)
        await fs._open_async(c, False)
        assert w.dir_asks == ["/ds/m/d", "/ds/m/d"] and c.backing
        # b's old descriptor was closed; the new answer's a and b wait
        assert sorted(fs._handed) == ["/ds/m/d/a", "/ds/m/d/b"]
        assert _open_fds() == before + 2
        fs.close_backing()
        assert _open_fds() == before

    asyncio.run(run())


def test_a_file_found_cached_by_itself_makes_its_directory_asked_again(tmp_path: Path) -> None:
    files: dict[str, tuple[str, int]] = {}

    async def run() -> None:
        fs, w = _fs(tmp_path, files)
        before = _open_fds()
        a = _node(fs, "/ds/m/d/a", "v1", 3 * MiB)
        await fs._open_async(a, False)  # cold: nothing cached, nothing handed
        assert w.dir_asks == ["/ds/m/d"] and w.file_asks == ["/ds/m/d/a"] and not a.backing
        w.files.update({"/ds/m/d/b": ("v1", 3 * MiB), "/ds/m/d/c": ("v1", 3 * MiB)})
        await fs._open_async(_node(fs, "/ds/m/d/b", "v1", 3 * MiB), False)
        assert w.file_asks[-1] == "/ds/m/d/b"  # asked lately: by itself, and found
        await fs._open_async(_node(fs, "/ds/m/d/c", "v1", 3 * MiB), False)
        assert w.dir_asks == ["/ds/m/d", "/ds/m/d"]  # so the directory is asked again
        assert fs.by_path["/ds/m/d/c"].backing and w.file_asks[-1] == "/ds/m/d/b"
        fs.close_backing()
        assert _open_fds() == before

    asyncio.run(run())


def test_handed_descriptors_are_bounded(tmp_path: Path) -> None:
    files = {f"/ds/m/d/f{i}": ("v1", 3 * MiB) for i in range(6)}

    async def run() -> None:
        fs, w = _fs(tmp_path, files)
        fs._handed.limit = 3
        before = _open_fds()
        await fs._open_async(_node(fs, "/ds/m/d/f5", "v1", 3 * MiB), False)
        assert len(w.handed) == 6 and sorted(fs._handed) == ["/ds/m/d/f3", "/ds/m/d/f4"]
        assert _open_fds() == before + 2
        assert nodes.MAX_HANDED >= 256  # the real bound holds a directory's answer

    asyncio.run(run())

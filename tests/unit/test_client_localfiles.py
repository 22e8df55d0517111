"""A gateway's descriptors of whole local files: one worker ask per file version
while it is kept, shared by concurrent reads; never handed for another version or
size; each kept one closed when it expires, is crowded out, or the gateway closes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from shoal.client.wholefile import LocalFiles
from shoal.core.types import FileInfo


class Worker:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.asks: list[str] = []
        self.version = "v1"

    async def open_local(self, path: str, load: bool) -> tuple[int, FileInfo] | None:
        assert not load
        self.asks.append(path)
        await asyncio.sleep(0.01)  # a round trip
        if path.endswith("missing"):
            return None
        f = self.tmp / path.strip("/").replace("/", "_")
        f.write_bytes(path.encode())
        return os.open(f, os.O_RDONLY), FileInfo(path, 100, self.version, 1.0)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_concurrent_reads_of_one_version_share_one_ask(tmp_path: Path) -> None:
    async def run() -> None:
        w = Worker(tmp_path)
        before = _open_fds()
        lf = LocalFiles(w)  # type: ignore[arg-type]
        fds = await asyncio.gather(*(lf.open("/ds/m/big", "v1", 100) for _ in range(8)))
        assert w.asks == ["/ds/m/big"]
        assert all(fd is not None for fd in fds) and len(set(fds)) == 8
        for fd in fds:
            assert fd is not None
            assert os.pread(fd, 100, 0) == b"/ds/m/big"
            os.close(fd)
        again = await lf.open("/ds/m/big", "v1", 100)
        assert again is not None and w.asks == ["/ds/m/big"]
        os.close(again)
        assert await lf.open("/ds/m/missing", "v1", 100) is None
        lf.close()
        assert _open_fds() == before

    asyncio.run(run())


def test_another_version_or_size_is_never_handed(tmp_path: Path) -> None:
    async def run() -> None:
        w = Worker(tmp_path)
        before = _open_fds()
        lf = LocalFiles(w)  # type: ignore[arg-type]
        w.version = "v2"  # the worker holds a newer version than the caller serves
        assert await lf.open("/ds/m/big", "v1", 100) is None
        assert _open_fds() == before  # its descriptor closed at once
        fd = await lf.open("/ds/m/big", "v2", 100)
        assert fd is not None
        os.close(fd)
        assert await lf.open("/ds/m/big", "v2", 99) is None  # kept, but not that size
        lf.close()
        assert _open_fds() == before

    asyncio.run(run())


def test_kept_descriptors_expire_and_are_bounded(tmp_path: Path) -> None:
    async def run() -> None:
        w = Worker(tmp_path)
        before = _open_fds()
        lf = LocalFiles(w, keep_for=0.05, limit=2)  # type: ignore[arg-type]
        for name in ("a", "b", "c"):
            fd = await lf.open(f"/ds/m/{name}", "v1", 100)
            assert fd is not None
            os.close(fd)
        assert _open_fds() == before + 2  # a was crowded out
        await asyncio.sleep(0.06)
        fd = await lf.open("/ds/m/c", "v1", 100)  # expired: asked again
        assert fd is not None
        os.close(fd)
        assert w.asks == ["/ds/m/a", "/ds/m/b", "/ds/m/c", "/ds/m/c"]
        assert _open_fds() == before + 1  # b expired and was closed too
        lf.close()
        assert _open_fds() == before

    asyncio.run(run())


def test_only_a_file_whole_from_offset_0_is_taken_as_whole() -> None:
    from shoal.client.wholefile import _whole
    from shoal.proto.messages import LocateReply

    ps = 1 << 20
    size = 3 * ps + 5  # 4 pages
    assert _whole(LocateReply("v", size, run=[0, 0, 0, 4]), ps)
    assert not _whole(LocateReply("v", size, run=[0, ps, 0, 4]), ps)  # not from offset 0
    assert not _whole(LocateReply("v", size, run=[0, 0, 0, 3]), ps)  # a page short
    assert not _whole(LocateReply("v", size, run=[1, 0, 0, 4]), ps)  # another descriptor
    assert not _whole(LocateReply("v", size, run=[0, 0, 0]), ps)  # malformed
    pages = [[0, i * ps, ps, 0] for i in range(4)]
    assert _whole(LocateReply("v", size, pages=pages), ps)
    assert not _whole(LocateReply("v", size, pages=pages[:3]), ps)
    assert not _whole(LocateReply("v", size, first=1, pages=pages), ps)
    assert not _whole(LocateReply("v", size, pages=[[0, 0, ps, 0], [-1, 0, ps, 0]] * 2), ps)
    assert not _whole(LocateReply("v", size), ps)

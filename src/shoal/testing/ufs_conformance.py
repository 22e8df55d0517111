"""The conformance suite every under-store driver must pass, as fsspec ships its
abstract tests: subclass :class:`UfsConformance` in a test module and give it a
``backend`` fixture that yields a :class:`Backend` seeded with :data:`FILES`::

    @pytest.fixture
    def backend(tmp_path):
        put = local_put(tmp_path)
        seed(put)
        store = open_store(Mount("m", f"file://{tmp_path}"))
        yield Backend("local", store, put)
        asyncio.run(store.close())

    class TestMyDriver(UfsConformance):
        pass

``put(rel, data)`` must write through the driver's backing service (not through the
store under test), so that version changes are seen the way a real change would be.
Async tests need pytest-asyncio in auto mode (the project's pyproject sets it).
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from shoal.errors import InvalidArgument, NotFound, ShoalError, StaleVersion
from shoal.ufs import UnderStore

#: what every backend holds when a test starts
FILES = {
    "a.txt": b"hello world",
    "dir/b.bin": bytes(range(256)) * 4,
    "dir/sub/c.txt": b"c" * 10,
    "dir/sub/deeper/d": b"dd",
    "z.txt": b"last",
}

Put = Callable[[str, bytes], None]


@dataclass
class Backend:
    name: str
    store: UnderStore
    #: writes a file behind the store's back (through the service it reads)
    put: Put
    #: strings that must never appear in the store's messages, repr or describe()
    secrets: tuple[str, ...] = ()


def local_put(root: Path) -> Put:
    def put(rel: str, data: bytes) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    return put


def seed(put: Put) -> None:
    for rel, data in FILES.items():
        put(rel, data)


class UfsConformance:
    """What a driver must do: info, ls, walk, ranged reads, versions, errors, paths that
    stay inside the root, a new event loop, and no secret in any message."""

    async def test_info_file_and_dir(self, backend: Backend) -> None:
        f = await backend.store.info("dir/b.bin")
        assert (f.path, f.size, f.is_dir) == ("dir/b.bin", 1024, False)
        assert f.version
        d = await backend.store.info("dir")
        assert (d.path, d.is_dir) == ("dir", True)
        root = await backend.store.info("")
        assert root.is_dir and root.path == ""

    async def test_ls_sorted_with_sizes_and_types(self, backend: Backend) -> None:
        top = await backend.store.ls("")
        assert [(i.path, i.is_dir) for i in top] == [("a.txt", False), ("dir", True), ("z.txt", False)]  # fmt: skip
        assert top[0].size == 11 and top[2].size == 4
        sub = await backend.store.ls("/dir/")
        assert [(i.path, i.size, i.is_dir) for i in sub] == [
            ("dir/b.bin", 1024, False),
            ("dir/sub", 0, True),
        ]

    async def test_walk_finds_every_nested_file(self, backend: Backend) -> None:
        found = {i.path: i.size async for i in backend.store.walk("")}
        assert found == {k: len(v) for k, v in FILES.items()}
        below = sorted([i.path async for i in backend.store.walk("dir/sub")])
        assert below == ["dir/sub/c.txt", "dir/sub/deeper/d"]
        assert [i.path async for i in backend.store.walk("a.txt")] == ["a.txt"]

    async def test_read_ranges(self, backend: Backend) -> None:
        s, data = backend.store, FILES["dir/b.bin"]
        assert await s.read("dir/b.bin", 0, 10) == data[:10]
        assert await s.read("dir/b.bin", 500, 600) == data[500:600]
        assert await s.read("dir/b.bin", 1000, 1024) == data[1000:]
        assert await s.read("dir/b.bin", 1000, 5000) == data[1000:]
        assert await s.read("dir/b.bin", 2000, 3000) == b""
        assert await s.read("dir/b.bin", 7, 7) == b""
        assert await s.read("a.txt", 0, 11) == b"hello world"
        with pytest.raises(InvalidArgument):
            await s.read("a.txt", 5, 2)

    async def test_version_stable_then_changes(self, backend: Backend) -> None:
        v1 = (await backend.store.info("a.txt")).version
        assert (await backend.store.info("a.txt")).version == v1
        assert {i.path: i.version for i in await backend.store.ls("")}["a.txt"] == v1
        assert await backend.store.read("a.txt", 0, 5, v1) == b"hello"
        backend.put("a.txt", b"a different, longer body")
        v2 = (await backend.store.info("a.txt")).version
        assert v2 != v1
        assert await backend.store.read("a.txt", 0, 11, v2) == b"a different"

    async def test_read_head_agrees_with_info_and_read(self, backend: Backend) -> None:
        """One request's info and bytes must match info() and read(): pages are keyed
        by it."""
        s, data = backend.store, FILES["dir/b.bin"]
        info, head = await s.read_head("dir/b.bin", 100)
        want = await s.info("dir/b.bin")
        assert (info.size, info.version) == (want.size, want.version)
        assert head == data[:100]
        assert await s.read("dir/b.bin", 100, 200, info.version) == data[100:200]
        whole_info, whole = await s.read_head("a.txt", 1 << 20)
        assert whole == b"hello world" and whole_info.size == 11

    async def test_read_with_stale_version_raises(self, backend: Backend) -> None:
        v1 = (await backend.store.info("z.txt")).version
        backend.put("z.txt", b"changed and longer")
        with pytest.raises(StaleVersion):
            await backend.store.read("z.txt", 0, 4, v1)

    async def test_missing_paths_are_not_found(self, backend: Backend) -> None:
        s = backend.store
        with pytest.raises(NotFound):
            await s.info("nope.txt")
        with pytest.raises(NotFound):
            await s.ls("no/such/dir")
        with pytest.raises(NotFound):
            await s.read("dir/nope.bin", 0, 10)
        with pytest.raises(NotFound):
            [i async for i in s.walk("no-dir")]
        with pytest.raises(FileNotFoundError):  # NotFound is also the builtin
            await s.info("dir/sub/nope")

    async def test_ls_of_a_file_is_not_a_directory(self, backend: Backend) -> None:
        with pytest.raises(ShoalError) as err:
            await backend.store.ls("a.txt")
        assert err.value.errno == errno.ENOTDIR

    async def test_paths_cannot_escape_the_root(self, backend: Backend) -> None:
        for bad in ("../x", "dir/../../x", "a\x00b"):
            with pytest.raises(InvalidArgument):
                await backend.store.info(bad)

    def test_store_survives_a_new_event_loop(self, backend: Backend) -> None:
        async def use() -> bytes:
            return await backend.store.read("a.txt", 0, 5)

        # a store reused by a second asyncio.run (or after fork) must rebuild, not hang
        assert asyncio.run(asyncio.wait_for(use(), 10)) == b"hello"
        assert asyncio.run(asyncio.wait_for(use(), 10)) == b"hello"

    async def test_no_secret_in_messages_repr_or_describe(self, backend: Backend) -> None:
        s = backend.store
        texts = [repr(s), s.describe()]
        for call in (s.info("nope"), s.read("nope", 0, 1), s.ls("nope/dir")):
            with pytest.raises(ShoalError) as err:
                await call
            texts.append(str(err.value))
        v = (await s.info("a.txt")).version
        backend.put("a.txt", b"v2, longer than before")
        with pytest.raises(StaleVersion) as stale:
            await s.read("a.txt", 0, 3, v)
        texts.append(str(stale.value))
        assert all(secret not in t for secret in backend.secrets for t in texts), texts
        assert s.describe().startswith(s.scheme + "://")

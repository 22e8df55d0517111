"""The conformance suite every PageStore (each tier, the tiered composite) passes.

Use it as fsspec's abstract tests are used: subclass :class:`PageStoreConformance` in a
test module (name the subclass ``Test...``) and provide a ``factory`` fixture returning a
:class:`StoreFactory`. Calling the factory again after closing the store it returned
reopens the same directories (a restart).
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import pytest
import xxhash

from shoal.core.types import FileKey
from shoal.errors import InvalidArgument
from shoal.store.base import CacheStore, Location, PutMeta

KiB = 1 << 10
PAGE = 4 * KiB
DS = "ds"


class StoreFactory(Protocol):
    def __call__(self, capacity: int = ..., eviction: str = ...) -> CacheStore: ...


def fkey(name: str, version: str = "v1", dataset: str = DS) -> FileKey:
    return FileKey(dataset, "m/" + name, version)


def blob(seed: int, size: int) -> bytes:
    """Deterministic, distinct bytes for a test file."""
    out = bytearray()
    i = 0
    while len(out) < size:
        out += xxhash.xxh3_128_digest(f"{seed}:{i}".encode())
        i += 1
    return bytes(out[:size])


def put_file(store: CacheStore, fk: FileKey, data: bytes, *, pin: bool = False, expires_at: float = 0.0) -> bool:  # fmt: skip
    """Store every page of a file; True if all were accepted."""
    meta = PutMeta(len(data), PAGE, pin=pin, expires_at=expires_at)
    if len(data) <= PAGE:
        return store.put(fk.page(0), data, meta)
    ok = True
    for i in range(0, len(data), PAGE):
        ok = store.put(fk.page(i // PAGE), data[i : i + PAGE], meta) and ok
    return ok


def read_location(loc: Location) -> bytes:
    fd = os.open(loc.path, os.O_RDONLY)
    try:
        return os.pread(fd, loc.length, loc.offset)
    finally:
        os.close(fd)


def corrupt(loc: Location) -> None:
    """Flip a byte of the stored data behind the store's back."""
    fd = os.open(loc.path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, loc.offset)
        os.pwrite(fd, bytes([old[0] ^ 0xFF]), loc.offset)
    finally:
        os.close(fd)


class PageStoreConformance:
    """Behaviour every page store shares. Subclasses provide the ``factory`` fixture."""

    @pytest.fixture
    def open_store(self, factory: StoreFactory) -> Iterator[Callable[..., CacheStore]]:
        stores: list[CacheStore] = []

        def make(capacity: int = 64 << 20, eviction: str = "lru") -> CacheStore:
            store = factory(capacity=capacity, eviction=eviction)
            stores.append(store)
            return store

        yield make
        for store in stores:
            store.close()

    def test_small_round_trip(self, open_store: Callable[..., CacheStore]) -> None:
        store = open_store()
        fk, data = fkey("small"), blob(1, 1000)
        assert put_file(store, fk, data)
        assert store.contains(fk.page(0))
        assert store.get(fk.page(0)) == data
        assert store.get(fkey("other").page(0)) is None
        assert not store.contains(fkey("other").page(0))
        loc = store.locate(fk.page(0))
        assert loc is not None and read_location(loc) == data
        assert loc.checksum == xxhash.xxh3_64_intdigest(data)
        assert store.locate_file(fk) == loc
        assert store.locate_run(fk) is None  # a small file: its one page is located
        u = store.usage()
        assert (u.files, u.pages) == (1, 1) and u.used >= len(data)

    def test_empty_file(self, open_store: Callable[..., CacheStore]) -> None:
        store = open_store()
        fk = fkey("empty")
        assert put_file(store, fk, b"")
        assert store.get(fk.page(0)) == b""

    def test_large_round_trip(self, open_store: Callable[..., CacheStore]) -> None:
        store = open_store()
        fk, data = fkey("large"), blob(2, 3 * PAGE + PAGE // 2)
        meta = PutMeta(len(data), PAGE)
        for i in (3, 0, 2):
            assert store.put(fk.page(i), data[i * PAGE : (i + 1) * PAGE], meta)
        assert store.locate_file(fk) is None  # page 1 is missing
        assert store.locate_run(fk) is None
        assert store.get(fk.page(1)) is None
        assert store.put(fk.page(1), data[PAGE : 2 * PAGE], meta)
        for i in range(4):
            page = data[i * PAGE : (i + 1) * PAGE]
            assert store.get(fk.page(i)) == page
            loc = store.locate(fk.page(i))
            assert loc is not None and read_location(loc) == page
            assert loc.checksum == xxhash.xxh3_64_intdigest(page)
        whole = store.locate_file(fk)
        assert whole is not None and whole.length == len(data)
        assert read_location(whole) == data
        run = store.locate_run(fk)
        assert run is not None and run[0] == whole
        pages = [data[i * PAGE : (i + 1) * PAGE] for i in range(4)]
        assert run[1] == [xxhash.xxh3_64_intdigest(p) for p in pages]
        assert store.usage().pages == 4

    def test_put_validates_page_length(self, open_store: Callable[..., CacheStore]) -> None:
        store = open_store()
        with pytest.raises(InvalidArgument):
            store.put(fkey("x").page(0), b"abc", PutMeta(10, PAGE))

    def test_delete_file_and_dataset(self, open_store: Callable[..., CacheStore]) -> None:
        store = open_store()
        a, b, c = fkey("a"), fkey("b"), fkey("c", dataset="other")
        big = fkey("big")
        for i, fk in enumerate((a, b, c)):
            put_file(store, fk, blob(i, 2000))
        put_file(store, big, blob(9, 2 * PAGE + 1))
        by = store.usage().by_dataset
        assert by[DS].files == 3 and by[DS].bytes == 2 * 2000 + 2 * PAGE + 1
        assert by["other"].files == 1
        assert store.delete(a) == 2000
        assert store.get(a.page(0)) is None and not store.contains(a.page(0))
        assert store.delete(dataset=DS) == 2000 + 2 * PAGE + 1
        assert store.get(b.page(0)) is None and store.locate_file(big) is None
        assert store.get(c.page(0)) == blob(2, 2000)
        assert DS not in store.usage().by_dataset
        assert store.delete(fkey("never")) == 0

    def test_versions_isolate(self, open_store: Callable[..., CacheStore]) -> None:
        store = open_store()
        v1, v2 = fkey("f", "v1"), fkey("f", "v2")
        put_file(store, v1, blob(1, 100))
        assert store.get(v2.page(0)) is None
        put_file(store, v2, blob(2, 200))
        l1, l2 = fkey("L", "v1"), fkey("L", "v2")
        put_file(store, l1, blob(3, 2 * PAGE))
        assert store.get(l2.page(0)) is None and store.locate_file(l2) is None
        put_file(store, l2, blob(4, 2 * PAGE))
        assert store.get(v1.page(0)) == blob(1, 100)
        assert store.get(v2.page(0)) == blob(2, 200)
        loc1, loc2 = store.locate_file(l1), store.locate_file(l2)
        assert loc1 is not None and read_location(loc1) == blob(3, 2 * PAGE)
        assert loc2 is not None and read_location(loc2) == blob(4, 2 * PAGE)
        store.delete(v1)
        assert store.get(v2.page(0)) == blob(2, 200)

    def test_eviction_stays_within_capacity(self, open_store: Callable[..., CacheStore]) -> None:
        cap = 512 * KiB
        store = open_store(capacity=cap)
        for i in range(200):
            assert put_file(store, fkey(f"f{i}"), blob(i, 3000 + i))
            if i % 10 == 0:
                assert put_file(store, fkey(f"L{i}"), blob(i, 3 * PAGE))
            assert store.usage().used <= cap
        u = store.usage()
        assert u.evicted_bytes > 0
        assert store.get(fkey("f199").page(0)) == blob(199, 3199)

    @pytest.mark.parametrize("policy", ["lru", "lfu", "fifo"])
    def test_eviction_order(self, open_store: Callable[..., CacheStore], policy: str) -> None:
        """The policy's first victim leaves before its protected file does."""
        store = open_store(capacity=256 * KiB, eviction=policy)
        size = 4000
        for i in range(20):
            assert put_file(store, fkey(f"f{i}"), blob(i, size))
        # lru: f0 was read, so f1 is the least recently used
        # lfu: f1 read most, f0 never: f0 goes first
        # fifo: reads do not matter: f0 goes first, f1 next
        reads = {"lru": {0: 1}, "lfu": {1: 5, **{i: 1 for i in range(2, 20)}}, "fifo": {0: 5}}
        for i, n in reads[policy].items():
            for _ in range(n):
                assert store.get(fkey(f"f{i}").page(0)) is not None
        first, protected = {"lru": (1, 0), "lfu": (0, 1), "fifo": (0, 19)}[policy]
        for j in range(20, 400):
            put_file(store, fkey(f"f{j}"), blob(j, size))
            if not store.contains(fkey(f"f{first}").page(0)):
                break
        else:
            pytest.fail("nothing was evicted")
        assert store.get(fkey(f"f{protected}").page(0)) == blob(protected, size)
        assert store.usage().used <= 256 * KiB

    def test_pin_prevents_eviction(self, open_store: Callable[..., CacheStore]) -> None:
        cap = 256 * KiB
        store = open_store(capacity=cap)
        pinned = fkey("pinned")
        assert put_file(store, pinned, blob(0, 3000), pin=True)
        for i in range(150):
            put_file(store, fkey(f"f{i}"), blob(i, 3000))
        assert store.get(pinned.page(0)) == blob(0, 3000)
        # pin everything: eventually a put is refused instead of evicting pinned data
        accepted = [fkey(f"p{i}") for i in range(150) if put_file(store, fkey(f"p{i}"), blob(i, 3000), pin=True)]  # fmt: skip
        assert len(accepted) < 150
        assert all(store.contains(fk.page(0)) for fk in accepted)
        assert store.usage().used <= cap

    def test_expire(self, open_store: Callable[..., CacheStore]) -> None:
        store = open_store()
        now = time.time()
        a, b, big = fkey("a"), fkey("b"), fkey("big")
        put_file(store, a, blob(1, 100), expires_at=now + 100)
        put_file(store, b, blob(2, 100))
        put_file(store, big, blob(3, 2 * PAGE), expires_at=now + 100)
        assert store.expire(now + 50) == 0
        assert store.contains(a.page(0))
        assert store.expire(now + 200) == 100 + 2 * PAGE
        assert not store.contains(a.page(0)) and store.locate_file(big) is None
        assert store.get(b.page(0)) == blob(2, 100)

    def test_corruption_is_detected(self, open_store: Callable[..., CacheStore]) -> None:
        store = open_store()
        small, large = fkey("small"), fkey("large")
        put_file(store, small, blob(1, 1000))
        put_file(store, large, blob(2, 2 * PAGE))
        for key in (small.page(0), large.page(1)):
            loc = store.locate(key)
            assert loc is not None
            corrupt(loc)
        assert store.get(small.page(0)) is None
        assert store.get(large.page(1)) is None
        assert store.get(large.page(0)) == blob(2, 2 * PAGE)[:PAGE]
        assert store.usage().corrupt_pages == 2
        assert not store.contains(small.page(0)) and store.locate_file(large) is None
        # a reader that found a bad page reports it
        store.drop_corrupt(large.page(0))
        assert not store.contains(large.page(0)) and store.usage().corrupt_pages == 3

    def test_restart_serves_without_scanning(
        self, open_store: Callable[..., CacheStore], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store = open_store()
        files = {fkey(f"s{i}"): blob(i, 500 + i) for i in range(50)}
        files[fkey("big")] = blob(99, 3 * PAGE + 10)
        for fk, data in files.items():
            put_file(store, fk, data)
        before = store.usage()
        store.close()

        def no_scan(*args: object, **kwargs: object) -> None:
            raise AssertionError("a restart must not scan the cache directories")

        for mod, name in ((os, "walk"), (os, "scandir"), (os, "listdir"), (glob, "glob")):
            monkeypatch.setattr(mod, name, no_scan)
        store = open_store()
        monkeypatch.undo()
        after = store.usage()
        assert (after.used, after.files, after.pages) == (before.used, before.files, before.pages)
        for fk, data in files.items():
            if len(data) <= PAGE:
                assert store.get(fk.page(0)) == data
        loc = store.locate_file(fkey("big"))
        assert loc is not None and read_location(loc) == files[fkey("big")]
        assert put_file(store, fkey("new"), blob(7, 700))
        assert store.get(fkey("s3").page(0)) == files[fkey("s3")]

    def test_compaction_keeps_data_and_old_locations(
        self, open_store: Callable[..., CacheStore]
    ) -> None:
        store = open_store(capacity=512 * KiB)
        keep = fkey("keep")
        put_file(store, keep, blob(0, 3000))
        old = store.locate(keep.page(0))
        assert old is not None
        fd = os.open(old.path, os.O_RDONLY)
        try:
            others = [fkey(f"f{i}") for i in range(60)]
            for i, fk in enumerate(others):
                put_file(store, fk, blob(i + 1, 3000))
            used = store.usage().used
            for fk in others[:-5]:
                store.delete(fk)
            assert store.usage().used < used
            assert store.get(keep.page(0)) == blob(0, 3000)
            # whoever kept the old location and descriptor still reads the right bytes
            assert os.pread(fd, old.length, old.offset) == blob(0, 3000)
        finally:
            os.close(fd)
        for i, fk in enumerate(others[-5:]):
            assert store.get(fk.page(0)) == blob(56 + i, 3000)

"""The lean S3 listing (shoal.ufs.s3list through S3Store.ls/walk) against moto: exactly
the entries, in the same order, with the same sizes, versions and mtimes as the s3fs
path gives, over many pages and odd keys; a page that fails once is retried on its
own; a page that keeps failing fails the listing (never a shorter one)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from shoal.core.types import Mount
from shoal.errors import NotFound, RetryableStoreError, ShoalError
from shoal.testing.s3 import CountingProxy, MotoServer, s3_client, write_credentials_file
from shoal.ufs import open_store
from shoal.ufs.fsspec_driver import FsspecStore
from shoal.ufs.s3 import S3Store

pytestmark = pytest.mark.integration

KEYS = [
    *(f"root/big/f{i:04d}.bin" for i in range(57)),
    *(f"root/big/sub{i}/x" for i in range(5)),
    "root/big/sub0/",  # a marker inside a listed subdirectory
    "root/big/with space+plus=eq&amp.txt",
    "root/big/ünïcode ä.txt",
    "root/big/tab\there",
    "root/big/%25percent",
    "root/big/~tilde",
    "root/marker-only/",
    "root/top.txt",
]


class FailingProxy(CountingProxy):
    """Answers listing requests number ``fail`` (1-based, counted from ``reset``) with
    503 SlowDown, ``times`` times in a row."""

    fail = 0
    times = 0
    lists = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("list-type") == "2":
            self.lists += 1
            if self.fail and self.fail <= self.lists < self.fail + self.times:
                body = b"<Error><Code>SlowDown</Code><Message>slow</Message></Error>"
                return web.Response(status=503, body=body)
        return await super()._handle(request)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture()
def bucket(moto: MotoServer) -> str:
    name = f"lst-{uuid.uuid4().hex[:12]}"
    client = s3_client(moto.endpoint)
    client.create_bucket(Bucket=name)
    for i, key in enumerate(KEYS):
        client.put_object(Bucket=name, Key=key, Body=b"x" * (i % 7))
    return name


def _open(endpoint: str, bucket: str, tmp_path: Path, **extra: str) -> S3Store:
    creds = write_credentials_file(tmp_path / "creds.ini")
    opts = {"endpoint_url": endpoint, "credentials_file": creds, **extra}
    store = open_store(Mount("m", f"s3://{bucket}/root", opts))
    assert isinstance(store, S3Store)
    return store


def _plain(info: object) -> tuple[object, ...]:
    return tuple(
        getattr(info, f) for f in ("path", "size", "version", "mtime", "is_dir", "mtime_ns")
    )


@pytest.mark.parametrize("page", [1000, 7, 1])
async def test_lean_listing_is_the_s3fs_listing(
    moto: MotoServer, bucket: str, tmp_path: Path, page: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shoal.ufs.s3

    monkeypatch.setattr(shoal.ufs.s3, "_PAGE", page)
    store = _open(moto.endpoint, bucket, tmp_path)
    try:
        for rel in ("big", "", "big/sub1"):
            lean = await store.ls(rel)
            old = await FsspecStore.ls(store, rel)  # the s3fs path
            assert [_plain(i) for i in lean] == [_plain(i) for i in old]
        assert len(await store.ls("big")) == 57 + 5 + 5
        lean_walk = sorted([_plain(i) async for i in store.walk("big")])
        store._fast, store._fast_tried = None, True  # the s3fs path from here on
        old_walk = sorted([_plain(i) async for i in store.walk("big")])
        assert lean_walk == old_walk and len(lean_walk) == 57 + 5 + 5
    finally:
        await store.close()


async def test_edge_paths_answer_as_before(moto: MotoServer, bucket: str, tmp_path: Path) -> None:
    store = _open(moto.endpoint, bucket, tmp_path)
    try:
        with pytest.raises(NotFound):
            await store.ls("no/such/dir")
        with pytest.raises(ShoalError) as err:
            await store.ls("top.txt")
        assert err.value.errno == 20  # ENOTDIR
        with pytest.raises(ShoalError) as err2:  # only its marker: as the s3fs path says
            await FsspecStore.ls(store, "marker-only")
        with pytest.raises(type(err2.value)):
            await store.ls("marker-only")
    finally:
        await store.close()


async def test_a_page_failing_once_is_retried_alone(
    moto: MotoServer, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shoal.ufs.s3

    monkeypatch.setattr(shoal.ufs.s3, "_PAGE", 10)
    proxy = FailingProxy(moto.endpoint)
    with proxy:
        store = _open(proxy.endpoint, bucket, tmp_path)
        try:
            want = [_plain(i) for i in await store.ls("big")]
            pages = proxy.lists
            assert pages >= 7
            proxy.lists, proxy.fail, proxy.times = 0, 4, 1
            assert [_plain(i) for i in await store.ls("big")] == want
            assert proxy.lists == pages + 1  # page 4 twice, no page listed again
        finally:
            await store.close()


async def test_a_page_that_keeps_failing_fails_the_listing(
    moto: MotoServer, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shoal.ufs.s3

    monkeypatch.setattr(shoal.ufs.s3, "_PAGE", 10)
    proxy = FailingProxy(moto.endpoint)
    with proxy:
        proxy.fail, proxy.times = 3, 1000
        store = _open(proxy.endpoint, bucket, tmp_path, deadline="1.5")
        try:
            with pytest.raises(RetryableStoreError) as err:
                await store.ls("big")
            assert "SlowDown" in str(err.value) and "testing" not in str(err.value)
            with pytest.raises(RetryableStoreError):
                [i async for i in store.walk("big")]
        finally:
            await store.close()


def test_listing_in_a_new_event_loop(moto: MotoServer, bucket: str, tmp_path: Path) -> None:
    store = _open(moto.endpoint, bucket, tmp_path)
    for _ in range(2):  # the lean path's session is rebuilt for each loop
        assert len(asyncio.run(asyncio.wait_for(store.ls("big"), 10))) == 67

"""The ufs conformance suite (shoal.testing.ufs_conformance) over every driver: local
dir, S3 (moto server), WebHDFS (shoal.testing.webhdfs's double of the REST endpoint) and
memory:// through the generic fsspec driver; then what is particular to S3."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from shoal.core.types import Mount
from shoal.testing.s3 import CountingProxy, MotoServer, s3_client, write_credentials_file
from shoal.testing.ufs_conformance import FILES, Backend, UfsConformance, local_put, seed
from shoal.testing.webhdfs import WebHdfsDouble
from shoal.ufs import open_store

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-FAKE-0123456789"


@pytest.fixture(scope="module")
def webhdfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebHdfsDouble]:
    with WebHdfsDouble(tmp_path_factory.mktemp("webhdfs")) as double:
        yield double


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture(params=["local", "s3", "webhdfs", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind = request.param
    tag = uuid.uuid4().hex[:12]
    if kind == "local":
        put = local_put(tmp_path)
        mount = Mount("m", f"file://{tmp_path}")
    elif kind == "memory":
        mfs = fsspec.filesystem("memory")

        def put(rel: str, data: bytes) -> None:
            mfs.pipe_file(f"/conf-{tag}/{rel}", data)

        mount = Mount("m", f"memory://conf-{tag}")
    elif kind == "webhdfs":
        double: WebHdfsDouble = request.getfixturevalue("webhdfs_server")
        put = local_put(double.base / tag)
        mount = Mount("m", f"webhdfs://{double.hostport}/{tag}", {"user": "shoal", "timeout": "5"})
    else:
        moto: MotoServer = request.getfixturevalue("moto")
        client = s3_client(moto.endpoint)
        bucket = f"conf-{tag}"
        client.create_bucket(Bucket=bucket)

        def put(rel: str, data: bytes) -> None:
            client.put_object(Bucket=bucket, Key=f"root/{rel}", Body=data)

        creds = write_credentials_file(tmp_path / "creds.ini", key="AKIAFAKE", secret=SECRET)
        opts = {"endpoint_url": moto.endpoint, "credentials_file": creds, "region": "us-east-1"}
        mount = Mount("m", f"s3://{bucket}/root", opts)
    seed(put)
    store = open_store(mount)
    yield Backend(kind, store, put, secrets=(SECRET, "AKIAFAKE"))
    asyncio.run(store.close())


class TestEveryDriver(UfsConformance):
    """The suite, once per driver above."""


# -- S3 specifics ------------------------------------------------------------------


async def test_s3_ranged_reads_through_counting_proxy(moto: MotoServer, tmp_path: Path) -> None:
    bucket = f"cnt-{uuid.uuid4().hex[:12]}"
    s3_client(moto.endpoint).create_bucket(Bucket=bucket)
    s3_client(moto.endpoint).put_object(Bucket=bucket, Key="f.bin", Body=b"x" * 4096)
    creds = write_credentials_file(tmp_path / "c.ini")
    with CountingProxy(moto.endpoint) as proxy:
        store = open_store(
            Mount(
                "m", f"s3://{bucket}", {"endpoint_url": proxy.endpoint, "credentials_file": creds}
            )
        )
        version = (await store.info("f.bin")).version
        proxy.reset()
        for i in range(4):
            assert await store.read("f.bin", i * 1024, (i + 1) * 1024, version) == b"x" * 1024
        assert proxy.counts() == {"GET": 4, "GET_range": 4, "GET_range_bytes": 4096}
        assert proxy.counts_for(f"{bucket}/f.bin") == {
            "GET": 4,
            "GET_range": 4,
            "GET_range_bytes": 4096,
        }
        await store.close()


def test_s3_missing_credentials_file_is_a_credentials_error(tmp_path: Path) -> None:
    from shoal.errors import CredentialsError

    with pytest.raises(CredentialsError) as err:
        open_store(Mount("m", "s3://b/p", {"credentials_file": str(tmp_path / "none.ini")}))
    assert "none.ini" in str(err.value)
    (tmp_path / "bad.ini").write_text(f"[other]\naws_secret_access_key = {SECRET}\n")
    with pytest.raises(CredentialsError) as err2:
        open_store(Mount("m", "s3://b/p", {"credentials_file": str(tmp_path / "bad.ini")}))
    assert SECRET not in str(err2.value)


async def test_s3_walk_follows_pagination(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend.name != "s3":
        pytest.skip("S3 listing pages")
    import shoal.ufs.s3

    monkeypatch.setattr(shoal.ufs.s3, "_PAGE", 2)
    found = sorted([i.path async for i in backend.store.walk("")])
    assert found == sorted(FILES)

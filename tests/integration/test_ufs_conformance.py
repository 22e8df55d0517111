"""One conformance suite that every ufs driver runs: local dir, S3 (moto server),
WebHDFS (a test double of the REST endpoint, below) and memory:// through the generic
fsspec driver."""

from __future__ import annotations

import asyncio
import errno
import json
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import fsspec
import pytest

from shoal.core.types import Mount
from shoal.errors import InvalidArgument, NotFound, ShoalError, StaleVersion
from shoal.testing.s3 import CountingProxy, MotoServer, s3_client, write_credentials_file
from shoal.ufs import UnderStore, open_store

pytestmark = pytest.mark.integration

FILES = {
    "a.txt": b"hello world",
    "dir/b.bin": bytes(range(256)) * 4,
    "dir/sub/c.txt": b"c" * 10,
    "dir/sub/deeper/d": b"dd",
    "z.txt": b"last",
}
SECRET = "s3cr3t-FAKE-0123456789"


# -- a WebHDFS test double --------------------------------------------------------
# TEST DOUBLE for the WebHDFS REST protocol endpoint (there is no Hadoop on this
# machine): just enough of GETFILESTATUS, LISTSTATUS and OPEN (with the namenode ->
# datanode redirect) over a local directory, on 127.0.0.1 and a free port.


def _status(p: Path, suffix: str) -> dict[str, object]:
    st = p.stat()
    is_dir = p.is_dir()
    return {
        "pathSuffix": suffix,
        "type": "DIRECTORY" if is_dir else "FILE",
        "length": 0 if is_dir else st.st_size,
        "modificationTime": st.st_mtime_ns // 1_000_000,
        "accessTime": 0,
        "blockSize": 134217728,
        "owner": "shoal",
        "group": "shoal",
        "permission": "755",
        "replication": 1,
    }


class _WebHdfsHandler(BaseHTTPRequestHandler):
    base: Path

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _json(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        prefix = "/webhdfs/v1"
        if not url.path.startswith(prefix):
            return self._json(400, {})
        rel = urllib.parse.unquote(url.path[len(prefix) :]).strip("/")
        p = self.base / rel
        if not p.exists():
            exc = {"exception": "FileNotFoundException", "message": f"File does not exist: /{rel}"}
            return self._json(404, {"RemoteException": exc})
        op = q.get("op", "")
        if op == "GETFILESTATUS":
            return self._json(200, {"FileStatus": _status(p, "")})
        if op == "LISTSTATUS":
            items = (
                [_status(c, c.name) for c in sorted(p.iterdir())]
                if p.is_dir()
                else [_status(p, "")]
            )
            return self._json(200, {"FileStatuses": {"FileStatus": items}})
        if op == "OPEN" and "datanode" not in q:
            port = self.server.server_address[1]  # type: ignore[index]
            loc = f"http://127.0.0.1:{port}{url.path}?{url.query}&datanode=true"
            self.send_response(307)
            self.send_header("Location", loc)
            self.send_header("Content-Length", "0")
            return self.end_headers()
        if op == "OPEN":
            offset, length = int(q.get("offset", 0)), int(q.get("length", 1 << 62))
            with open(p, "rb") as f:
                f.seek(offset)
                data = f.read(length)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return None
        return self._json(
            400,
            {
                "RemoteException": {
                    "exception": "IllegalArgumentException",
                    "message": f"bad op {op}",
                }
            },
        )


@pytest.fixture(scope="module")
def webhdfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    base = tmp_path_factory.mktemp("webhdfs")
    handler = type("Handler", (_WebHdfsHandler,), {"base": base})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", base
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


# -- one backend per parameter ------------------------------------------------------


@dataclass
class Backend:
    name: str
    store: UnderStore
    put: Callable[[str, bytes], None]


def _local_put(root: Path) -> Callable[[str, bytes], None]:
    def put(rel: str, data: bytes) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    return put


@pytest.fixture(params=["local", "s3", "webhdfs", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind = request.param
    tag = uuid.uuid4().hex[:12]
    if kind == "local":
        put = _local_put(tmp_path)
        mount = Mount("m", f"file://{tmp_path}")
    elif kind == "memory":
        mfs = fsspec.filesystem("memory")

        def put(rel: str, data: bytes) -> None:
            mfs.pipe_file(f"/conf-{tag}/{rel}", data)

        mount = Mount("m", f"memory://conf-{tag}")
    elif kind == "webhdfs":
        hostport, base = request.getfixturevalue("webhdfs_server")
        put = _local_put(base / tag)
        mount = Mount("m", f"webhdfs://{hostport}/{tag}", {"user": "shoal", "timeout": "5"})
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
    for rel, data in FILES.items():
        put(rel, data)
    store = open_store(mount)
    yield Backend(kind, store, put)
    asyncio.run(store.close())


# -- the suite -------------------------------------------------------------------


async def test_info_file_and_dir(backend: Backend) -> None:
    f = await backend.store.info("dir/b.bin")
    assert (f.path, f.size, f.is_dir) == ("dir/b.bin", 1024, False)
    assert f.version
    d = await backend.store.info("dir")
    assert (d.path, d.is_dir) == ("dir", True)
    root = await backend.store.info("")
    assert root.is_dir and root.path == ""


async def test_ls_sorted_with_sizes_and_types(backend: Backend) -> None:
    top = await backend.store.ls("")
    assert [(i.path, i.is_dir) for i in top] == [("a.txt", False), ("dir", True), ("z.txt", False)]
    assert top[0].size == 11 and top[2].size == 4
    sub = await backend.store.ls("/dir/")
    assert [(i.path, i.size, i.is_dir) for i in sub] == [
        ("dir/b.bin", 1024, False),
        ("dir/sub", 0, True),
    ]


async def test_walk_finds_every_nested_file(backend: Backend) -> None:
    found = {i.path: i.size async for i in backend.store.walk("")}
    assert found == {k: len(v) for k, v in FILES.items()}
    below = sorted([i.path async for i in backend.store.walk("dir/sub")])
    assert below == ["dir/sub/c.txt", "dir/sub/deeper/d"]
    assert [i.path async for i in backend.store.walk("a.txt")] == ["a.txt"]


async def test_read_ranges(backend: Backend) -> None:
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


async def test_version_stable_then_changes(backend: Backend) -> None:
    v1 = (await backend.store.info("a.txt")).version
    assert (await backend.store.info("a.txt")).version == v1
    assert {i.path: i.version for i in await backend.store.ls("")}["a.txt"] == v1
    assert await backend.store.read("a.txt", 0, 5, v1) == b"hello"
    backend.put("a.txt", b"a different, longer body")
    v2 = (await backend.store.info("a.txt")).version
    assert v2 != v1
    assert await backend.store.read("a.txt", 0, 11, v2) == b"a different"


async def test_read_head_agrees_with_info_and_read(backend: Backend) -> None:
    """One request's info and bytes must match info() and read(): pages are keyed by it."""
    s, data = backend.store, FILES["dir/b.bin"]
    info, head = await s.read_head("dir/b.bin", 100)
    want = await s.info("dir/b.bin")
    assert (info.size, info.version) == (want.size, want.version)
    assert head == data[:100]
    assert await s.read("dir/b.bin", 100, 200, info.version) == data[100:200]
    whole_info, whole = await s.read_head("a.txt", 1 << 20)
    assert whole == b"hello world" and whole_info.size == 11


async def test_read_with_stale_version_raises(backend: Backend) -> None:
    v1 = (await backend.store.info("z.txt")).version
    backend.put("z.txt", b"changed and longer")
    with pytest.raises(StaleVersion):
        await backend.store.read("z.txt", 0, 4, v1)


async def test_missing_paths_are_not_found(backend: Backend) -> None:
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


async def test_ls_of_a_file_is_not_a_directory(backend: Backend) -> None:
    with pytest.raises(ShoalError) as err:
        await backend.store.ls("a.txt")
    assert err.value.errno == errno.ENOTDIR


async def test_paths_cannot_escape_the_root(backend: Backend) -> None:
    for bad in ("../x", "dir/../../x", "a\x00b"):
        with pytest.raises(InvalidArgument):
            await backend.store.info(bad)


def test_store_survives_a_new_event_loop(backend: Backend) -> None:
    async def use() -> bytes:
        return await backend.store.read("a.txt", 0, 5)

    # a store reused by a second asyncio.run (or after fork) must rebuild, not hang
    assert asyncio.run(asyncio.wait_for(use(), 10)) == b"hello"
    assert asyncio.run(asyncio.wait_for(use(), 10)) == b"hello"


async def test_no_secret_in_messages_repr_or_describe(backend: Backend) -> None:
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
    assert all(SECRET not in t and "AKIAFAKE" not in t for t in texts), texts
    assert s.describe().startswith(s.scheme + "://")


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
        assert proxy.counts() == {"GET": 4, "GET_range": 4}
        assert proxy.counts_for(f"{bucket}/f.bin") == {"GET": 4, "GET_range": 4}
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

"""The WebHDFS gateway as a real process over a real cluster, through fsspec's webhdfs,
HdfsCLI and raw HTTP (Hadoop's exact JSON shapes, RemoteException, redirects), plus
the refusals: traversal, NUL, oversized and malformed requests, unknown operations,
users outside the datasets, bad tokens, and writes to a read-only dataset."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import crc32c
import hdfs
import pytest
import requests
from fsspec.implementations.webhdfs import WebHDFS

from shoal.gateway.webhdfs_auth import make_token

pytestmark = pytest.mark.integration

BLOCK = 4 << 20  # the large file of gw_dataset (several MiB) is more than one block
BIG = "data/big/large.bin"
ODD = "data/odd/sp ace+plus%pct ü.txt"


class WebHdfs:
    def __init__(
        self, url: str, proc: subprocess.Popen[str], ds: str, keys: dict[str, tuple[str, str]]
    ) -> None:
        self.url, self.proc, self.ds, self.keys = url, proc, ds, keys
        self.url_file: Path | None = None
        self.host, self.port = urlsplit(url).hostname or "", urlsplit(url).port or 0

    def api(self, path: str) -> str:
        return f"{self.url}/webhdfs/v1{quote(path)}"

    def get(
        self, path: str, op: str, user: str | None = "reader", **params: Any
    ) -> requests.Response:
        if user:
            params["user.name"] = user
        return requests.get(
            self.api(path), params={"op": op, **params}, timeout=30, allow_redirects=False
        )

    def token(self, user: str) -> str:
        key, secret = self.keys[user]
        return make_token(key, secret, 3600)


@pytest.fixture(scope="module")
def gw(gw_dataset: Any, tmp_path_factory: pytest.TempPathFactory, gwkit: Any) -> Iterator[WebHdfs]:
    d = tmp_path_factory.mktemp("webhdfs")
    ds = gw_dataset.dataset
    creds = gwkit.write_credentials(
        d / "credentials.toml", {"reader": [ds], "writer": [ds], "stranger": ["elsewhere"]}
    )
    args = [
        "--credentials",
        str(creds),
        "--trust-user-name",
        "--writable",
        ds,
        "--block-size",
        str(BLOCK),
        "--list-limit",
        "25",
        "--spool-dir",
        str(d),
        "--url-file",
        str(d / "url"),
    ]
    url, proc = gwkit.start_gateway("webhdfs", gw_dataset.cluster.master_url, args, d / "gw.log")
    try:
        w = WebHdfs(url, proc, ds, gwkit.KEYS)
        w.url_file = d / "url"
        yield w
    finally:
        gwkit.stop_gateway(proc)


def spans(size: int) -> list[tuple[int, int]]:
    """(offset, length) of each block of a file of ``size``."""
    out = [(o, min(BLOCK, size - o)) for o in range(0, size, BLOCK)]
    assert len(out) > 1, "the test wants a file of more than one block"
    return out


def hdfs_checksum(data: bytes, block: int) -> str:
    """HDFS's MD5-of-MD5-of-CRC32C, written out independently of the gateway."""
    md5s = b""
    for b in range(0, len(data), block):
        chunk = data[b : b + block]
        crcs = b"".join(
            crc32c.crc32c(chunk[i : i + 512]).to_bytes(4, "big") for i in range(0, len(chunk), 512)
        )
        md5s += hashlib.md5(crcs).digest()
    per_block = block // 512 if len(data) > block else 0
    head = (512).to_bytes(4, "big") + per_block.to_bytes(8, "big")
    return (head + hashlib.md5(md5s).digest()).hex()


# -- raw HTTP: Hadoop's shapes ---------------------------------------------------------


def test_filestatus_and_listing_shapes(gw: WebHdfs, gw_dataset: Any) -> None:
    r = gw.get(f"/{gw.ds}/data/big/large.bin", "GETFILESTATUS")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
    st = r.json()["FileStatus"]
    for f in (
        "pathSuffix",
        "type",
        "length",
        "accessTime",
        "modificationTime",
        "blockSize",
        "replication",
        "permission",
        "owner",
        "group",
        "fileId",
    ):
        assert f in st, f
    assert (st["type"], st["length"], st["blockSize"], st["pathSuffix"]) == (
        "FILE",
        len(gw_dataset.files[BIG]),
        BLOCK,
        "",
    )
    assert st["modificationTime"] > 1_600_000_000_000  # milliseconds
    r = gw.get(f"/{gw.ds}/data", "LISTSTATUS")
    names = {s["pathSuffix"]: s["type"] for s in r.json()["FileStatuses"]["FileStatus"]}
    assert names == {"000": "DIRECTORY", "big": "DIRECTORY", "odd": "DIRECTORY"}
    # the dataset's root lists its mounts, the root lists the datasets the user may see
    r = gw.get(f"/{gw.ds}", "LISTSTATUS")
    assert [s["pathSuffix"] for s in r.json()["FileStatuses"]["FileStatus"]] == ["data"]
    r = gw.get("/", "LISTSTATUS")
    assert [s["pathSuffix"] for s in r.json()["FileStatuses"]["FileStatus"]] == [gw.ds]
    # a file lists as itself
    r = gw.get(f"/{gw.ds}/data/big/large.bin", "LISTSTATUS")
    assert [s["length"] for s in r.json()["FileStatuses"]["FileStatus"]] == [
        len(gw_dataset.files[BIG])
    ]


def test_liststatus_batch_pages_with_lowercase_startafter(gw: WebHdfs, gw_dataset: Any) -> None:
    want = sorted(k.rsplit("/", 1)[1] for k in gw_dataset.files if k.startswith("data/000/"))
    got: list[str] = []
    after = ""
    while True:
        params = {"startafter": after} if after else {}
        r = gw.get(f"/{gw.ds}/data/000", "liststatus_batch", **params)  # op case-insensitive
        listing = r.json()["DirectoryListing"]
        page = [s["pathSuffix"] for s in listing["partialListing"]["FileStatuses"]["FileStatus"]]
        assert len(page) <= 25
        got += page
        if listing["remainingEntries"] == 0:
            break
        assert listing["remainingEntries"] == len(want) - len(got)
        after = page[-1]
    assert got == want and len(want) == 60


def test_open_redirects_like_a_namenode_or_answers_with_length(
    gw: WebHdfs, gw_dataset: Any
) -> None:
    data = gw_dataset.files["data/big/large.bin"]
    path = f"/{gw.ds}/data/big/large.bin"
    r = gw.get(path, "OPEN")  # Hadoop's first step: no length, must be a 307
    assert r.status_code == 307
    loc = r.headers["Location"]
    assert loc.startswith(gw.url) and "user.name=reader" in loc
    body = requests.get(loc, timeout=30)  # cold: streamed through the client
    assert body.headers["Content-Type"] == "application/octet-stream"
    assert body.content == data
    # now cached on a worker of this host: sent from its file with sendfile
    body = requests.get(loc + "&offset=5000000", timeout=30)  # Hadoop appends its offset
    assert body.content == data[5_000_000:]
    r = gw.get(path, "OPEN", offset=100, length=1000)  # fsspec's form: answered at once
    assert r.status_code == 200 and r.content == data[100:1100]
    r = gw.get(path, "OPEN", offset=len(data) - 10, length=1000)
    assert r.content == data[-10:]
    r = gw.get(path, "OPEN", noredirect="true")
    assert r.status_code == 200 and r.json()["Location"].startswith(gw.url)
    # the raw UTF-8 path Hadoop sends (not percent-encoded) reads the same file
    with socket.create_connection((gw.host, gw.port), timeout=10) as s:
        target = f"/webhdfs/v1/{gw.ds}/data/odd/sp%20ace+plus%25pct%20ü.txt?op=OPEN&length=100&user.name=reader"
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    assert raw.startswith(b"HTTP/1.1 200") and raw.endswith(gw_dataset.files[ODD])


def test_checksum_is_hdfs_md5_of_md5_of_crc32c(gw: WebHdfs, gw_dataset: Any) -> None:
    for key in ("data/big/large.bin", "data/000/f000003.bin"):
        r = gw.get(f"/{gw.ds}/{key}", "GETFILECHECKSUM")
        assert r.status_code == 307  # Hadoop's client expects the DataNode step
        ck = requests.get(r.headers["Location"], timeout=30).json()["FileChecksum"]
        data = gw_dataset.files[key]
        multi = len(data) > BLOCK
        assert ck["algorithm"] == f"MD5-of-{BLOCK // 512 if multi else 0}MD5-of-512CRC32C"
        assert ck["length"] == 28 and ck["bytes"] == hdfs_checksum(data, BLOCK)


def test_block_locations_name_the_owning_workers(gw: WebHdfs, gw_dataset: Any) -> None:
    path = f"/{gw.ds}/data/big/large.bin"
    with gw_dataset.cluster.client() as c:
        ds = c.dataset(gw.ds)
        owners = c._run(c.aio.owners(ds, "data/big/large.bin"))[: ds.policy.replicas]
    want = [f"{w.host}:{w.port}" for w in owners]
    size = len(gw_dataset.files[BIG])
    r = gw.get(path, "GETFILEBLOCKLOCATIONS", offset=0, length=size)
    locs = r.json()["BlockLocations"]["BlockLocation"]
    assert [(b["offset"], b["length"]) for b in locs] == spans(size)
    assert all(b["names"] == want and b["hosts"] == [w.host for w in owners] for b in locs)
    r = gw.get(path, "GETFILEBLOCKLOCATIONS", offset=BLOCK + 1, length=10)
    assert [b["offset"] for b in r.json()["BlockLocations"]["BlockLocation"]] == [BLOCK]
    lb = gw.get(path, "GET_BLOCK_LOCATIONS", offset=0, length=size).json()["LocatedBlocks"]
    assert lb["fileLength"] == size and len(lb["locatedBlocks"]) == len(spans(size))
    loc = lb["locatedBlocks"][1]
    assert loc["startOffset"] == BLOCK and loc["block"]["numBytes"] == BLOCK
    assert [f"{n['ipAddr']}:{n['xferPort']}" for n in loc["locations"]] == want


def test_summary_home_defaults_and_status(gw: WebHdfs, gw_dataset: Any) -> None:
    cs = gw.get(f"/{gw.ds}/data", "GETCONTENTSUMMARY").json()["ContentSummary"]
    assert cs["fileCount"] == len(gw_dataset.files)
    assert cs["length"] == sum(len(v) for v in gw_dataset.files.values())
    assert cs["directoryCount"] == 4  # data, 000, big, odd
    assert gw.get("/", "GETHOMEDIRECTORY").json() == {"Path": "/"}
    d = gw.get("/", "GETSERVERDEFAULTS").json()["FsServerDefaults"]
    assert d["checksumType"] == 2 and d["blockSize"] == BLOCK and d["bytesPerChecksum"] == 512
    st = gw.get("/", "GETSTATUS").json()["FsStatus"]
    assert st["capacity"] > 0 and st["remaining"] == st["capacity"] - st["used"]


# -- fsspec and HdfsCLI ----------------------------------------------------------------


def test_fsspec_webhdfs(gw: WebHdfs, gw_dataset: Any) -> None:
    fs = WebHDFS(gw.host, port=gw.port, token=gw.token("reader"), use_listings_cache=False)
    root = f"/{gw.ds}/data"
    found = {p[len(root) + 1 :] for p in fs.find(root)}
    assert found == {k[len("data/") :] for k in gw_dataset.files}
    assert fs.cat(f"/{gw.ds}/{ODD}") == gw_dataset.files[ODD]
    data = gw_dataset.files["data/big/large.bin"]
    with fs.open(f"{root}/big/large.bin", "rb", block_size=1 << 20) as f:
        f.seek(len(data) // 2)
        assert f.read(3_000_000) == data[len(data) // 2 : len(data) // 2 + 3_000_000]
    assert fs.info(f"{root}/big/large.bin")["size"] == len(data)
    assert fs.content_summary(root)["fileCount"] == len(gw_dataset.files)
    assert fs.ukey(f"{root}/big/large.bin")["bytes"] == hdfs_checksum(data, BLOCK)


def test_hdfscli(gw: WebHdfs, gw_dataset: Any) -> None:
    c = hdfs.InsecureClient(gw.url, user="reader")
    root = f"/{gw.ds}/data"
    walked = {f"{d}/{f}"[len(root) + 1 :] for d, _, files in c.walk(root) for f in files}
    assert walked == {k[len("data/") :] for k in gw_dataset.files}
    data = gw_dataset.files["data/big/large.bin"]
    with c.read(f"{root}/big/large.bin", offset=1234, length=4_000_000) as r:
        assert r.read() == data[1234:4_001_234]
    with c.read(f"/{gw.ds}/{ODD}") as r:
        assert r.read() == gw_dataset.files[ODD]
    assert c.status(f"{root}/big")["type"] == "DIRECTORY"
    assert c.content(f"{root}/big")["length"] == len(data)
    assert c.checksum(f"{root}/big/large.bin")["bytes"] == hdfs_checksum(data, BLOCK)
    tc = hdfs.TokenClient(gw.url, gw.token("reader"))
    assert sorted(tc.list(root)) == ["000", "big", "odd"]


def test_metrics_and_url_file(gw: WebHdfs) -> None:
    assert gw.url_file is not None and gw.url_file.read_text().strip() == gw.url
    gw.get(f"/{gw.ds}/data/big/large.bin", "OPEN", offset=0, length=1000)
    text = requests.get(gw.url + "/metrics", timeout=10).text
    assert 'shoal_gateway_requests_total{gateway="webhdfs",op="OPEN",status="200"}' in text
    assert 'shoal_gateway_bytes_total{gateway="webhdfs",op="OPEN"}' in text
    assert (
        'shoal_gateway_request_seconds_bucket{gateway="webhdfs",le="0.005",op="LISTSTATUS"}' in text
    )


def test_tls_and_anonymous_access(
    gw_dataset: Any,
    tmp_path_factory: pytest.TempPathFactory,
    gwkit: Any,
    monkeypatch: pytest.MonkeyPatch,
    tls: tuple[Path, Path],
) -> None:
    """--tls-cert/--tls-key: redirects stay on https; --allow-anonymous reads without a
    user or token."""
    cert, key = tls
    d = tmp_path_factory.mktemp("webhdfs-tls")
    args = ["--allow-anonymous", "--tls-cert", str(cert), "--tls-key", str(key)]
    url, proc = gwkit.start_gateway("webhdfs", gw_dataset.cluster.master_url, args, d / "gw.log")
    try:
        assert url.startswith("https://")
        api = f"{url}/webhdfs/v1/{gw_dataset.dataset}/{BIG}"
        r = requests.get(api, params={"op": "OPEN"}, verify=str(cert), allow_redirects=False)
        assert r.status_code == 307 and r.headers["Location"].startswith(url)
        body = requests.get(r.headers["Location"], verify=str(cert), timeout=30)
        assert body.content == gw_dataset.files[BIG]
        host, port = urlsplit(url).hostname, urlsplit(url).port
        for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # they beat session.verify
            monkeypatch.delenv(var, raising=False)
        fs = WebHDFS(host, port=port, use_https=True, session_verify=str(cert))
        assert fs.cat(f"/{gw_dataset.dataset}/{ODD}") == gw_dataset.files[ODD]
    finally:
        gwkit.stop_gateway(proc)


# -- refusals --------------------------------------------------------------------------


def _remote(r: requests.Response, status: int, exception: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["Content-Type"].startswith("application/json")
    e = r.json()["RemoteException"]
    assert e["exception"] == exception and e["javaClassName"].endswith(exception) and e["message"]
    return dict(e)


def _raw(gw: WebHdfs, target: bytes, method: bytes = b"GET", headers: bytes = b"") -> bytes:
    """One request on its own connection; the answer up to the server's close (or, for
    an answer to a request too malformed to read its headers, what came first)."""
    with socket.create_connection((gw.host, gw.port), timeout=10) as s:
        s.sendall(method + b" " + target + b" HTTP/1.1\r\nHost: x\r\n" + headers)
        s.sendall(b"Connection: close\r\n\r\n")
        out = s.recv(65536)
        try:
            s.settimeout(2)
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out


def test_traversal_nul_and_malformed_paths(gw: WebHdfs) -> None:
    u = "user.name=reader&op=GETFILESTATUS"
    for target in (
        f"/webhdfs/v1/{gw.ds}/data/../../etc/passwd?{u}",
        f"/webhdfs/v1/{gw.ds}/data/%2e%2e/%2E%2E/etc?{u}",
        f"/webhdfs/v1/{gw.ds}/data/./000?{u}",
        f"/webhdfs/v1/{gw.ds}/data/f%00x?{u}",
    ):
        raw = _raw(gw, target.encode())
        assert raw.startswith(b"HTTP/1.1 400"), (target, raw[:200])
        body = json.loads(raw.split(b"\r\n\r\n", 1)[1])
        assert body["RemoteException"]["exception"] == "InvalidPathException", target
    r = requests.get(f"{gw.url}/webhdfs/v1/{gw.ds}/data/%ff%fe?op=GETFILESTATUS", timeout=10)
    _remote(r, 400, "IllegalArgumentException")


def test_oversized_and_malformed_requests(gw: WebHdfs) -> None:
    path = f"/{gw.ds}/data/big/large.bin"
    r = gw.get(path, "OPEN", offset="-5", length=10)
    _remote(r, 400, "IllegalArgumentException")
    r = gw.get(path, "OPEN", offset="ten", length=10)
    _remote(r, 400, "IllegalArgumentException")
    r = gw.get(path, "GETFILESTATUS", startafter="x" * 5000)
    _remote(r, 400, "IllegalArgumentException")
    many = {f"p{i}": "1" for i in range(100)}
    r = gw.get(path, "GETFILESTATUS", **many)
    _remote(r, 400, "IllegalArgumentException")
    raw = _raw(gw, f"/webhdfs/v1/{gw.ds}/{'a' * 20000}?op=GETFILESTATUS".encode())
    assert raw.startswith((b"HTTP/1.1 400", b"HTTP/1.0 400", b"HTTP/1.1 414")), raw[:100]
    # a write body declared larger than the gateway takes: refused before it is read
    target = f"/webhdfs/v1/{gw.ds}/data/uploads/huge.bin?op=CREATE&user.name=writer&data=true"
    raw = _raw(gw, target.encode(), b"PUT", f"Content-Length: {10 << 40}\r\n".encode())
    assert raw.startswith(b"HTTP/1.1 413"), raw[:200]
    assert gw.get(f"/{gw.ds}/data", "LISTSTATUS").status_code == 200  # still serving


def test_unknown_op_missing_file_and_outsiders(gw: WebHdfs) -> None:
    e = _remote(gw.get(f"/{gw.ds}/data", "NOSUCHOP"), 400, "IllegalArgumentException")
    assert 'Invalid value for webhdfs parameter "op"' in e["message"]
    _remote(gw.get(f"/{gw.ds}/data/nope.bin", "GETFILESTATUS"), 404, "FileNotFoundException")
    _remote(gw.get(f"/{gw.ds}/data/nope.bin", "OPEN", length=1), 404, "FileNotFoundException")
    _remote(gw.get(f"/{gw.ds}/data/000", "OPEN", length=1), 404, "FileNotFoundException")
    _remote(gw.get("/no-such-ds/data", "LISTSTATUS"), 403, "AccessControlException")
    # a user outside the dataset, by name and by token; anonymous; a forged token
    _remote(gw.get(f"/{gw.ds}/data", "LISTSTATUS", user="stranger"), 403, "AccessControlException")
    r = gw.get(f"/{gw.ds}/data", "LISTSTATUS", user=None, delegation=gw.token("stranger"))
    _remote(r, 403, "AccessControlException")
    _remote(gw.get(f"/{gw.ds}/data", "LISTSTATUS", user=None), 403, "AccessControlException")
    forged = gw.token("reader")[:-4] + "AAAA"
    e = _remote(
        gw.get(f"/{gw.ds}/data", "LISTSTATUS", user=None, delegation=forged),
        403,
        "AccessControlException",
    )
    assert gw.keys["reader"][1] not in e["message"] and forged not in e["message"]
    expired = make_token(gw.keys["reader"][0], gw.keys["reader"][1], 10, now=1_000_000)
    r = gw.get(f"/{gw.ds}/data", "LISTSTATUS", user=None, delegation=expired)
    _remote(r, 403, "AccessControlException")
    assert gw.get("/", "LISTSTATUS", user="stranger").json()["FileStatuses"]["FileStatus"] == []
    # a reader may not write; unsupported namespace changes say so
    r = requests.put(
        gw.api(f"/{gw.ds}/data/new.txt"),
        params={"op": "CREATE", "user.name": "reader"},
        timeout=10,
        allow_redirects=False,
    )
    _remote(r, 403, "AccessControlException")
    r = requests.put(
        gw.api(f"/{gw.ds}/data/d"), params={"op": "MKDIRS", "user.name": "writer"}, timeout=10
    )
    _remote(r, 400, "UnsupportedOperationException")


# -- writes (last: they change the dataset) --------------------------------------------


def test_writes_through_fsspec_and_hdfscli(gw: WebHdfs) -> None:
    fs = WebHDFS(gw.host, port=gw.port, user="writer", use_listings_cache=False)
    path = f"/{gw.ds}/data/uploads/ckpt-ü.bin"
    payload = bytes(range(256)) * 5000
    with fs.open(path, "wb") as f:
        f.write(payload)
    assert fs.cat(path) == payload
    c = hdfs.InsecureClient(gw.url, user="writer")
    c.write(f"/{gw.ds}/data/uploads/b.txt", data=b"first\n")
    c.write(f"/{gw.ds}/data/uploads/b.txt", data=b"second\n", append=True)
    with c.read(f"/{gw.ds}/data/uploads/b.txt") as r:
        assert r.read() == b"first\nsecond\n"
    with pytest.raises(hdfs.HdfsError, match="already exists"):
        c.write(f"/{gw.ds}/data/uploads/b.txt", data=b"again")
    st = gw.get(f"/{gw.ds}/data/uploads", "LISTSTATUS", user="writer").json()
    perms = {s["pathSuffix"]: s["permission"] for s in st["FileStatuses"]["FileStatus"]}
    assert perms == {"b.txt": "644", "ckpt-ü.bin": "644"}  # writable here


def test_delete_through_hdfscli(gw: WebHdfs) -> None:
    c = hdfs.InsecureClient(gw.url, user="writer")
    c.write(f"/{gw.ds}/data/uploads/gone.txt", data=b"short-lived")
    assert c.delete(f"/{gw.ds}/data/uploads/gone.txt") is True
    assert c.status(f"/{gw.ds}/data/uploads/gone.txt", strict=False) is None
    assert c.delete(f"/{gw.ds}/data/uploads/gone.txt") is False

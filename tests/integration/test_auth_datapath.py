"""Tokens on the data path (issue 13 item 3), against a real cluster started with a
secret: every data-path op over TCP and over the Unix socket refused without a token,
with a forged (another secret's), an expired or a garbage token, and with a reader
token for another dataset; served with a reader token for its own dataset (bytes and
descriptors); garbage, truncated and silent handshakes neither crash nor stall the
worker; the refusals are logged and counted, the secret and the tokens are never
written down; and a token is verified once per connection, not per request."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.client.conn import Pool
from shoal.core.tokens import ADMIN, READER, WORKER, load_secret, mint
from shoal.errors import PermissionDenied, Unauthenticated
from shoal.proto import wire
from shoal.proto.messages import (
    BatchRequest,
    DropRequest,
    HelloRequest,
    ListRequest,
    LocateDirRequest,
    LocateRequest,
    ReadRequest,
    Request,
    StatRequest,
    TouchRequest,
    encode_request,
)
from shoal.testing import wire as raw
from shoal.testing.cli import assert_one_line_error, cli_env, run_cli
from shoal.testing.cluster import S3_ENV, TestCluster, sample_files
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration

Addr = tuple[str, int] | str
FILES_A = sample_files(6, 100, 3000, seed=131)
FILES_B = sample_files(3, 100, 3000, seed=132)
HELLO_S = 2.0
LIVE_S = 2.0


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, moto: MotoServer) -> Iterator[TestCluster]:
    env = {**S3_ENV, "SHOAL_WIRE_HELLO_TIMEOUT": str(HELLO_S)}
    c = TestCluster(tmp_path_factory.mktemp("authdp") / "c", workers=1, env=env, auth=True)
    c.start()
    try:
        make_bucket(moto.endpoint, "authdp-a", FILES_A)
        make_bucket(moto.endpoint, "authdp-b", FILES_B)
        from shoal.core.types import Mount

        with c.client() as client:  # the admin's token
            for name, bucket, files in (("a", "authdp-a", FILES_A), ("b", "authdp-b", FILES_B)):
                mount = Mount("data", f"s3://{bucket}", {"endpoint_url": moto.endpoint})
                client.create_dataset(name, [mount], {"staleness": "never"})
                for k, v in files.items():  # cached: LOCATE and LOCATE_DIR hand fds over
                    assert client.read(f"/{name}/data/{k}") == v
        yield c
    finally:
        c.stop()


def _addrs(c: TestCluster) -> dict[str, Addr]:
    i = json.loads((c.worker_dir(0) / "worker.json").read_text())
    return {"tcp": (i["host"], int(i["port"])), "unix": str(i["uds"])}


def _tokens(c: TestCluster) -> dict[str, str]:
    secret = load_secret(c.secret_file)
    return {
        "reader_a": mint(secret, "alice", READER, ["a"]),
        "reader_b": mint(secret, "bob", READER, ["b"]),
        "worker": mint(secret, "peer", WORKER),
        "admin": c.admin_token_file.read_text().strip(),
        "forged": mint(b"another-cluster-secret-0123456789", "mallory", ADMIN),
        "expired": mint(secret, "late", READER, ["a"], ttl=10, now=time.time() - 3600),
        "garbage": "not.a.token",
    }


def _metrics(c: TestCluster) -> str:
    i = json.loads((c.worker_dir(0) / "worker.json").read_text())
    with urllib.request.urlopen(f"http://{i['host']}:{i['metrics_port']}/metrics") as r:
        out: str = r.read().decode()
    return out


def _metric(c: TestCluster, sample: str) -> float:
    for line in _metrics(c).splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{sample} not exported")


def _ops(dataset: str) -> dict[str, Request[Any]]:
    """One request of every data-path op naming ``dataset`` (a cached small file)."""
    path = "data/" + next(iter(FILES_A if dataset == "a" else FILES_B))
    return {
        "STAT": StatRequest(dataset, path),
        "LIST": ListRequest(dataset, "data"),
        "READ": ReadRequest(dataset, path, 0, -1),
        "BATCH": BatchRequest(dataset, (path,)),
        "LOCATE": LocateRequest(dataset, path, None, 0, -1, True),
        "LOCATE_DIR": LocateDirRequest(dataset, None),
        "TOUCH": TouchRequest(dataset, ((path, None, 1, 10),)),
        "DROP": DropRequest(dataset, path, "no-such-version", 0),
    }


def _open(addr: Addr, timeout: float = 5.0) -> socket.socket:
    fam = socket.AF_UNIX if isinstance(addr, str) else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(addr)
    return s


def _closed(s: socket.socket, timeout: float = 5.0) -> bool:
    """Whether the worker closes ``s`` within ``timeout`` (unread answers skipped)."""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def _greeted(addr: Addr, token: str) -> socket.socket:
    s = _open(addr)
    raw.send(s, HelloRequest(token=token), 1)
    r = raw.read_reply(s)
    assert r.ok, r.meta
    return s


@pytest.mark.parametrize("way", ["tcp", "unix"])
def test_every_op_is_refused_without_a_good_token(secured: TestCluster, way: str) -> None:
    c = secured
    addr = _addrs(c)[way]
    t = _tokens(c)
    refused_before = _metrics(c)
    for name, req in _ops("a").items():
        # no HELLO at all: refused as before (the protocol error), nothing served
        with _open(addr) as s:
            raw.send(s, req, 2)
            r = raw.read_reply(s, want_fds=way == "unix")
            assert not r.ok and r.meta["code"] == "protocol" and not r.fds and not r.data
        # a HELLO without a token, or with a forged, expired or garbage one: refused
        # at the HELLO with a one-line error saying what to pass, and the connection is
        # closed before the op that follows it in the same write is looked at
        for bad in ("", t["forged"], t["expired"], t["garbage"]):
            with _open(addr) as s:
                s.sendall(encode_request(HelloRequest(token=bad), 1) + encode_request(req, 2))
                r = raw.read_reply(s, want_fds=way == "unix")
                assert not r.ok and r.req_id == 1, (name, r.meta)
                assert r.meta["code"] == "unauthenticated", (name, r.meta)
                msg = r.meta["message"]
                assert "SHOAL_TOKEN" in msg and "shoal token create" in msg and "\n" not in msg
                assert not r.fds
                assert _closed(s), f"{name}: connection kept after a refused HELLO"
        # a reader token for dataset b asking for a: denied, no bytes, no descriptors;
        # the connection goes on (its token is good for b)
        with _greeted(addr, t["reader_b"]) as s:
            raw.send(s, req, 2)
            r = raw.read_reply(s, want_fds=way == "unix")
            assert not r.ok and r.meta["code"] == "denied", (name, r.meta)
            assert "does not grant dataset 'a'" in r.meta["message"]
            assert not r.fds and not r.data
            raw.send(s, _ops("b")[name], 3)
            ok = raw.read_reply(s, want_fds=way == "unix")
            for fd in ok.fds:
                os.close(fd)
            assert ok.ok, (name, ok.meta)
    after = _metrics(c)
    for why in ("missing", "expired", "bad_signature", "malformed", "dataset"):
        sample = f'shoal_worker_auth_refusals_total{{reason="{why}"}}'
        assert _value(after, sample) >= _value(refused_before, sample) + 8, why


def _value(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("way", ["tcp", "unix"])
@pytest.mark.parametrize("who", ["reader_a", "worker", "admin"])
def test_every_op_is_served_to_a_token_for_its_dataset(
    secured: TestCluster, way: str, who: str
) -> None:
    """A reader token for dataset a, a worker's (peers read pages from each other) and
    the admin's: every op answered; READ and BATCH bytes exact; LOCATE hands over
    descriptors on the Unix socket, whose bytes are the file's."""
    c = secured
    addr = _addrs(c)[way]
    token = _tokens(c)[who]
    want = next(iter(FILES_A.values()))
    with _greeted(addr, token) as s:
        for i, (name, req) in enumerate(_ops("a").items()):
            raw.send(s, req, 10 + i)
            r = raw.read_reply(s, want_fds=way == "unix")
            try:
                assert r.ok, (name, r.meta)
                if name in ("READ", "BATCH"):
                    assert r.data == want
                elif name == "LOCATE" and way == "unix":
                    assert r.fds, "no descriptor handed over"
                    _slot, off, length, _ck = r.meta[4][0]
                    assert os.pread(r.fds[0], length, off) == want
            finally:
                for fd in r.fds:
                    os.close(fd)


def test_a_token_is_verified_once_per_connection(secured: TestCluster) -> None:
    c = secured
    addr = _addrs(c)["tcp"]
    token = _tokens(c)["reader_a"]
    path = "data/" + next(iter(FILES_A))
    before = _metric(c, "shoal_worker_auth_checks_total")
    with _greeted(addr, token) as s:
        for i in range(200):
            raw.send(s, ReadRequest("a", path, 0, -1), 100 + i)
            assert raw.read_reply(s).ok
    with _greeted(addr, token) as s:
        for i in range(50):
            raw.send(s, StatRequest("a", path), 100 + i)
            assert raw.read_reply(s).ok
    assert _metric(c, "shoal_worker_auth_checks_total") == before + 2


def test_bad_handshakes_neither_crash_nor_stall_the_worker(secured: TestCluster) -> None:
    c = secured
    addrs = _addrs(c)
    token = _tokens(c)["reader_a"]
    path, want = next(iter(FILES_A.items()))

    def served() -> None:
        """A good client is answered at once on both sockets."""
        for addr in addrs.values():
            t0 = time.monotonic()
            with _greeted(addr, token) as s:
                raw.send(s, ReadRequest("a", "data/" + path, 0, -1), 2)
                r = raw.read_reply(s)
                assert r.ok and r.data == want
            assert time.monotonic() - t0 < LIVE_S

    held: list[socket.socket] = []
    try:
        for addr in addrs.values():
            # silent connections, a HELLO cut off in its header and one in its body
            for _ in range(5):
                held.append(_open(addr))
            hello = encode_request(HelloRequest(token=token), 1)
            for cut in (3, len(hello) - 5):
                s = _open(addr)
                s.sendall(hello[:cut])
                held.append(s)
            # garbage: random bytes, a frame claiming a huge HELLO, a HELLO of the
            # wrong type, an unknown op
            for junk in (
                os.urandom(512),
                wire.REQ_HDR.pack(1 << 30, 1, 1),
                wire.encode_request(wire.Op.HELLO, 1, [wire.VERSION, 12345]),
                wire.encode_request(wire.Op.HELLO, 1, ["2", token]),
                wire.REQ_HDR.pack(4, 99, 1) + b"abcd",
            ):
                s = _open(addr)
                s.sendall(junk)
                held.append(s)
            served()
        served()
        # a HELLO too large for an unauthenticated peer is refused and closed unread
        with _open(addrs["tcp"]) as s:
            s.sendall(wire.REQ_HDR.pack(wire.MAX_HELLO + 1, 1, 1))
            r = raw.read_reply(s)
            assert r.meta["code"] == "protocol"
            assert _closed(s)
        # every connection that did not say a good HELLO is closed by the deadline
        t0 = time.monotonic()
        for s in held:
            assert _closed(s, HELLO_S + 5), "a connection outlived the HELLO deadline"
        assert time.monotonic() - t0 < HELLO_S + 5
        served()
    finally:
        for s in held:
            s.close()
    assert c.procs["worker-0"].poll() is None, "the worker died"


def test_refusals_are_logged_without_secret_or_token(secured: TestCluster) -> None:
    c = secured
    t = _tokens(c)
    addr = _addrs(c)["tcp"]
    for bad in (t["forged"], t["expired"]):
        with _open(addr) as s:
            raw.send(s, HelloRequest(token=bad), 1)
            assert not raw.read_reply(s).ok
    log = (c.dir / "worker-0.log").read_text()
    assert "refused for their token" in log
    assert "not signed by this cluster" in log and "'mallory'" in log
    secret = load_secret(c.secret_file)
    everything = "".join(p.read_text(errors="replace") for p in c.dir.rglob("*.log"))
    for s in (secret.hex(), *t.values(), c.worker_token_file.read_text().strip()):
        if s != t["garbage"]:
            assert s not in everything
    assert "not.a.token" not in everything


def test_the_client_raises_unauthenticated_with_what_to_pass(secured: TestCluster) -> None:
    c = secured
    t = _tokens(c)
    addr = _addrs(c)["tcp"]

    async def read(token: str) -> bytes:
        pool = Pool(addr, 2, 10.0, token=token)
        try:
            resp = await pool.call(ReadRequest("a", "data/" + next(iter(FILES_A)), 0, -1))
            return resp.data
        finally:
            pool.close()

    assert asyncio.run(read(t["reader_a"])) == next(iter(FILES_A.values()))
    for bad in ("", t["forged"], t["expired"]):
        with pytest.raises(Unauthenticated) as exc:
            asyncio.run(read(bad))
        assert "SHOAL_TOKEN" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(PermissionDenied):
        asyncio.run(Pool(addr, 1, 10.0, token=t["reader_b"]).call(StatRequest("a", "data/x")))


def test_front_ends_work_with_auth_on(secured: TestCluster, tmp_path: Path) -> None:
    """The Python client (scoped reader: its own dataset's bytes, by TCP and the short
    circuit), fsspec and ``shoal fs cat`` with the token from the environment."""
    c = secured
    t = _tokens(c)
    for short in (True, False):
        with c.client(token=t["reader_a"], short_circuit=short) as cl:
            for k, v in FILES_A.items():
                assert cl.read(f"/a/data/{k}") == v
            with pytest.raises(PermissionDenied):
                cl.read(f"/b/data/{next(iter(FILES_B))}")

    import fsspec

    fs = fsspec.filesystem("shoal", master=c.master_url, client_options={"token": t["reader_a"]})
    k, v = next(iter(FILES_A.items()))
    with fs.open(f"/a/data/{k}", "rb") as f:
        assert f.read() == v

    env = cli_env(c.master_url, SHOAL_HOME=str(tmp_path / "home"), SHOAL_TOKEN=t["reader_a"])
    env.pop("SHOAL_TOKEN_FILE", None)
    out = subprocess.run(
        [sys.executable, "-m", "shoal", "fs", "cat", f"/a/data/{k}"],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == v
    env["SHOAL_TOKEN"] = t["reader_b"]
    assert_one_line_error(run_cli("fs", "cat", f"/a/data/{k}", env=env), 2, "dataset")


def test_a_worker_without_a_secret_in_a_cluster_with_auth_refuses_to_start(
    secured: TestCluster, tmp_path: Path
) -> None:
    c = secured
    env = cli_env(c.master_url, SHOAL_HOME=str(tmp_path / "home"))
    for k in ("SHOAL_TOKEN", "SHOAL_SECRET"):
        env.pop(k, None)
    env["SHOAL_TOKEN_FILE"] = str(c.worker_token_file)
    args = ("worker", "--port", "0", "--dir", str(tmp_path / "w"))
    tier = ("--tier", f"ssd:{tmp_path / 'cache'}:64MiB")
    r = run_cli(*args, *tier, env=env, timeout=60)
    _refused_to_start(r, "no cluster secret", "--secret-file", "--no-auth")
    # without any token either: the master's health says the cluster has auth
    env.pop("SHOAL_TOKEN_FILE")
    r = run_cli(*args, *tier, env=env, timeout=60)
    _refused_to_start(r, "no cluster secret")
    # --no-auth and --secret-file together: refused at once
    r = run_cli(*args, *tier, "--no-auth", "--secret-file", str(c.secret_file), env=env)
    assert_one_line_error(r, 2, "not both")


def _refused_to_start(r: subprocess.CompletedProcess[str], *words: str) -> None:
    """The worker exited with one error line (after its log lines: it is a server)."""
    assert "Traceback" not in r.stderr and r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("shoal: error:")]
    assert len(errors) == 1 and r.stderr.strip().endswith(errors[0]), r.stderr
    for w in words:
        assert w in errors[0], (w, errors[0])


def test_the_mount_reads_with_a_scoped_token(
    secured: TestCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`shoal mount` with a reader token for dataset a (SHOAL_TOKEN): a's bytes exact
    through the kernel (short circuit and passthrough included), b not readable."""
    from shoal.testing.fuse import can_mount, mounted

    if not can_mount():
        pytest.skip("needs /dev/fuse and root")
    c = secured
    monkeypatch.setenv("SHOAL_TOKEN", _tokens(c)["reader_a"])
    monkeypatch.setenv("SHOAL_HOME", str(tmp_path / "home"))
    with mounted(c.master_url, tmp_path, watchdog_s=120) as m:
        for k, v in FILES_A.items():
            assert (m.path / "a" / "data" / k).read_bytes() == v
        with pytest.raises(OSError):
            (m.path / "b" / "data" / next(iter(FILES_B))).read_bytes()

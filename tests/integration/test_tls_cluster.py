"""TLS (issue 13 item 3, optional part) against a real cluster: the master serves
https (``--tls-cert/--tls-key``), the workers speak TLS on their TCP port (the Unix
socket stays plain), tokens on as ``shoal up`` has them. A client given the CA
(``ClientSettings(tls_ca=...)``, ``SHOAL_TLS_CA``) reads byte-exact over TCP (small
files and a large one: no sendfile through TLS) and through the short circuit; a
client without the CA, or with another one, is refused with a one-line error. In a
cluster of one TLS worker and one plain one, a client uses TLS exactly for the worker
that registered it (the ring says which) and reads byte-exact from both."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.cli.pki import LocalPKI, local_pki
from shoal.client.conn import Pool
from shoal.core.tls import TLSRefused
from shoal.errors import Unauthenticated
from shoal.proto.messages import ReadRequest
from shoal.testing.cli import assert_one_line_error, cli_env, run_cli
from shoal.testing.cluster import S3_ENV, TestCluster, sample_files
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration

FILES = sample_files(10, 100, 5000, seed=141)
BIG = os.urandom(5 << 20)  # several pages: many pieces through the TLS writes


def make_cert(dir: Path) -> LocalPKI:
    """A CA and a certificate it signs for 127.0.0.1 (shoal up --tls's own)."""
    return local_pki(dir, "127.0.0.1")


class TLSCluster(TestCluster):
    """A test cluster whose master and workers are started with --tls-cert/--tls-key."""

    __test__ = False
    tls_args: list[str] = []

    def command(self, name: str, args: list[str]) -> list[str]:
        argv = super().command(name, args)
        if args and args[0] in ("master", "worker"):
            argv += self.tls_args
        return argv


@pytest.fixture(scope="module")
def tls(
    tmp_path_factory: pytest.TempPathFactory, moto: MotoServer
) -> Iterator[tuple[TLSCluster, Path]]:
    base = tmp_path_factory.mktemp("tls")
    pki = make_cert(base / "pki")
    cert, key = pki.cert, pki.key
    env = {**S3_ENV, "SHOAL_TLS_CA": str(pki.ca)}
    mp = pytest.MonkeyPatch()
    mp.setenv("SHOAL_TLS_CA", str(pki.ca))  # this process's harness calls (the ring)
    c = TLSCluster(base / "c", workers=2, env=env, auth=True)
    c.tls_args = ["--tls-cert", str(cert), "--tls-key", str(key)]
    try:
        c.start()
        make_bucket(moto.endpoint, "tls-bucket", {**FILES, "big/one.bin": BIG})
        c.s3_dataset("tls-bucket", moto.endpoint, {"staleness": "never"})
        yield c, pki.ca
    finally:
        c.stop()
        mp.undo()


def test_the_cluster_speaks_tls_and_reads_are_byte_exact(
    tls: tuple[TLSCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, ca = tls
    assert c.master_url.startswith("https://")
    for i in range(c.workers):
        info = json.loads((c.worker_dir(i) / "worker.json").read_text())
        assert info["tls"] is True
    monkeypatch.delenv("SHOAL_TLS_CA")
    for short in (False, True):  # TCP through TLS; the short circuit (plain Unix socket)
        with c.client(tls_ca=str(ca), short_circuit=short, ufs_fallback=False) as cl:
            for k, v in FILES.items():
                assert cl.read(f"/ds/data/{k}") == v
            assert cl.read("/ds/data/big/one.bin") == BIG  # cold, then warm below
            assert cl.read("/ds/data/big/one.bin") == BIG
            assert (
                cl.read("/ds/data/big/one.bin", offset=(1 << 20) + 7, length=999_999)
                == (BIG[(1 << 20) + 7 : (1 << 20) + 7 + 999_999])
            )
        if not short:  # the bytes went over the workers' TCP ports, i.e. through TLS
            assert _remote_bytes(c) >= len(BIG)  # the warm read at least (cold: "ufs")


def _remote_bytes(c: TLSCluster) -> float:
    """Bytes the workers served from cache over TCP (shoal_read_bytes_total remote)."""
    import urllib.request

    total = 0.0
    for i in range(c.workers):
        info = json.loads((c.worker_dir(i) / "worker.json").read_text())
        url = f"http://{info['host']}:{info['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("shoal_read_bytes_total{") and 'source="remote"' in line:
                    total += float(line.split()[-1])
    return total


def test_a_client_without_the_ca_is_refused_in_one_line(
    tls: tuple[TLSCluster, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, ca = tls
    monkeypatch.delenv("SHOAL_TLS_CA")
    other = make_cert(tmp_path / "other").ca
    info = json.loads((c.worker_dir(0) / "worker.json").read_text())
    addr = (info["host"], int(info["port"]))
    token = c.admin_token_file.read_text().strip()

    async def read(trust: Path | None) -> bytes:
        from shoal.core.tls import client_context

        pool = Pool(addr, 1, 10.0, token=token, tls=client_context(str(trust) if trust else None))
        try:
            return (await pool.call(ReadRequest("ds", "data/" + next(iter(FILES)), 0, -1))).data
        finally:
            pool.close()

    for trust, words in ((None, "speaks TLS and this client does not"), (other, "not trusted")):
        with pytest.raises(TLSRefused) as exc:
            asyncio.run(read(trust))
        msg = str(exc.value)
        assert words in msg and "SHOAL_TLS_CA" in msg and "\n" not in msg
        assert isinstance(exc.value, Unauthenticated)  # never a reason to fall back

    # the CLI against the https master, without the CA: one line saying what to pass
    env = cli_env(c.master_url, SHOAL_HOME=str(tmp_path / "home"), SHOAL_TOKEN=token)
    env.pop("SHOAL_TLS_CA", None)
    r = run_cli("dataset", "ls", env=env)
    assert_one_line_error(r, 2, "not trusted", "SHOAL_TLS_CA")
    r = run_cli("dataset", "ls", env=dict(env, SHOAL_TLS_CA=str(ca)))
    assert r.returncode == 0, r.stderr


class MixedCluster(TLSCluster):
    """The master and worker 0 speak TLS, worker 1 plain TCP."""

    __test__ = False

    def command(self, name: str, args: list[str]) -> list[str]:
        argv = TestCluster.command(self, name, args)
        return argv + self.tls_args if name in ("master", "worker-0") else argv


def test_one_client_reads_from_a_tls_worker_and_a_plain_one(
    moto: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = make_cert(tmp_path / "pki")
    cert, key = pki.cert, pki.key
    monkeypatch.setenv("SHOAL_TLS_CA", str(pki.ca))  # the harness's own calls (the ring)
    c = MixedCluster(tmp_path / "c", workers=2, env={**S3_ENV, "SHOAL_TLS_CA": str(pki.ca)}, auth=True)  # fmt: skip
    c.tls_args = ["--tls-cert", str(cert), "--tls-key", str(key)]
    try:
        c.start()
        make_bucket(moto.endpoint, "mixed-bucket", {**FILES, "big/one.bin": BIG})
        c.s3_dataset("mixed-bucket", moto.endpoint, {"staleness": "never"})
        said = [json.loads((c.worker_dir(i) / "worker.json").read_text()) for i in (0, 1)]
        assert [w["tls"] for w in said] == [True, False]
        ring = {w["id"]: w for w in _ring(c, pki.ca)["workers"]}
        assert [ring[w["id"]]["tls"] for w in said] == [True, False]
        monkeypatch.delenv("SHOAL_TLS_CA")
        with c.client(tls_ca=str(pki.ca), short_circuit=False, ufs_fallback=False) as cl:
            for _ in range(2):  # cold, then warm from both workers' caches
                for k, v in FILES.items():
                    assert cl.read(f"/ds/data/{k}") == v
                assert cl.read("/ds/data/big/one.bin") == BIG
        served = [_remote_bytes_of(c, i) for i in (0, 1)]
        assert all(n > 0 for n in served), served  # both served over TCP: TLS and plain
    finally:
        c.stop()


def _ring(c: TestCluster, ca: Path) -> dict[str, Any]:
    import ssl
    import urllib.request

    from shoal.proto.control import RING

    token = c.admin_token_file.read_text().strip()
    req = urllib.request.Request(c.master_url + RING, headers={"Authorization": f"Bearer {token}"})
    ctx = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
        return json.load(r)


def _remote_bytes_of(c: TestCluster, i: int) -> float:
    import urllib.request

    info = json.loads((c.worker_dir(i) / "worker.json").read_text())
    url = f"http://{info['host']}:{info['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        lines = r.read().decode().splitlines()
    return sum(
        float(x.split()[-1])
        for x in lines
        if x.startswith("shoal_read_bytes_total{") and 'source="remote"' in x
    )

"""Tokens on the master's API, against a real cluster started with a secret: every
route refused without a token, with a forged, expired or garbage one, with a reader
token on an admin or worker route and with a token for another dataset; scoped
readers see only their datasets; secrets and tokens never reach the logs."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.client import Client
from shoal.config import ClientSettings
from shoal.core.tokens import ADMIN, READER, load_secret, mint
from shoal.proto import control
from shoal.testing.cli import assert_one_line_error, cli_env, run_cli
from shoal.testing.cluster import S3_ENV, TestCluster, sample_files
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, moto: MotoServer) -> Iterator[TestCluster]:
    c = TestCluster(tmp_path_factory.mktemp("auth") / "c", workers=2, env=dict(S3_ENV), auth=True)
    c.start()
    try:
        admin = c.admin_token_file.read_text().strip()
        make_bucket(moto.endpoint, "auth-a", sample_files(8, 100, 2000, seed=5))
        make_bucket(moto.endpoint, "auth-b", sample_files(3, 100, 2000, seed=6))
        with Client(settings=ClientSettings(master=c.master_url, token=admin)) as client:
            from shoal.core.types import Mount

            client.create_dataset(
                "a", [Mount("data", "s3://auth-a", {"endpoint_url": moto.endpoint})]
            )
            client.create_dataset(
                "b", [Mount("data", "s3://auth-b", {"endpoint_url": moto.endpoint})]
            )
        yield c
    finally:
        c.stop()


def _call(c: TestCluster, method: str, path: str, token: str | None, body: Any = None) -> int:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(c.master_url + path, data=data, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


# (method, path, role needed, dataset the route names)
ROUTES: list[tuple[str, str, str, str | None]] = [
    ("GET", control.DATASETS, READER, None),
    ("POST", control.DATASETS, ADMIN, None),
    ("GET", control.dataset_path("a"), READER, "a"),
    ("PATCH", control.dataset_path("a"), ADMIN, "a"),
    ("DELETE", control.dataset_path("nope"), ADMIN, None),
    ("GET", control.manifest_path("a"), READER, "a"),
    ("GET", control.RING, READER, None),
    ("GET", control.REPORT, READER, None),
    ("GET", control.WATCH + "?since=0&timeout=0&watcher=t", READER, None),
    ("GET", control.JOBS, READER, None),
    ("POST", control.JOBS, ADMIN, None),
    ("GET", control.job_path("j-none"), READER, None),
    ("POST", control.job_path("j-none", "stop"), ADMIN, None),
    ("POST", control.job_path("j-none", "resume"), ADMIN, None),
    ("POST", control.WORKER_REGISTER, "worker", None),
    ("POST", control.heartbeat_path("w-none"), "worker", None),
    ("GET", control.claim_path("w-none") + "?wait=0", "worker", None),
    ("POST", control.task_path(999999), "worker", None),
    ("GET", control.BACKUP, ADMIN, None),
    ("POST", control.TOKENS, ADMIN, None),
]


def test_every_route_refuses_missing_forged_expired_and_unscoped_tokens(
    secured: TestCluster, tmp_path: Path
) -> None:
    c = secured
    secret = load_secret(c.secret_file)
    forged = mint(b"another-cluster-secret-0123456789", "mallory", ADMIN)
    expired = mint(secret, "late", ADMIN, ttl=10, now=time.time() - 3600)
    reader_a = mint(secret, "alice", READER, ["a"])
    reader_b = mint(secret, "bob", READER, ["b"])
    for method, path, role, ds in ROUTES:
        for bad in (None, forged, expired, "garbage", "x.y.z"):
            status = _call(c, method, path, bad, {})
            assert status == 401, (method, path, bad and bad[:8], status)
        if role != READER:
            assert _call(c, method, path, reader_a, {}) == 403, (method, path)
        else:
            assert _call(c, method, path, reader_a, {}) not in (401, 403), (method, path)
        if ds is not None:
            assert _call(c, method, path, reader_b, {}) == 403, (method, path)
    # open routes stay open: probes and scrapes need no token
    assert _call(c, "GET", control.HEALTH, None) == 200
    assert _call(c, "GET", control.METRICS, None) == 200
    # an unknown route is not a way to probe without a token
    assert _call(c, "GET", "/api/v1/nothing-here", None) == 401

    # a scoped reader sees only its datasets, in lists and in the report
    with Client(settings=ClientSettings(master=c.master_url, token=reader_a)) as client:
        assert [d.name for d in client.datasets()] == ["a"]
        assert [d["name"] for d in client.report()["datasets"]] == ["a"]
        assert len(client.cat_many(f"/a/data/{p}" for p in sample_files(8, 100, 2000, seed=5))) == 8

    # refusals are logged with a reason, and no secret or token is ever written down
    log = (c.dir / "master.log").read_text()
    assert "refused" in log and "token expired" in log
    everything = "".join(p.read_text(errors="replace") for p in c.dir.rglob("*.log"))
    for s in (secret.hex(), reader_a, reader_b, c.admin_token_file.read_text().strip()):
        assert s not in everything


def test_the_cli_says_what_to_pass_and_tokens_are_minted_by_admins(secured: TestCluster) -> None:
    c = secured
    env = cli_env(c.master_url, SHOAL_HOME="/nonexistent-shoal-home")
    env.pop("SHOAL_TOKEN", None)
    r = run_cli("dataset", "ls", env=env)
    assert_one_line_error(r, 2, "requires a token", "SHOAL_TOKEN")

    env["SHOAL_TOKEN_FILE"] = str(c.admin_token_file)
    r = run_cli("token", "create", "--role", "reader", "--dataset", "b", "--ttl", "1h", env=env)
    assert r.returncode == 0, r.stderr
    reader_b = r.stdout.strip()
    env_b = dict(env, SHOAL_TOKEN=reader_b)
    r = run_cli("dataset", "ls", "--json", env=env_b)
    assert r.returncode == 0, r.stderr
    assert [d["name"] for d in json.loads(r.stdout)["datasets"]] == ["b"]
    r = run_cli("token", "create", "--role", "admin", env=env_b)
    assert_one_line_error(r, 2, "may not do this")
    r = run_cli("dataset", "rm", "a", env=env_b)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = run_cli("token", "create", "--role", "reader", "--ttl", "soon", env=env)
    assert_one_line_error(r, 2, "--ttl")


def test_shoal_up_turns_auth_on_and_stores_the_admin_token(tmp_path: Path) -> None:
    env = cli_env("", SHOAL_HOME=str(tmp_path / "home"))
    env.pop("SHOAL_MASTER")
    env.pop("SHOAL_TOKEN", None)
    env.pop("SHOAL_TOKEN_FILE", None)
    cdir = tmp_path / "cluster"
    r = run_cli("up", "--workers", "1", "--dir", str(cdir), "--json", env=env)
    assert r.returncode == 0, r.stderr
    url = json.loads(r.stdout)["master"]
    try:
        env["SHOAL_MASTER"] = url
        r = run_cli("dataset", "ls", env=env)  # no flags: the stored token is found
        assert r.returncode == 0, r.stderr
        creds = tmp_path / "home" / "credentials.json"
        assert creds.stat().st_mode & 0o077 == 0
        assert (cdir / "secret").stat().st_mode & 0o077 == 0
        assert _raw_status(url + control.DATASETS) == 401
    finally:
        run_cli("down", "--dir", str(cdir), env=env)
    # `shoal down` forgets the token of the cluster it stopped
    assert url not in json.loads((tmp_path / "home" / "credentials.json").read_text())


def _raw_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_cluster_keyed_by_shoal_secret_lets_its_own_processes_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's way: every role gets the secret as SHOAL_SECRET; the master checks
    tokens with it and the others (workers, CLI, this test) mint their own from it."""
    secret = "k8s-generated-" + "x" * 40
    monkeypatch.setenv("SHOAL_SECRET", secret)
    c = TestCluster(tmp_path / "c", workers=1, env={**S3_ENV, "SHOAL_SECRET": secret})
    c.start()  # the worker registered and joined the ring: it minted a token
    try:
        assert _call(c, "GET", control.DATASETS, None) == 401
        env = cli_env(c.master_url, SHOAL_HOME=str(tmp_path / "home"))
        for k in ("SHOAL_TOKEN", "SHOAL_TOKEN_FILE", "SHOAL_SECRET"):
            env.pop(k, None)
        assert_one_line_error(run_cli("dataset", "ls", env=env), 2, "requires a token")
        r = run_cli("dataset", "ls", "--json", env=dict(env, SHOAL_SECRET=secret))
        assert r.returncode == 0, r.stderr
        r = run_cli("dataset", "ls", env=dict(env, SHOAL_SECRET="short"))
        assert_one_line_error(r, 2, "too short")
    finally:
        c.stop()

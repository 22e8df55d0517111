"""`shoal up` with both gateways: they start with the cluster (authentication on, so
they reach the master with the admin's token), serve a dataset, and `shoal down`
stops them."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config

from shoal.testing.cli import cli_env, run_cli

pytestmark = pytest.mark.integration


def test_shoal_up_starts_and_stops_the_gateways(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    payload = os.urandom(50_000)
    (root / "a" / "x.bin").write_bytes(payload)
    env = cli_env("", SHOAL_HOME=str(tmp_path / "home"))
    for k in ("SHOAL_MASTER", "SHOAL_TOKEN", "SHOAL_TOKEN_FILE"):
        env.pop(k, None)
    cdir = tmp_path / "cluster"
    r = run_cli("up", "--workers", "1", "--dir", str(cdir), "--s3-gateway", "0", "--json", env=env)
    assert r.returncode == 2 and "--gateway-credentials" in r.stderr  # no way to authenticate
    r = run_cli(
        "up", "--workers", "1", "--dir", str(cdir), "--file-root", str(root),
        "--s3-gateway", "0", "--webhdfs-gateway", "0", "--gateway-allow-anonymous", "--json",
        env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    up = json.loads(r.stdout)
    env["SHOAL_MASTER"] = up["master"]
    try:
        r = run_cli("dataset", "create", "ds", "--mount", f"m=file://{root}", env=env)
        assert r.returncode == 0, r.stderr
        s3 = boto3.client(
            "s3",
            endpoint_url=up["gateways"]["s3"],
            region_name="us-east-1",
            config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}),
        )
        assert s3.get_object(Bucket="ds", Key="m/a/x.bin")["Body"].read() == payload
        url = up["gateways"]["webhdfs"] + "/webhdfs/v1/ds/m/a/x.bin?op=GETFILESTATUS"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert json.load(resp)["FileStatus"]["length"] == len(payload)
    finally:
        r = run_cli("down", "--dir", str(cdir), env=env)
    assert r.returncode == 0, r.stderr
    assert "gateway-s3" in r.stdout and "gateway-webhdfs" in r.stdout
    for gw in up["gateways"].values():
        with pytest.raises(OSError):
            urllib.request.urlopen(gw + "/", timeout=5)

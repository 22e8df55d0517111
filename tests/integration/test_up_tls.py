"""``shoal up --tls`` end to end: the cluster generates its CA and certificate, the
master serves https and every worker TLS on its TCP port, and the CLI finds the token
and the CA by itself (``<shoal home>/credentials.json``): ``shoal fs cat`` with no
flags and no SHOAL_TLS_CA reads byte-exact, over TCP through TLS as well as through
the short circuit. ``shoal down`` forgets the CA with the token."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from shoal.testing.cli import assert_one_line_error, cli_env, run_cli

pytestmark = pytest.mark.integration


def test_shoal_up_tls_serves_tls_and_the_cli_finds_the_ca(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    home = tmp_path / "home"
    env = cli_env("", SHOAL_HOME=str(home))
    for k in ("SHOAL_MASTER", "SHOAL_TOKEN", "SHOAL_TOKEN_FILE", "SHOAL_TLS_CA", "SHOAL_SECRET"):
        env.pop(k, None)
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    files = {"a.bin": os.urandom(5000), "sub/big.bin": os.urandom((3 << 20) + 17)}
    for k, v in files.items():
        (data / k).write_bytes(v)
    r = run_cli("up", "--tls", "--workers", "2", "--json", env=env)
    assert r.returncode == 0, r.stderr
    up = json.loads(r.stdout)
    cdir = Path(up["dir"])
    try:
        assert up["master"].startswith("https://")
        ca = up["tls_ca"]
        assert Path(ca).is_file() and (cdir / "tls" / "server.key").stat().st_mode & 0o077 == 0
        for i in range(2):
            assert json.loads((cdir / f"worker-{i}" / "worker.json").read_text())["tls"] is True
        creds = json.loads((home / "credentials.json").read_text())
        assert creds["tls_ca"] == {up["master"]: ca}
        r = run_cli("dataset", "create", "ds", "--mount", f"data=file://{data}", env=env)
        assert r.returncode == 0, r.stderr
        # the short circuit (this host's workers), then TCP through TLS (another node)
        for e in (env, dict(env, SHOAL_NODE="another-host")):
            for k, v in files.items():
                assert _cat(e, k) == v, k
        assert _remote_bytes(cdir) >= len(files["sub/big.bin"])
        # another user (another shoal home) without the CA: one line saying what to pass
        other = dict(env, SHOAL_HOME=str(tmp_path / "other"), SHOAL_MASTER=up["master"])
        other["SHOAL_TOKEN"] = creds[up["master"]]
        assert_one_line_error(run_cli("dataset", "ls", env=other), 2, "SHOAL_TLS_CA")
        assert run_cli("dataset", "ls", env=dict(other, SHOAL_TLS_CA=ca)).returncode == 0
    finally:
        run_cli("down", env=env)
    creds = json.loads((home / "credentials.json").read_text())
    assert up["master"] not in creds and "tls_ca" not in creds


def _cat(env: dict[str, str], k: str) -> bytes:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "shoal", "fs", "cat", f"/ds/data/{k}"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _remote_bytes(cdir: Path) -> float:
    """Bytes the workers served over their TCP ports (the TLS ones)."""
    total = 0.0
    for i in range(2):
        info = json.loads((cdir / f"worker-{i}" / "worker.json").read_text())
        url = f"http://{info['host']}:{info['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("shoal_read_bytes_total{") and 'source="remote"' in line:
                    total += float(line.split()[-1])
    return total

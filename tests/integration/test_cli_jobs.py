"""``--wait`` follows a job through a master restart (issue 10, item 19): jobs are
persisted and resume, so a waiting CLI keeps asking (bounded) instead of exiting 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.client import Client
from shoal.core.types import Mount
from shoal.testing.cli import cli_env, run_cli
from shoal.testing.cluster import TestCluster
from shoal.testing.s3 import MotoServer

pytestmark = pytest.mark.integration


def test_wait_survives_a_master_restart(cluster: TestCluster, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"f{i}.bin").write_bytes(bytes([i]) * 1000)
    with Client(cluster.master_url) as c:
        c.create_dataset("rs", [Mount("m", f"file://{src}")])
    env = cli_env(cluster.master_url)
    r = run_cli("load", "/rs", "--json", env=env)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)["id"]
    cluster.stop_master()
    waiter = subprocess.Popen(
        [sys.executable, "-m", "shoal", "job", "status", job, "--wait", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # with the master gone the waiter keeps asking (it exited 1 at once before)
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(timeout=3)
        cluster.start_master()  # same port, same state: the job resumes
        out, err = waiter.communicate(timeout=90)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert waiter.returncode == 0, err
    view = json.loads(out)
    assert view["id"] == job and view["state"] == "done"
    assert "Traceback" not in err


def test_load_of_a_missing_bucket_names_it(module_cluster: TestCluster, moto: MotoServer) -> None:
    with Client(module_cluster.master_url) as c:
        c.create_dataset(
            "nobucket", [Mount("d", "s3://no-such-bucket-cli", {"endpoint_url": moto.endpoint})]
        )
    r = run_cli("load", "/nobucket", "--wait", env=cli_env(module_cluster.master_url))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "no-such-bucket-cli" in r.stdout, r.stdout
    assert "failed: : " not in r.stdout  # was "failed: : not found"

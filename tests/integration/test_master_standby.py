"""A standby master on the same state directory (shoal.master.lease): it refuses to
serve while the active master lives, takes over when the active one is killed, and
the cluster carries on from the state the active one committed -- datasets, jobs,
worker registrations and the cache, with no store request. Without ``--standby`` a
second master on a served directory, and a restore into it, refuse in one line."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.cli.local import _wait_file
from shoal.client import Client
from shoal.config import ClientSettings
from shoal.testing.cli import assert_one_line_error, cli_env, run_cli
from shoal.testing.cluster import S3_ENV, TestCluster, sample_files, with_spare_master_address
from shoal.testing.s3 import CountingProxy, MotoServer, make_bucket

pytestmark = pytest.mark.integration


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[TestCluster, str]]:
    """A cluster whose workers and clients know two master addresses: the active
    master's and the port a standby on the same state directory will serve."""
    with with_spare_master_address(tmp_path / "c") as two:
        yield two


def _cli(master: str, *args: str, ok: bool = True) -> Any:
    r = run_cli(*args, env=cli_env(master, **S3_ENV))
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def _master_args(c: TestCluster, port: str, url_file: Path, *extra: str) -> list[str]:
    return c.master_args(int(port), url_file, None, *extra)


def _wait_log(log: Path, proc: subprocess.Popen[bytes], text: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, log.read_text(errors="replace")
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {log}:\n{log.read_text(errors='replace')}")


def _refuses(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_standby_takes_over_from_a_killed_master_and_serves_the_cache(
    moto: MotoServer, bucket: str, pair: tuple[TestCluster, str], tmp_path: Path
) -> None:
    c, spare = pair
    first = c.master_url.split(",")[0]
    files = sample_files(40, 1_000, 30_000, seed=17)
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, files)
        c.s3_dataset(bucket, proxy.endpoint, {"replicas": "1"})
        load = json.loads(_cli(first, "load", "/ds", "--wait", "--json").stdout)
        assert load["state"] == "done" and load["files_done"] == 40

        url_file = c.dir / "standby.url"
        proc, log = c._spawn(
            "standby", _master_args(c, spare.rsplit(":", 1)[1], url_file, "--standby")
        )
        _wait_log(log, proc, "taking over when it stops")
        # while the active master lives the standby serves nothing and binds nothing
        assert not url_file.exists() and _refuses(spare)
        listed = json.loads(_cli(c.master_url, "dataset", "ls", "--json").stdout)
        assert [d["name"] for d in listed["datasets"]] == ["ds"]

        c.stop_process("master", signal.SIGKILL)
        assert _wait_file(url_file, proc, 20, log).strip() == spare

        proxy.reset()
        with Client(settings=ClientSettings(master=c.master_url)) as client:
            assert client.dataset("ds").policy.replicas == 1
            got = client.cat_many(f"/ds/data/{p}" for p in files)
            assert {p.removeprefix("/ds/data/"): v for p, v in got.items()} == files
            assert any(j["id"] == load["id"] for j in client.jobs()["jobs"])
            # the workers moved to the standby by themselves
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                report = client.report()
                live = [w for w in report["workers"] if w.get("state", "live") == "live"]
                if len(live) == 2 and report["datasets"][0]["cached_files"] >= 40:
                    break
                time.sleep(0.2)
            assert len(live) == 2, report["workers"]
        counts = proxy.counts()
        assert counts.get("GET", 0) + counts.get("GET_range", 0) == 0, counts
        # the new active master writes state: a change made there is kept
        _cli(c.master_url, "dataset", "update", "ds", "--option", "replicas=2")

        # the old master comes back as a standby in turn: it waits, serving nothing
        back_file = c.dir / "back.url"
        back, back_log = c._spawn(
            "master", _master_args(c, first.rsplit(":", 1)[1], back_file, "--standby")
        )
        _wait_log(back_log, back, "taking over when it stops")
        assert not back_file.exists()
        back.send_signal(signal.SIGTERM)
        assert back.wait(timeout=10) == 0
        c.procs.pop("master", None)
        c.pids.pop("master", None)
        with Client(settings=ClientSettings(master=c.master_url)) as client:
            assert client.dataset("ds").policy.replicas == 2


def test_a_second_master_and_a_restore_refuse_a_served_state_dir(
    tmp_path: Path,
) -> None:
    c = TestCluster(tmp_path / "c", workers=0, env=dict(S3_ENV))
    c.dir.mkdir(parents=True)
    try:
        url = c.start_master()
        r = run_cli(
            *_master_args(c, "0", c.dir / "second.url"), env=cli_env(url, **S3_ENV), timeout=30
        )
        assert_one_line_error(r, 2, "is served by another master", "--standby")
        assert not (c.dir / "second.url").exists()

        archive = tmp_path / "b.tar"
        _cli(url, "master", "backup", str(archive))
        r = _cli(
            url,
            "master",
            "restore",
            str(archive),
            "--state-dir",
            str(c.dir / "master"),
            "--force",
            ok=False,
        )
        assert_one_line_error(r, 2, "is served by a running master")
        # the master still serves its own state
        assert json.loads(_cli(url, "dataset", "ls", "--json").stdout) == {"datasets": []}
    finally:
        c.stop()


def test_the_liveness_probe_passes_a_waiting_standby_and_fails_a_hung_master(
    tmp_path: Path,
) -> None:
    """``shoal master probe`` (the chart's exec liveness probe with a standby): a
    standby binds no port and is alive while it waits; the active master must answer
    its health check, and a hung one fails (then its pod is restarted, and the
    standby takes over)."""
    c = TestCluster(tmp_path / "c", workers=0, env=dict(S3_ENV))
    c.dir.mkdir(parents=True)
    state = str(c.dir / "master")

    def probe(pid: int) -> tuple[int, dict[str, Any]]:
        r = run_cli("master", "probe", "--state-dir", state, "--pid", str(pid),
                    "--timeout", "1", "--json", env=cli_env(url, **S3_ENV), timeout=30)  # fmt: skip
        return r.returncode, json.loads(r.stdout)

    try:
        url = c.start_master()
        active = c.pids["master"]
        url_file = c.dir / "standby.url"
        proc, log = c._spawn("standby", _master_args(c, "0", url_file, "--standby"))
        _wait_log(log, proc, "taking over when it stops")
        rc, out = probe(active)
        assert (rc, out["state"], out["ok"]) == (0, "active", True) and str(active) in out["holder"]
        rc, out = probe(proc.pid)
        assert (rc, out["state"]) == (0, "standby") and str(active) in out["holder"]
        c.procs["master"].send_signal(signal.SIGSTOP)  # hung: holds the lock, answers nothing
        try:
            rc, out = probe(active)
            assert (rc, out["state"], out["ok"]) == (1, "active", False)
        finally:
            c.procs["master"].send_signal(signal.SIGCONT)
        c.stop_process("master", signal.SIGKILL)
        _wait_file(url_file, proc, 20, log)
        rc, out = probe(proc.pid)
        assert (rc, out["state"]) == (0, "active") and str(proc.pid) in out["holder"]
        r = run_cli("master", "probe", "--state-dir", str(c.dir / "nope"),
                    env=cli_env(url, **S3_ENV), timeout=30)  # fmt: skip
        assert_one_line_error(r, 2, "does not exist")
    finally:
        c.stop()

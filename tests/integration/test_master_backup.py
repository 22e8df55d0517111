"""Master backup and restore against real processes: an online backup of a running
master, a restore into a new master on another port, workers and clients that find
it through their list of master addresses, and cached data served again without one
store request; damaged archives are refused without touching the target."""

from __future__ import annotations

import json
import os
import signal
import tarfile
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
from shoal.testing.s3 import CountingProxy, MotoServer, free_port, make_bucket

pytestmark = pytest.mark.integration


@pytest.fixture
def two_addresses(tmp_path: Path) -> Iterator[tuple[TestCluster, str]]:
    """A cluster whose workers know two master addresses: the running master's and a
    free port where a restored master will come up."""
    with with_spare_master_address(tmp_path / "c") as pair:
        yield pair


def _cli(master: str, *args: str, ok: bool = True) -> Any:
    r = run_cli(*args, env=cli_env(master, **S3_ENV))
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def _start_master(c: TestCluster, url: str, state_dir: Path) -> Any:
    url_file = c.dir / "restored.url"
    port = int(url.rsplit(":", 1)[1])
    proc, log = c._spawn("master", c.master_args(port, url_file, state_dir))
    assert _wait_file(url_file, proc, 20, log).strip() == url
    return proc


def test_restore_on_a_new_address_serves_the_cache_without_refetching(
    moto: MotoServer, bucket: str, two_addresses: tuple[TestCluster, str], tmp_path: Path
) -> None:
    c, spare = two_addresses
    first = c.master_url.split(",")[0]
    files = sample_files(60, 1_000, 40_000, seed=91)
    with CountingProxy(moto.endpoint) as proxy:
        make_bucket(moto.endpoint, bucket, files)
        c.s3_dataset(bucket, proxy.endpoint, {"replicas": "1"})
        load = json.loads(_cli(first, "load", "/ds", "--wait", "--json").stdout)
        assert load["state"] == "done" and load["files_done"] == 60
        sched = json.loads(_cli(first, "load", "/ds", "--schedule", "0 3 * * *", "--json").stdout)

        archive = tmp_path / "master-backup.tar"
        out = json.loads(_cli(first, "master", "backup", str(archive), "--json").stdout)
        assert out["datasets"] == 1 and out["manifests"] == 1 and out["jobs"] >= 1
        with tarfile.open(archive) as tar:
            names = tar.getnames()
        assert names[0] == "backup.json" and "master.db" in names and "jobs.db" in names
        # no secret of the store reaches the archive
        assert S3_ENV["AWS_SECRET_ACCESS_KEY"].encode() not in archive.read_bytes()

        c.stop_process("master", signal.SIGKILL)  # the old master's host is gone
        new_state = tmp_path / "restored-state"
        r = _cli(first, "master", "restore", str(archive), "--state-dir", str(new_state))
        assert "restored 1 datasets" in r.stdout
        _start_master(c, spare, new_state)

        proxy.reset()
        settings = ClientSettings(master=c.master_url)  # both addresses: the first is dead
        with Client(settings=settings) as client:
            assert client.dataset("ds").policy.replicas == 1
            got = client.cat_many(f"/ds/data/{p}" for p in files)
            assert {p.removeprefix("/ds/data/"): v for p, v in got.items()} == files
            jobs = client.jobs()
            assert any(s["id"] == sched["id"] for s in jobs["schedules"])
            assert any(j["id"] == load["id"] for j in jobs["jobs"])
            # workers moved to the restored master by themselves and report there
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                report = client.report()
                live = [w for w in report["workers"] if w.get("state", "live") == "live"]
                if len(live) == 2 and report["datasets"][0]["cached_files"] >= 60:
                    break
                time.sleep(0.2)
            assert len(live) == 2, report["workers"]
        # the cache was served as it was: no object was fetched again, and the manifest
        # came back with the backup (no listing either)
        counts = proxy.counts()
        assert counts.get("GET", 0) + counts.get("GET_range", 0) == 0, counts
        assert counts.get("LIST", 0) == 0, counts


def test_restore_refuses_damaged_archives_and_existing_state(
    moto: MotoServer, bucket: str, tmp_path: Path
) -> None:
    from shoal.testing.cluster import start_cluster

    c = start_cluster(tmp_path / "c", workers=1)
    try:
        make_bucket(moto.endpoint, bucket, sample_files(5, 10, 100, seed=3))
        c.s3_dataset(bucket, moto.endpoint)
        archive = tmp_path / "b.tar"
        _cli(c.master_url, "master", "backup", str(archive))
    finally:
        c.stop()
    env = cli_env(c.master_url)

    # a target that already holds state is left alone without --force
    r = run_cli("master", "restore", str(archive), "--state-dir", str(c.dir / "master"), env=env)
    assert_one_line_error(r, 2, "already holds master state", "--force")
    # --force moves it aside, never deletes it
    r = run_cli(
        "master", "restore", str(archive), "--state-dir", str(c.dir / "master"), "--force", env=env
    )
    assert r.returncode == 0, r.stderr
    assert [p for p in c.dir.iterdir() if p.name.startswith("master.before-restore-")]

    raw = archive.read_bytes()
    bad: dict[str, bytes] = {
        "truncated": raw[: len(raw) // 2],
        "flipped": _flip_in_member(archive, "master.db"),
        "not a tar": b"hello" * 100,
    }
    for what, body in bad.items():
        p = tmp_path / f"{what.replace(' ', '-')}.tar"
        p.write_bytes(body)
        target = tmp_path / f"target-{what.replace(' ', '-')}"
        r = run_cli("master", "restore", str(p), "--state-dir", str(target), env=env)
        assert_one_line_error(r, 2, "backup")
        assert not target.exists() or not any(target.iterdir()), what
    # nothing half-restored is left beside the targets
    assert not [p for p in tmp_path.iterdir() if ".restore-" in p.name]
    r = run_cli("master", "restore", str(tmp_path / "nope.tar"), "--state-dir", "x", env=env)
    assert_one_line_error(r, 2, "no backup at")


def _flip_in_member(archive: Path, name: str) -> bytes:
    raw = bytearray(archive.read_bytes())
    with tarfile.open(archive) as tar:
        m = tar.getmember(name)
    at = m.offset_data + m.size // 2
    raw[at] ^= 0xFF
    return bytes(raw)


def test_backup_of_an_unreachable_master_fails_in_one_line(tmp_path: Path) -> None:
    dest = tmp_path / "b.tar"
    r = run_cli("master", "backup", str(dest), env=cli_env(f"http://127.0.0.1:{free_port()}"))
    assert_one_line_error(r, 1, "unreachable")
    assert not dest.exists() and not os.listdir(tmp_path)

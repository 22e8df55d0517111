"""The `shoal` command end to end: a real local cluster via `shoal up`, and every kind
of user error ending in one line on stderr and a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.testing.cluster import S3_ENV
from shoal.testing.s3 import MotoServer, free_port, make_bucket

pytestmark = pytest.mark.integration


def run(*args: str, env: dict[str, str], ok: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "shoal", *args], env=env, capture_output=True, text=True, timeout=120
    )
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def one_line_error(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shoal: error:"), r.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    d = tmp_path_factory.mktemp("cli")
    env = dict(os.environ)
    env.update(S3_ENV)
    env["SHOAL_HOME"] = str(d / "home")
    env.pop("SHOAL_MASTER", None)
    r = run("up", "--workers", "2", "--mem", "64MiB", "--disk", "256MiB", "--json", env=env)
    info = json.loads(r.stdout)
    assert info["master"].startswith("http://127.0.0.1:")
    try:
        yield env
    finally:
        run("down", env=env)
        assert not (d / "home" / "cluster" / "cluster.json").exists()


def test_dataset_and_fs_commands(up: dict[str, str], tmp_path: Path, moto: MotoServer) -> None:
    env = up
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"a.txt": b"hello\n", "sub/b.bin": os.urandom(300_000), "sub/c.bin": os.urandom(5)}
    for k, v in files.items():
        (src / k).write_bytes(v)
    make_bucket(moto.endpoint, "cli-bucket", {"x/y.bin": b"from s3"})
    r = run(
        "dataset",
        "create",
        "cli",
        "--mount",
        f"local=file://{src}",
        "--mount",
        "s3=s3://cli-bucket",
        "--mount-option",
        f"s3.endpoint_url={moto.endpoint}",
        "--option",
        "replicas=2",
        "--json",
        env=env,
    )
    created = json.loads(r.stdout)
    assert created["policy"]["replicas"] == 2 and len(created["mounts"]) == 2
    names = [
        d["name"] for d in json.loads(run("dataset", "ls", "--json", env=env).stdout)["datasets"]
    ]
    assert "cli" in names
    ls = json.loads(run("fs", "ls", "/cli/local/sub", "--json", env=env).stdout)["entries"]
    assert {(e["path"], e["size"]) for e in ls} == {
        ("/cli/local/sub/b.bin", 300_000),
        ("/cli/local/sub/c.bin", 5),
    }
    st = json.loads(run("fs", "stat", "/cli/s3/x/y.bin", "--json", env=env).stdout)
    assert st["type"] == "file" and st["size"] == 7
    cat = subprocess.run(
        [sys.executable, "-m", "shoal", "fs", "cat", "/cli/local/sub/b.bin"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert cat.returncode == 0 and cat.stdout == files["sub/b.bin"]
    out = tmp_path / "copy"
    cp = json.loads(run("fs", "cp", "-r", "/cli/local", str(out), "--json", env=env).stdout)
    assert cp["files"] == 3
    for k, v in files.items():
        assert (out / k).read_bytes() == v
    report = json.loads(run("report", "--json", env=env).stdout)
    assert isinstance(report["datasets"], list)
    for d in report["datasets"]:
        assert {"name", "cached_files", "cached_bytes", "hits", "misses"} <= set(d)
    assert len(report["workers"]) == 2
    human = run("report", env=env).stdout
    assert "workers" in human
    run("dataset", "rm", "cli", env=env)
    one_line_error(run("fs", "cat", "/cli/local/a.txt", env=env, ok=False), "cli")


def test_user_errors_are_one_line(up: dict[str, str], tmp_path: Path, moto: MotoServer) -> None:
    env = up
    one_line_error(run("fs", "cat", "/nosuch/m/x", env=env, ok=False), "nosuch")
    one_line_error(
        run("dataset", "create", "bad", "--mount", "m=not-a-uri", env=env, ok=False),
        "malformed URI",
    )
    one_line_error(
        run("dataset", "create", "bad", "--mount", "m=nosuchscheme://x", env=env, ok=False)
    )
    dead = f"http://127.0.0.1:{free_port()}"
    one_line_error(
        run(
            "dataset",
            "create",
            "bad",
            "--mount",
            "m=s3://bucket",
            "--mount-option",
            f"endpoint_url={dead}",
            env=env,
            ok=False,
        )
    )
    nocreds = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    nocreds["HOME"] = str(tmp_path)  # no ~/.aws either
    nocreds["AWS_CONFIG_FILE"] = nocreds["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "none")
    make_bucket(moto.endpoint, "creds-bucket", {"k": b"v"})
    r = run(
        "dataset",
        "create",
        "bad",
        "--mount",
        "m=s3://creds-bucket",
        "--mount-option",
        f"endpoint_url={moto.endpoint}",
        env=nocreds,
        ok=False,
    )
    one_line_error(r, "credentials")
    one_line_error(
        run(
            "dataset",
            "create",
            "bad",
            "--mount",
            "m=s3://b",
            "--mount-option",
            "secret=hunter2",
            env=env,
            ok=False,
        ),
        "secret",
    )
    assert "hunter2" not in run("dataset", "ls", "--json", env=env).stdout
    one_line_error(
        run(
            "dataset",
            "create",
            "bad",
            "--mount",
            "m=file:///tmp",
            "--option",
            "replicas=lots",
            env=env,
            ok=False,
        ),
        "replicas",
    )
    # nothing of the failed creates was kept
    names = [
        d["name"] for d in json.loads(run("dataset", "ls", "--json", env=env).stdout)["datasets"]
    ]
    assert "bad" not in names
    d = tmp_path / "d"
    d.mkdir()
    (d / "f").write_bytes(b"x")
    run("dataset", "create", "errs", "--mount", f"m=file://{d}", env=env)
    one_line_error(run("fs", "cat", "/errs/nomount/f", env=env, ok=False), "nomount")
    one_line_error(run("fs", "cat", "/errs/m/../../etc/passwd", env=env, ok=False), "..")
    one_line_error(run("fs", "cat", "/errs/m/missing", env=env, ok=False))
    one_line_error(
        run("dataset", "create", "errs", "--mount", f"m=file://{d}", env=env, ok=False), "exists"
    )
    one_line_error(run("fs", "ls", "/", "--master", dead, env=env, ok=False), "unreachable")
    run("dataset", "rm", "errs", env=env)

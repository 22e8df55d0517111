"""What a new user meets first (issue 11, item 13): one wording for policies, output
scripts can read, warnings where a setting cannot hold, and the fs find/du/head and
mount ls commands."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shoal.cli.main import _parser
from shoal.client import Client
from shoal.core.types import Mount
from shoal.testing.cli import cli_env, run_cli
from shoal.testing.cluster import TestCluster

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class World:
    env: dict[str, str]
    master: str


@pytest.fixture(scope="module")
def world(module_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    src = tmp_path_factory.mktemp("cutsrc")
    (src / "a").mkdir()
    (src / "a" / "x.txt").write_bytes(b"x" * 1000)
    (src / "a" / "y.bin").write_bytes(b"y" * 3000)
    (src / "top.txt").write_bytes(b"top\n")
    with Client(module_cluster.master_url) as c:
        c.create_dataset("cuts", [Mount("m", f"file://{src}")])
    yield World(cli_env(module_cluster.master_url), module_cluster.master_url)


def _ok(*args: str, env: dict[str, str]) -> str:
    r = run_cli(*args, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _rows(out: str) -> list[list[str]]:
    return [line.split("\t") for line in out.splitlines() if line and not line.startswith("#")]


def test_policy_words_agree_and_output_is_plain_when_piped(world: World) -> None:
    ls = _rows(_ok("dataset", "ls", env=world.env))
    header, row = ls[0], next(r for r in ls[1:] if r[0] == "cuts")
    listed = dict(zip(header, row, strict=True))
    assert listed["staleness"] == "never" and listed["ttl"] == "never"
    shown = dict(_rows(_ok("dataset", "show", "cuts", env=world.env))[1:])
    assert shown["staleness"] == listed["staleness"] and shown["ttl"] == listed["ttl"]
    assert shown["page_size"] == "1.0 MiB" and shown["pin"] == "false"
    # piped output is tab-separated, never rich's box drawing
    for out in (_ok("dataset", "ls", env=world.env), _ok("report", env=world.env)):
        assert "━" not in out and "│" not in out and "\t" in out
    assert "\t" in _ok("dataset", "ls", "--plain", env=world.env)


def test_replicas_beyond_workers_warn(world: World) -> None:
    r = run_cli("dataset", "update", "cuts", "--option", "replicas=5", env=world.env)
    try:
        assert r.returncode == 0, r.stderr
        assert "warning: replicas=5" in r.stderr and "2 worker" in r.stderr
        assert "under-replicated: dataset cuts" in _ok("report", env=world.env)
    finally:
        _ok("dataset", "update", "cuts", "--option", "replicas=1", env=world.env)
    assert "under-replicated" not in _ok("report", env=world.env)


def test_job_words_and_order(world: World) -> None:
    first = json.loads(_ok("load", "/cuts", "--wait", "--json", env=world.env))
    out = _ok("free", "/cuts", "--wait", env=world.env)
    assert "freed" in out and "of 0" not in out
    jobs = json.loads(_ok("job", "ls", "--json", env=world.env))["jobs"]
    created = [j["created"] for j in jobs]
    assert created == sorted(created, reverse=True) and jobs[-1]["id"] == first["id"]


def test_report_hit_ratio_matches_hits_and_misses(world: World) -> None:
    for _ in range(2):
        _ok("fs", "cat", "/cuts/m/top.txt", env=world.env)
    rows = _rows(_ok("report", env=world.env))
    header = rows[0]
    found = [r for r in rows[1:] if len(r) == len(header) and r[0] == "cuts"]
    assert len(found) == 1, rows
    for row in found:
        d = dict(zip(header, row, strict=True))
        hits, misses = int(d["hits"]), int(d["misses"])
        if hits + misses:
            assert d["hit ratio"] == f"{hits / (hits + misses):.1%}"
        else:
            assert d["hit ratio"] == "-"
        assert "bytes from cache" in d


def test_find_du_head(world: World) -> None:
    found = _ok("fs", "find", "/cuts", env=world.env).split()
    assert found == sorted(found)
    assert {"/cuts/m/a/x.txt", "/cuts/m/a/y.bin", "/cuts/m/top.txt", "/cuts/m/a"} <= set(found)
    files = _ok("fs", "find", "/cuts/m", "--type", "f", "--name", "*.txt", env=world.env)
    assert files.split() == ["/cuts/m/a/x.txt", "/cuts/m/top.txt"]
    du = json.loads(_ok("fs", "du", "/cuts/m/a", "/cuts/m", "--json", env=world.env))
    assert [(e["path"], e["files"], e["bytes"]) for e in du["entries"]] == [
        ("/cuts/m/a", 2, 4000),
        ("/cuts/m", 3, 4004),
    ]
    assert _rows(_ok("fs", "du", "-b", "/cuts/m/a", env=world.env))[1] == ["4000", "2", "/cuts/m/a"]
    assert _ok("fs", "head", "-c", "2", "/cuts/m/a/x.txt", env=world.env) == "xx"


def test_mount_ls(tmp_path: Path) -> None:
    env = dict(os.environ)
    sdir = tmp_path / "mounts"
    sdir.mkdir()
    assert json.loads(_ok("mount", "ls", "--state-dir", str(sdir), "--json", env=env)) == {
        "mounts": []
    }
    # a daemon that died without cleaning up is listed as dead, with the fix
    dead = {"pid": 2**22 + 12345, "mountpoint": "/mnt/x", "master": "http://m:1"}
    (sdir / "mnt_x-1234.json").write_text(json.dumps(dead))
    (sdir / "me.json").write_text(json.dumps({"pid": os.getpid(), "mountpoint": "/mnt/me"}))
    rows = _rows(_ok("mount", "ls", "--state-dir", str(sdir), env=env))
    by_mp = {r[0]: r for r in rows[1:]}
    assert by_mp["/mnt/x"][2].startswith("dead") and "umount" in by_mp["/mnt/x"][2]
    assert by_mp["/mnt/me"][2] == "running"


def test_every_flag_has_help() -> None:
    missing = []

    def walk(p: argparse.ArgumentParser, name: str) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for n, sp in a.choices.items():
                    walk(sp, f"{name} {n}")
            elif not isinstance(a, argparse._HelpAction | argparse._VersionAction) and not a.help:
                missing.append(f"{name} {'/'.join(a.option_strings) or a.dest}")

    walk(_parser(), "shoal")
    assert not missing, missing
    update = _parser()._subparsers._group_actions[0].choices["dataset"]  # type: ignore[union-attr]
    text = update._subparsers._group_actions[0].choices["update"].format_help()
    for key in ("placement", "replicas", "staleness=never|always", "ttl", "page_size", "pin"):
        assert key in text, key

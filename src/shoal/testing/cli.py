"""Helpers for tests that run the ``shoal`` command as users do: a real subprocess,
its exit status and its stderr, and a snapshot of the master's state to show that a
refused command changed nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any


def cli_env(master: str, **extra: str) -> dict[str, str]:
    """This process's environment with SHOAL_MASTER pointing at ``master``."""
    env = dict(os.environ)
    env["SHOAL_MASTER"] = master
    env.update(extra)
    return env


def run_cli(
    *args: str, env: Mapping[str, str], timeout: float = 120, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shoal", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=None if stdin is None else stdin.decode(),
    )


def assert_one_line_error(r: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """``r`` failed with ``code`` and said so in one ``shoal: error:`` line holding
    ``words``; no traceback, no internal error. Returns the line."""
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert line.startswith("shoal: error:"), line
    assert "internal error" not in line, line
    for w in words:
        assert w in line, (w, line)
    return line


def master_state(master: str) -> dict[str, Any]:
    """Datasets (with policies), jobs and schedules: what a refused request must not
    change."""

    def get(path: str) -> Any:
        with urllib.request.urlopen(master + path, timeout=10) as r:
            return json.loads(r.read())

    jobs = get("/api/v1/jobs")
    return {
        "datasets": sorted(
            json.dumps(d, sort_keys=True) for d in get("/api/v1/datasets")["datasets"]
        ),
        "jobs": sorted(j["id"] for j in jobs.get("jobs", [])),
        "schedules": sorted(s["id"] for s in jobs.get("schedules", [])),
    }


def http(master: str, method: str, path: str, body: bytes | None) -> tuple[int, Any]:
    """One raw request to the master's API: (status, decoded JSON body, strictly)."""
    req = urllib.request.Request(master + path, data=body, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()

    def strict(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return status, json.loads(raw, parse_constant=strict) if raw else None

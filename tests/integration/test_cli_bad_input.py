"""Bad input to the CLI and to the master's API, as one table each: every case ends
in one clear line (CLI: ``shoal: error: ...`` and its exit status; API: a 4xx with a
JSON error) and leaves the master's datasets, jobs and schedules as they were.

Part of the reliability suite (issue 10, item 17): add a row for every new finding.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shoal.client import Client
from shoal.core.types import Mount
from shoal.testing.cli import assert_one_line_error, cli_env, http, master_state, run_cli
from shoal.testing.cluster import TestCluster
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    code: int
    words: tuple[str, ...]


@dataclass(frozen=True)
class World:
    env: dict[str, str]
    master: str
    src: Path
    endpoint: str


@pytest.fixture(scope="module")
def world(
    module_cluster: TestCluster, moto: MotoServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    src = tmp_path_factory.mktemp("badsrc")
    (src / "sub").mkdir()
    (src / "a.txt").write_bytes(b"hello\n")
    (src / "sub" / "b.txt").write_bytes(b"b\n")
    make_bucket(moto.endpoint, "bad-input", {"dir/x.bin": b"x", "top.bin": b"t"})
    with Client(module_cluster.master_url) as c:
        c.create_dataset(
            "bad",
            [
                Mount("m", f"file://{src}"),
                Mount("s3", "s3://bad-input", {"endpoint_url": moto.endpoint}),
            ],
        )
    yield World(cli_env(module_cluster.master_url), module_cluster.master_url, src, moto.endpoint)


def _cases(w: World) -> list[Case]:
    ep = w.endpoint
    return [
        Case(
            "endpoint-not-a-url",
            (
                "dataset",
                "create",
                "n1",
                "--mount",
                "m=s3://b",
                "--mount-option",
                "endpoint_url=notaurl",
            ),
            2,
            ("mount m", "notaurl"),
        ),
        Case(
            "unprefixed-option-two-mounts",
            (
                "dataset",
                "create",
                "n2",
                "--mount",
                f"f=file://{w.src}",
                "--mount",
                "s=s3://bad-input",
                "--mount-option",
                f"s.endpoint_url={ep}",
                "--mount-option",
                "credentials_file=/nonexistent",
            ),
            2,
            ("mount f", "credentials_file", "s.credentials_file"),
        ),
        Case("cp-into-proc", ("fs", "cp", "-r", "/bad/m", "/proc/nope"), 1, ("/proc/nope",)),
        Case(
            "cron-31-february",
            ("load", "/bad", "--schedule", "0 0 31 2 *"),
            2,
            ("never matches",),
        ),
        Case(
            "cron-seven-fields",
            ("load", "/bad", "--schedule", "* * * * * * *"),
            2,
            ("got 7", "6th field is seconds"),
        ),
        Case("cron-garbage", ("load", "/bad", "--schedule", "bad"), 2, ("5 fields",)),
        Case("cron-out-of-range", ("load", "/bad", "--schedule", "61 * * * *"), 2, ("cron",)),
        Case("load-no-such-mount", ("load", "/bad/nomount"), 2, ("no mount 'nomount'",)),
        Case("load-no-such-dataset", ("load", "/nods"), 2, ("nods",)),
        Case("cat-dataset-root", ("fs", "cat", "/bad"), 2, ("/bad is a directory", "fs ls")),
        Case("cat-file-dir", ("fs", "cat", "/bad/m/sub"), 2, ("is a directory", "fs ls")),
        Case("cat-s3-dir", ("fs", "cat", "/bad/s3/dir"), 2, ("is a directory",)),
        Case("head-dir", ("fs", "head", "/bad/m/sub"), 2, ("is a directory",)),
        Case("cp-dir-without-r", ("fs", "cp", "/bad/m", "/tmp/x"), 2, ("use -r",)),
        Case("job-id-path", ("job", "status", "../../x"), 2, ("invalid job id",)),
        Case("dataset-name-path", ("dataset", "show", "../../x"), 2, ("../../x",)),
        Case("dataset-rm-path", ("dataset", "rm", "bad/../x"), 2, ("bad/../x",)),
        Case("job-id-unknown", ("job", "status", "j-0123456789"), 2, ("j-0123456789",)),
        Case(
            "file-outside-roots",
            ("dataset", "create", "n3", "--mount", "m=file:///etc", "--no-check"),
            2,
            ("outside the master's file roots", "--file-root"),
        ),
        Case(
            "file-root-slash",
            ("dataset", "create", "n4", "--mount", "m=file:///", "--no-check"),
            2,
            ("file roots",),
        ),
        Case(
            "file-dotdot-escape",
            (
                "dataset",
                "create",
                "n5",
                "--mount",
                f"m=file://{w.src}" + "/.." * len(w.src.parts) + "/etc",
                "--no-check",
            ),
            2,
            ("/etc", "file roots"),
        ),
        Case(
            "staleness-nan",
            ("dataset", "update", "bad", "--option", "staleness=nan"),
            2,
            ("nan",),
        ),
        Case("ttl-huge", ("dataset", "update", "bad", "--option", "ttl=1e999"), 2, ("1e999",)),
        Case(
            "ttl-inf-create",
            ("dataset", "create", "n6", "--mount", f"m=file://{w.src}", "--option", "ttl=inf"),
            2,
            ("inf",),
        ),
        Case("head-negative", ("fs", "head", "-n", "-1", "/bad/m/a.txt"), 2, (">= 0",)),
    ]


def test_cli_bad_input_table(world: World) -> None:
    failed = []
    for case in _cases(world):
        before = master_state(world.master)
        r = run_cli(*case.argv, env=world.env)
        try:
            assert_one_line_error(r, case.code, *case.words)
            assert master_state(world.master) == before, "the master's state changed"
        except AssertionError as exc:
            failed.append(f"{case.id}: {exc}")
    assert not failed, "\n".join(failed)
    assert not Path("/proc/nope").exists()


# (id, method, path, body, a word of the message); every answer is a 400
_API: list[tuple[str, str, str, bytes, str]] = [
    (
        "staleness-NaN",
        "POST",
        "/api/v1/datasets",
        b'{"name":"a1","mounts":[{"name":"m","uri":"s3://b"}],"policy":{"staleness":NaN}}',
        "NaN",
    ),
    (
        "ttl-Infinity",
        "POST",
        "/api/v1/datasets",
        b'{"name":"a2","mounts":[{"name":"m","uri":"s3://b"}],"policy":{"ttl":Infinity}}',
        "Infinity",
    ),
    (
        "ttl-1e999",
        "POST",
        "/api/v1/datasets",
        b'{"name":"a3","mounts":[{"name":"m","uri":"s3://b"}],"policy":{"ttl":1e999}}',
        "out of range",
    ),
    (
        "ttl-string-1e999",
        "PATCH",
        "/api/v1/datasets/bad",
        b'{"policy":{"ttl":"1e999"}}',
        "1e999",
    ),
    (
        "nul-in-uri",
        "POST",
        "/api/v1/datasets",
        b'{"name":"a4","mounts":[{"name":"m","uri":"s3://b\\u0000x"}]}',
        "control character",
    ),
    (
        "file-root",
        "POST",
        "/api/v1/datasets",
        b'{"name":"a5","mounts":[{"name":"m","uri":"file:///"}]}',
        "file roots",
    ),
    (
        "local-protocol",
        "POST",
        "/api/v1/datasets",
        b'{"name":"a6","mounts":[{"name":"m","uri":"local:///etc"}]}',
        "file roots",
    ),
    (
        "endpoint-not-a-url",
        "POST",
        "/api/v1/datasets",
        b'{"name":"a7","mounts":[{"name":"m","uri":"s3://b",'
        b'"options":{"endpoint_url":"notaurl"}}]}',
        "endpoint_url",
    ),
    ("deep-array", "POST", "/api/v1/datasets", b"[" * 100_000 + b"]" * 100_000, "nested"),
    (
        "deep-job",
        "POST",
        "/api/v1/jobs",
        b'{"spec":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "nested",
    ),
]


def test_api_bad_input_table(world: World) -> None:
    failed = []
    for case_id, method, path, body, word in _API:
        before = master_state(world.master)
        status, answer = http(world.master, method, path, body)
        message = (answer or {}).get("error", {}).get("message", "")
        if status != 400 or word not in message or "\n" in message:
            failed.append(f"{case_id}: {status} {message!r}")
        elif master_state(world.master) != before:
            failed.append(f"{case_id}: the master's state changed")
    assert not failed, "\n".join(failed)
    # what the master answers stays standard JSON a strict parser reads
    status, listing = http(world.master, "GET", "/api/v1/datasets", None)
    assert status == 200 and json.dumps(listing, allow_nan=False)

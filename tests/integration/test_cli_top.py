"""`shoal top` and `shoal report --watch` against a real cluster: the numbers they show
are the master's (`shoal report --json`), rates come from successive snapshots, and
bad options end in one line."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from rich.console import Console

from shoal.cli.main import main
from shoal.cli.output import human_bytes
from shoal.cli.top import Sample, frame, rich_view
from shoal.testing.cli import cli_env, run_cli
from shoal.testing.cluster import TestCluster, sample_files, start_cluster
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration


@dataclass
class World:
    cluster: TestCluster
    env: dict[str, str]
    job: str
    report: dict[str, Any]


def _settled(c: Any, reads: int, timeout: float = 15) -> dict[str, Any]:
    """The report once every read reached it (workers report in heartbeats)."""
    deadline = time.monotonic() + timeout
    while True:
        r: dict[str, Any] = c.report()
        t = r["totals"]
        if t["hits"] + t["misses"] >= reads or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


@pytest.fixture(scope="module")
def world(
    moto: MotoServer, s3_credentials: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    base = tmp_path_factory.mktemp("top")
    files = sample_files(8, 1000, 50_000, seed=5)
    make_bucket(moto.endpoint, "cli-top", files)
    cluster = start_cluster(base / "cluster", workers=1)
    try:
        cluster.s3_dataset("cli-top", moto.endpoint)
        with cluster.client(short_circuit=False) as c:
            job = c.submit_job({"kind": "load", "dataset": "ds"})["id"]
            deadline = time.monotonic() + 60
            while c.job(job)["state"] not in ("done", "failed") and time.monotonic() < deadline:
                time.sleep(0.1)
            for k, v in files.items():
                assert c.read(f"/ds/data/{k}") == v
            _settled(c, len(files))
        env = cli_env(cluster.master_url)
        r = run_cli("report", "--json", env=env)
        assert r.returncode == 0, r.stderr
        yield World(cluster, env, job, json.loads(r.stdout))
    finally:
        cluster.stop()


def _frames(out: str, header: str) -> list[str]:
    return out.split(header)[1:]


def _rows(block: str, title: str) -> list[list[str]]:
    lines = block.split(f"# {title}\n", 1)[1].split("\n# ", 1)[0].strip().splitlines()
    return [ln.split("\t") for ln in lines[1:]]  # the header line off


def test_top_shows_what_report_says(world: World) -> None:
    r = run_cli("top", "--iterations", "2", "--interval", "0.3", env=world.env, timeout=60)
    assert r.returncode == 0, r.stderr
    frames = _frames(r.stdout, "# shoal top ")
    assert len(frames) == 2, r.stdout
    rep = world.report
    d = next(d for d in rep["datasets"] if d["name"] == "ds")
    for f in frames:
        (row,) = [x for x in _rows(f, "datasets") if x[0] == "ds"]
        assert row[1] == str(d["cached_files"]) and row[2] == human_bytes(d["cached_bytes"])
        assert row[4] == str(d["hits"]) and row[5] == str(d["misses"])
        assert row[6] == f"{d['hits'] / (d['hits'] + d['misses']):.1%}"
        (cluster,) = _rows(f, "cluster")
        assert cluster[:2] == ["1", "0"]
        ids = {w[0] for w in _rows(f, "workers")}
        assert ids == {w["id"] for w in rep["workers"]}
        (job,) = [j for j in _rows(f, "jobs") if j[0] == world.job]
        assert job[3] == "done" and job[-1] == "100%"
        tiers = {t[0]: t for t in _rows(f, "tiers")}
        used = sum(t["used"] for w in rep["workers"] for t in w["tiers"] if t["name"] == "ssd")
        assert tiers["ssd"][1] == "1" and tiers["ssd"][2] == human_bytes(used)
    # a rate needs two snapshots: none in the first refresh, one in the second
    assert _rows(frames[0], "cluster")[0][-1] == "-"
    assert _rows(frames[1], "cluster")[0][-1].endswith("/s")


def test_report_watch_repeats(world: World) -> None:
    r = run_cli("report", "--watch", "0.3", "--count", "2", "--json", env=world.env, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert json.loads(line)["totals"]["cached_files"] == world.report["totals"]["cached_files"]
    started = time.monotonic()
    r = run_cli("report", "--watch", "0.5", "--count", "3", env=world.env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - started >= 1.0  # two waits of 0.5 s between three reports
    frames = _frames(r.stdout, "# shoal report ")
    assert len(frames) == 3
    assert all("# datasets" in f and "# workers" in f for f in frames)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["top", "--interval", "0"], ["--interval"]),
        (["top", "--iterations", "0"], ["--iterations"]),
        (["report", "--count", "2"], ["--count", "--watch"]),
        (["report", "--watch", "-1"], ["--watch"]),
    ],
)
def test_bad_options_end_in_one_line(
    args: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # refused before any master is asked: in-process, as `shoal` runs it
    with pytest.raises(SystemExit) as exit:
        main([*args, "--master", "http://127.0.0.1:9"])
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("shoal: error:") and all(w in err for w in words), err


def _sample(at: float, local: int, ufs: int) -> Sample:
    src = {"local": local, "remote": 0, "ufs": ufs}
    report = {
        "totals": {"hits": 3, "misses": 1, "cached_bytes": 10, "epoch": 1, "bytes_by_source": src},
        "datasets": [{"name": "a", "hits": 3, "misses": 1, "bytes_by_source": src}],
        "workers": [
            {"id": "w1", "state": "live", "used": 50, "capacity": 100,
             "tiers": [{"name": "ssd", "used": 50, "capacity": 100}]},
            {"id": "w2", "state": "expired", "used": 0, "capacity": 100, "tiers": []},
        ],
    }  # fmt: skip
    job = {"id": "j-1", "kind": "load", "dataset": "a", "state": "running",
           "files_total": 4, "files_done": 1, "bytes_total": 1000, "bytes_done": 250}  # fmt: skip
    return Sample(at, report, [job])


def test_rates_come_from_successive_snapshots() -> None:
    first, second = _sample(10.0, 0, 0), _sample(12.0, 4096, 2048)
    head = frame(second, first)[0]
    assert head.rows[0][:3] == [1, 1, 1] and head.rows[0][6] == "75.0%"
    assert head.rows[0][-3:] == ["2.0 KiB/s", "0 B/s", "1.0 KiB/s"]
    ds = frame(second, first)[2]
    assert ds.rows[0][-3:] == ["2.0 KiB/s", "0 B/s", "1.0 KiB/s"]
    assert frame(second, None)[0].rows[0][-3:] == ["-", "-", "-"]
    jobs = frame(second, first)[3]
    assert jobs.rows[0][-1] == "25%" and jobs.bars == [0.25]


def test_rich_view_draws_progress_bars() -> None:
    console = Console(record=True, width=140, color_system=None)
    console.print(rich_view(frame(_sample(2.0, 10, 0), _sample(1.0, 0, 0)), "12:00:00"))
    text = console.export_text()
    assert "shoal top  12:00:00" in text and "j-1" in text and "25%" in text
    assert "━" in text  # the bar itself
    assert "50.0%" in text  # the tier's use

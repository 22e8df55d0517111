"""The master's web console in a real browser: headless Chromium (the Debian package)
driven by playwright against a real cluster (master and workers as processes, S3 from
moto behind a slow link so a load takes seconds).

Pages load with no console error, no failed request and no error response; the numbers
on the overview and datasets pages equal ``shoal report --json`` at the same moment; a
load started with ``shoal load`` shows a progress bar that moves, and the page's stop
and resume buttons work; a killed worker shows as down within the heartbeat window.

With ``SHOAL_CONSOLE_SCREENSHOTS=1`` every page is also saved to docs/console/.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.testing.cli import cli_env, run_cli
from shoal.testing.cluster import sample_files
from shoal.testing.faults import FaultProxy, Mode
from shoal.testing.jobs import JobCluster, start_job_cluster
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
EXPIRY = 3.0
#: the console's refresh period (console.js PAGE_EVERY_MS) and some slack for a slow box
REFRESH = 2.0
SLACK = 3.0

try:
    from playwright.sync_api import Browser, Page, sync_playwright
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None  # type: ignore[assignment]


@pytest.fixture(scope="module")
def chromium() -> str:
    """The browser binary; the module skips (before starting a cluster) without one."""
    if sync_playwright is None:
        pytest.skip("playwright is not installed (pip install -e '.[dev]'; `make setup` does it)")
    if CHROMIUM is None:
        pytest.skip("no chromium binary (apt-get install chromium; `make setup` does it)")
    return CHROMIUM


@pytest.fixture(scope="module")
def browser(chromium: str, console: JobCluster, slow_store: FaultProxy) -> Iterator[Browser]:
    # after the cluster: playwright's sync API holds an event loop in this thread, and
    # starting a cluster runs one of its own
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def slow_store(moto: MotoServer) -> Iterator[FaultProxy]:
    with FaultProxy(moto.endpoint) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def console(
    chromium: str, tmp_path_factory: pytest.TempPathFactory, s3_credentials: None, moto: MotoServer
) -> Iterator[JobCluster]:
    """Two workers with a memory tier; small load tasks reporting often; few requests
    to the store at a time, so a load over the slow link runs for seconds."""
    knobs = {"batch_files": 10, "report_every": 0.1}
    c = start_job_cluster(
        tmp_path_factory.mktemp("console"), knobs, expiry=EXPIRY, mem="64MiB", ufs_concurrency=4
    )
    try:
        files = sample_files(120, 1000, 30_000, seed=7)
        make_bucket(moto.endpoint, "console-imagenet", files)
        c.s3_dataset("console-imagenet", moto.endpoint, name="imagenet")
        env = cli_env(c.master_url, **c.env)
        r = run_cli("load", "/imagenet", "--wait", "--json", env=env)
        assert r.returncode == 0, r.stderr
        r = run_cli("load", "/imagenet/data/000", "--schedule", "0 3 * * *", env=env)
        assert r.returncode == 0, r.stderr
        with c.client() as cl:  # some reads: hits for the ratio, bytes for the charts
            for rel in list(files)[:40]:
                assert cl.cat(f"/imagenet/data/{rel}") == files[rel]
        yield c
    finally:
        c.stop()


class Watched:
    """A page with every console error, page error, failed request and error
    response it met recorded."""

    def __init__(self, browser: Browser, base: str) -> None:
        self.base = base
        self.page: Page = browser.new_page(viewport={"width": 1360, "height": 900})
        self.problems: list[str] = []
        p = self.page
        p.on(
            "console",
            lambda m: self.problems.append(f"console: {m.text}") if m.type == "error" else None,
        )
        p.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        p.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url} {r.failure}"))
        p.on(
            "response",
            lambda r: self.problems.append(f"{r.status}: {r.url}") if r.status >= 400 else None,
        )

    def open(self, path: str) -> float:
        """Load ``path``; wait until the script refreshed it once and drew its charts.
        Returns the seconds until the load event."""
        t0 = time.monotonic()
        self.page.goto(self.base + path, wait_until="load")
        took = time.monotonic() - t0
        self.page.wait_for_selector("body[data-refreshed]", state="attached", timeout=10_000)
        for fig in self.page.query_selector_all("figure.chart"):
            fig.wait_for_element_state("visible")
        self.page.wait_for_function(
            "[...document.querySelectorAll('figure.chart')].every(f => f.dataset.points)"
        )
        return took

    def fields(self, scope: str = "main") -> dict[str, Any]:
        pairs = self.page.eval_on_selector_all(
            f"{scope} [data-field]", "els => els.map(e => [e.dataset.field, e.dataset.value])"
        )
        return {k: _decode(v) for k, v in pairs}

    def shot(self, name: str) -> None:
        if os.environ.get("SHOAL_CONSOLE_SCREENSHOTS") == "1":
            SHOTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.page.close()


def _decode(v: str | None) -> Any:
    if v in ("", None):
        return None
    try:
        return json.loads(v)
    except ValueError:
        return v  # a word (a state)


@pytest.fixture
def watched(browser: Browser, console: JobCluster) -> Iterator[Watched]:
    w = Watched(browser, console.master_url)
    try:
        yield w
        assert w.problems == [], w.problems
    finally:
        w.close()


def _quiet(report: dict[str, Any]) -> dict[str, Any]:
    """The report without what moves by itself (heartbeat ages)."""
    r = json.loads(json.dumps(report))
    for w in r["workers"]:
        w.pop("last_heartbeat_age_s")
    return r


def _at_one_moment(console: JobCluster, read: Callable[[], Any]) -> tuple[dict[str, Any], Any]:
    """``read()`` done between two equal reports (``shoal report --json``), so what it
    saw is that report; retried while heartbeats still move the figures."""
    env = cli_env(console.master_url, **console.env)
    deadline = time.monotonic() + 30
    while True:
        r = run_cli("report", "--json", env=env)
        assert r.returncode == 0, r.stderr
        before = json.loads(r.stdout)
        got = read()
        r = run_cli("report", "--json", env=env)
        after = json.loads(r.stdout)
        if _quiet(before) == _quiet(after):
            return after, got
        assert time.monotonic() < deadline, "the report never held still"


def test_every_page_loads_without_errors(watched: Watched) -> None:
    times = {}
    for name, path in [
        ("overview", "/ui/"),
        ("datasets", "/ui/datasets"),
        ("dataset", "/ui/datasets/imagenet"),
        ("jobs", "/ui/jobs"),
        ("workers", "/ui/workers"),
    ]:
        times[name] = watched.open(path)
        assert watched.page.title().startswith("shoal")
        # nothing the page uses comes from anywhere but the master
        srcs = watched.page.eval_on_selector_all(
            "script[src], link[href]", "els => els.map(e => e.src || e.href)"
        )
        assert all(s.startswith(watched.base) or s.startswith("data:") for s in srcs), srcs
    print("page load times (s):", {k: round(v, 3) for k, v in times.items()})
    states = watched.page.eval_on_selector_all(
        "tr[data-worker]", "els => els.map(e => e.dataset.state)"
    )
    assert states == ["live", "live"]


def test_overview_and_datasets_match_the_report(watched: Watched, console: JobCluster) -> None:
    def overview() -> dict[str, Any]:
        watched.open("/ui/")
        return watched.fields()

    report, f = _at_one_moment(console, overview)
    t = report["totals"]
    for key in (
        "capacity",
        "used",
        "cached_bytes",
        "cached_files",
        "hit_ratio",
        "workers_live",
        "workers_expired",
        "datasets",
        "corrupt_pages",
    ):
        assert f[f"totals.{key}"] == t[key], key
    assert t["cached_bytes"] > 0 and 0 < t["hit_ratio"] <= 1 and t["workers_live"] == 2
    # the tier table sums the live workers' tiers
    used = sum(tr["used"] for w in report["workers"] for tr in w["tiers"])
    rows = watched.page.eval_on_selector_all(
        "[data-part=tiers] tr[data-tier] [data-field=used]", "els => els.map(e => +e.dataset.value)"
    )
    assert sum(rows) == used

    def datasets() -> dict[str, dict[str, Any]]:
        watched.open("/ui/datasets")
        rows = {}
        for name in watched.page.eval_on_selector_all(
            "tr[data-dataset]", "els => els.map(e => e.dataset.dataset)"
        ):
            rows[name] = watched.fields(f'tr[data-dataset="{name}"]')
        return rows

    report, rows = _at_one_moment(console, datasets)
    assert set(rows) == {d["name"] for d in report["datasets"]}
    for d in report["datasets"]:
        row = rows[d["name"]]
        for key in ("cached_bytes", "cached_files", "store_bytes", "store_files", "hit_ratio"):
            assert row[key] == d[key], (d["name"], key)
        assert row["cached_pct"] == d["cached_pct"]
    imagenet = next(d for d in report["datasets"] if d["name"] == "imagenet")
    assert imagenet["cached_pct"] == 100.0 and imagenet["store_files"] == 120
    watched.shot("datasets")


def test_a_cli_load_shows_a_moving_progress_bar_and_stops_and_resumes(
    watched: Watched, console: JobCluster, moto: MotoServer, slow_store: FaultProxy
) -> None:
    make_bucket(moto.endpoint, "console-slow", sample_files(300, 500, 4000, seed=8))
    console.s3_dataset("console-slow", slow_store.endpoint, name="slow")
    slow_store.set(Mode.LATENCY, latency=0.1)
    env = cli_env(console.master_url, **console.env)
    r = run_cli("load", "/slow", "--json", env=env)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)["id"]
    watched.open("/ui/jobs")
    bar = f'progress[data-job="{job}"][data-what="files"]'
    seen: list[float] = []
    deadline = time.monotonic() + 60
    # the page refreshes itself: no reload, just read the bar as the script updates it
    while len({v for v in seen if 0 < v < 1}) < 2:
        assert time.monotonic() < deadline, f"the progress bar did not move: {seen}"
        el = watched.page.query_selector(bar)
        if el is not None:
            v = float(el.get_attribute("value") or 0)
            if not seen or v != seen[-1]:
                seen.append(v)
        watched.page.wait_for_timeout(100)
    assert seen == sorted(seen), seen  # it only goes forward
    watched.shot("jobs")
    row = f'tr[data-job="{job}"]'
    press(watched, f'button[data-action="stop"][data-job="{job}"]', f'{row}[data-state="stopped"]')
    with console.client() as c:
        assert c.job(job)["state"] == "stopped"
    slow_store.set(Mode.PASS)
    press(
        watched,
        f'button[data-action="resume"][data-job="{job}"]',
        f'{row}:not([data-state="stopped"])',
    )
    watched.page.wait_for_selector(f'{row}[data-state="done"]', timeout=60_000)
    assert float(watched.page.get_attribute(bar, "value") or 0) == 1.0
    with console.client() as c:
        view = c.job(job)
        assert view["state"] == "done" and view["files_done"] + view["files_skipped"] == 300
        files = sample_files(300, 500, 4000, seed=8)
        for rel in list(files)[:150]:  # cached now: the dataset's charts show hits
            assert c.cat(f"/slow/data/{rel}") == files[rel]
        read_at = time.time() + 1.5  # the reads reach the master with the next heartbeats
    # the dataset page lists the job, its mounts and its cache on both workers (the
    # workers report what they hold with their heartbeats: the last files of the job
    # can reach the page one heartbeat after the job is done)
    deadline = time.monotonic() + 15
    while True:
        watched.open("/ui/datasets/slow")
        spread = watched.page.eval_on_selector_all(
            "[data-part=workers] [data-field=cached_files]", "els => els.map(e => +e.dataset.value)"
        )
        if sum(spread) == 300 or time.monotonic() > deadline:
            break
        watched.page.wait_for_timeout(250)
    assert sum(spread) == 300 and len(spread) == 2, spread
    assert watched.page.query_selector(f'[data-part=jobs] tr[data-job="{job}"]') is not None
    assert watched.page.inner_text("[data-part=mounts] code") == "s3://console-slow"
    if os.environ.get("SHOAL_CONSOLE_SCREENSHOTS") == "1":
        # charts with the reads in them: wait for a history sample that has them
        watched.page.wait_for_function(
            f"fetch('/ui/api/history').then(r => r.json()).then(h => h.t.at(-1) > {read_at})",
            polling=500,
            timeout=15_000,
        )
        watched.open("/ui/datasets/slow")
        watched.shot("dataset")
        watched.open("/ui/")
        watched.shot("overview")


def press(watched: Watched, button: str, until: str) -> None:
    """Click ``button`` until ``until`` shows (the part holding the button is re-rendered
    every refresh, so a click can land on a row that was just replaced)."""
    for _ in range(3):
        watched.page.click(button)
        try:
            watched.page.wait_for_selector(until, timeout=5_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"clicking {button} never led to {until}")


def test_a_killed_worker_shows_as_down_within_the_heartbeat_window(
    watched: Watched, console: JobCluster
) -> None:
    watched.open("/ui/workers")
    assert watched.page.eval_on_selector_all(
        "tr[data-worker]", "els => els.map(e => e.dataset.state)"
    ) == ["live", "live"]
    console.kill_worker(1, signal.SIGKILL)
    t0 = time.monotonic()
    # no reload: the page's own refresh must show it
    watched.page.wait_for_selector(
        'tr[data-worker][data-state="expired"]', timeout=(EXPIRY + REFRESH + SLACK) * 1000
    )
    took = time.monotonic() - t0
    print(f"worker shown down after {took:.2f}s (expiry {EXPIRY}s)")
    assert took <= EXPIRY + REFRESH + SLACK
    down = watched.page.get_attribute('tr[data-worker][data-state="expired"]', "data-worker")
    with console.client() as c:
        states = {w["id"]: w["state"] for w in c.report()["workers"]}
    assert states[down] == "expired" and sorted(states.values()) == ["expired", "live"]
    assert watched.fields("[data-part=workers] p.summary") == {
        "totals.workers_live": 1,
        "totals.workers_expired": 1,
    }
    watched.shot("workers")

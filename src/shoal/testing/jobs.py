"""Test-only knobs for the job machinery, applied inside real shoal processes.

``JobCluster`` is a :class:`~shoal.testing.cluster.TestCluster` whose master and
workers start through this module (``python -m shoal.testing.jobs ARGS``) rather than
``python -m shoal``: it reads ``SHOAL_TEST_JOB_KNOBS`` (JSON) from the environment,
sets the knobs, then runs the ordinary command line. Production code has no such knob;
the tests use it to make many small tasks whose progress reports cross their ends:

- ``batch_files``: files per load task (the master's planning; default core.jobs.BATCH_FILES, 4096);
- ``report_every``: seconds between a worker's progress reports (default 0.5);
- ``report_delay``: seconds a worker's progress report (not a final one) waits before
  it is sent, as over a slow link or to a busy master.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from shoal.testing.cluster import S3_ENV, TestCluster

KNOBS_ENV = "SHOAL_TEST_JOB_KNOBS"


def apply_knobs(knobs: dict[str, Any]) -> None:
    from shoal.core import jobs
    from shoal.worker import tasks

    if "batch_files" in knobs:
        jobs.BATCH_FILES = int(knobs["batch_files"])
    if "report_every" in knobs:
        tasks.REPORT_EVERY = float(knobs["report_every"])
    if "report_delay" in knobs:
        delay = float(knobs["report_delay"])
        send = tasks.TaskRunner._report

        async def slow(
            self: tasks.TaskRunner, tid: int, body: dict[str, Any], *a: Any, **kw: Any
        ) -> bool:
            if not body.get("final"):
                await asyncio.sleep(delay)
            return await send(self, tid, body, *a, **kw)

        tasks.TaskRunner._report = slow  # type: ignore[method-assign]


class JobCluster(TestCluster):
    """A TestCluster whose processes run with the job knobs in ``env[KNOBS_ENV]``."""

    __test__ = False

    def command(self, name: str, args: list[str]) -> list[str]:
        # the same roles, started through this module so the knobs are patched in first
        return [sys.executable, "-m", "shoal.testing.jobs", *args]


def start_job_cluster(dir: Path, knobs: dict[str, Any], workers: int = 2, **kw: Any) -> JobCluster:
    env = {**S3_ENV, KNOBS_ENV: json.dumps(knobs)}
    c = JobCluster(dir, workers=workers, env=env, **kw)
    c.start()
    return c


def main() -> None:
    apply_knobs(json.loads(os.environ.get(KNOBS_ENV) or "{}"))
    from shoal.cli.main import main as shoal_main

    shoal_main(sys.argv[1:])


if __name__ == "__main__":
    main()

"""Smoke test of ``shoal bench``'s remote workload at tiny sizes: every contender (raw
TCP, the client over TCP, the short circuit) runs on namespaced hosts and reports a
rate. Performance is not asserted here (see BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.bench import remote
from shoal.testing import netns

pytestmark = pytest.mark.integration


def test_remote_workload_runs_every_contender(tmp_path: Path) -> None:
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"namespaced hosts unavailable: {reason}")
    cfg = remote.RemoteConfig(
        workdir=tmp_path, large_size=2 << 20, small_files=40, rounds=1, batch=8, threads=2
    )
    res = remote.run(cfg, lambda s: None)
    rows = res["rows"]
    assert {"raw-tcp", "shoal-tcp 1MiB x1", "shoal-tcp cat_many",
            "shoal-short-circuit cat_many"} <= set(rows)  # fmt: skip
    for name, row in rows.items():
        assert not row.get("failed"), name
        assert row["mb_per_s"]["median"] > 0, name
    assert all(t["ratio"] is not None for t in res["targets"])
    text = "\n".join(remote.markdown(res))
    assert remote.SECTION in text and "raw-tcp" in text
    out = tmp_path / "B.md"
    out.write_text("# x\n\n## Other\n\nkeep\n")
    remote.write_section(out, remote.markdown(res))
    remote.write_section(out, remote.markdown(res))  # replaced, not appended twice
    assert out.read_text().count(remote.SECTION) == 1 and "keep" in out.read_text()

"""The bench's parquet workload: the file's plan, the bytes a projection needs, the
passes each contender runs, and the report's numbers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shoal.bench import parquet
from shoal.bench.contenders import BenchEnv, Contender
from shoal.bench.stats import Result, Sample
from shoal.bench.suite import Config, Report


def _peer(name: str, kind: str) -> Contender:
    c = Contender(BenchEnv(Path("/nonexistent"), "http://127.0.0.1:1", "b", Path("/data")))
    c.name, c.kind = name, kind
    return c


def test_the_file_is_whole_row_groups_of_the_asked_size() -> None:
    t = parquet.TableSpec(160_000_000)
    assert t.group_rows == 250_000 and t.rows == 2_000_000
    assert t.rows * 8 * t.columns == 160_000_000
    assert t.projection == ["c2", "c7"]  # not adjacent: two separate chunks per group
    assert t.table_bytes == 2_000_000 * 8 * 2
    assert parquet.TableSpec(1_000_000, seed=1).digest() != parquet.TableSpec(1_000_000).digest()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"size": 100}, "too small"),
        ({"size": 10**6, "projected": (3, 10)}, "not all in 0..9"),
        ({"size": 10**6, "projected": ()}, "not all in"),
        ({"size": 10**6, "row_groups": 0}, "must be >= 1"),
    ],
)
def test_a_bad_file_plan_is_a_one_line_error(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match) as e:
        parquet.TableSpec(**kw)
    assert "\n" not in str(e.value)


def test_the_bytes_needed_are_the_footer_and_the_projected_chunks(tmp_path: Path) -> None:
    t = parquet.TableSpec(400_000, columns=5, row_groups=4, projected=(1, 3))
    path = tmp_path / parquet.KEY
    parquet.write(t, path)
    mtime = path.stat().st_mtime_ns
    parquet.write(t, path)  # the marker says it is there: not written again
    assert path.stat().st_mtime_ns == mtime
    lay = parquet.layout(path)
    assert len(lay.chunks) == 4 * 5
    assert lay.file_size == path.stat().st_size
    want = [c for c in lay.chunks if c.column in ("c1", "c3")]
    assert len(want) == 8
    needed = lay.needed(["c1", "c3"])
    assert needed == lay.footer + sum(c.size for c in want)
    # random floats do not compress: each chunk is about its raw size, and the
    # projection needs about 2/5 of the file
    assert all(c.size >= t.group_rows * 8 for c in want)
    assert 0.35 < needed / lay.file_size < 0.45
    with pytest.raises(ValueError, match="no column c9"):
        lay.needed(["c1", "c9"])


def test_both_reads_return_the_projection(tmp_path: Path) -> None:
    t = parquet.TableSpec(200_000, columns=4, row_groups=3, projected=(0, 2))
    path = tmp_path / parquet.KEY
    parquet.write(t, path)
    src = parquet.Source(str(path))
    assert parquet.read_pandas(src, t.projection) == t.table_bytes
    # arrow tables may carry validity bitmaps besides the values (1 bit in 64)
    assert t.table_bytes <= parquet.read_row_groups(src, t.projection) <= t.table_bytes * 1.02

    class _Fs:  # an fsspec-like filesystem: the pyarrow path through fs.open
        def open(self, p: str, mode: str) -> Any:
            return open(p, mode)

    fs_src = parquet.Source("unused", fs=_Fs, fs_path=str(path))
    assert parquet.read_row_groups(fs_src, t.projection) >= t.table_bytes


def test_sources_name_the_file_for_each_contender() -> None:
    assert parquet.source(_peer("local-dir", "local")).url == "/data/parquet/table.parquet"
    s3 = parquet.source(_peer("s3fs", "remote"))
    assert s3.url == "s3://b/parquet/table.parquet" and s3.fs_path == "b/parquet/table.parquet"
    assert s3.storage_options and s3.storage_options["endpoint_url"] == "http://127.0.0.1:1"
    c = _peer("shoal-fsspec", "cache")
    c.env.master = "http://m:1"
    sh = parquet.source(c)
    assert sh.url == "shoal://bench/data/parquet/table.parquet"
    assert sh.storage_options == {"master": "http://m:1", "skip_instance_cache": True}
    with pytest.raises(ValueError, match="no reader for contender rclone-vfs"):
        parquet.source(_peer("rclone-vfs", "cache"))


def _passes(cfg: Config, read: Callable[..., Sample], counter: Callable[[], int] | None,
            fail: set[str] = frozenset()) -> tuple[parquet.Passes, list[tuple[str, bool]], list[Any]]:  # type: ignore[assignment]  # fmt: skip
    calls: list[tuple[str, bool]] = []
    fetched: list[Any] = []

    def measure(wl: str, c: Contender, fn: Callable[[], Sample], cold: bool) -> Sample | None:
        calls.append((wl, cold))
        return None if wl in fail else fn()

    p = parquet.Passes(cfg, parquet.TableSpec(10**6), measure, counter,
                       lambda wl, c, n: fetched.append((wl, c, n)), read)  # fmt: skip
    return p, calls, fetched


def test_each_kind_runs_cold_then_warm_per_read_and_remote_warm_once() -> None:
    cfg = Config(cold_reps=2, warm_reps=3)
    p, _, _ = _passes(cfg, lambda *a: Sample(1.0, 1, 1), None)
    cache = p.plan(_peer("shoal-fsspec", "cache"))
    assert cache == (
        [("parquet read_parquet cold", True)] * 2 + [("parquet read_parquet warm", False)] * 3
        + [("parquet row-groups cold", True)] * 2 + [("parquet row-groups warm", False)] * 3
    )  # fmt: skip
    remote = p.plan(_peer("s3fs", "remote"))
    assert [w for w, _ in remote].count("parquet read_parquet warm") == 1
    assert [w for w, _ in remote].count("parquet row-groups cold") == 2


def test_reads_are_counted_against_the_store_except_the_local_file() -> None:
    carried = iter(range(0, 10**9, 1000))
    total = [0]

    def counter() -> int:  # moves by 1000 per read, then holds still
        return total[0]

    def read(c: Contender, kind: str, cols: list[str]) -> Sample:
        assert cols == ["c2", "c7"]
        total[0] = next(carried) + 1000
        return Sample(0.5, 1, 100)

    cfg = Config(cold_reps=1, warm_reps=1)
    p, calls, fetched = _passes(cfg, read, counter)
    p.run(_peer("shoal-fsspec", "cache"))
    assert [w for w, _ in calls] == [w for w, _ in p.plan(_peer("x", "cache"))]
    assert len(fetched) == 4 and all(n > 0 for _, c, n in fetched if c == "shoal-fsspec")
    fetched.clear()
    p.run(_peer("local-dir", "local"))
    assert fetched == []  # no store behind the local file


def test_a_failed_cold_read_skips_its_warm_passes() -> None:
    cfg = Config(cold_reps=1, warm_reps=3)
    p, calls, _ = _passes(cfg, lambda *a: Sample(1.0, 1, 1), None, {"parquet read_parquet cold"})
    p.run(_peer("shoal-fsspec", "cache"))
    names = [w for w, _ in calls]
    assert "parquet read_parquet warm" not in names
    assert names.count("parquet row-groups warm") == 3


def test_settled_waits_for_the_counter_to_stop() -> None:
    seq = iter([10, 20, 30, 30, 99])
    assert parquet.settled(lambda: next(seq), every=0.0) == 30


def _report() -> Report:
    rep = Report(Config(), {})
    rep.extra["parquet"] = {"file_bytes": 10**8, "columns": 10, "row_groups": 8,
                            "group_rows": 10**5, "projection": ["c2", "c7"],
                            "needed_bytes": 2 * 10**7}  # fmt: skip
    for c, secs in (("local-dir", 0.1), ("s3fs", 2.0), ("shoal-fsspec", 0.4)):
        rep.results[("parquet read_parquet warm", c)] = Result(
            "parquet read_parquet warm", c, [Sample(secs, 1, 16 * 10**6, 0.3)]
        )
    rep.fetched[("parquet read_parquet warm", "s3fs")] = [10**8, 9 * 10**7, 11 * 10**7]
    rep.fetched[("parquet read_parquet warm", "shoal-fsspec")] = [0]
    return rep


def test_summary_gives_shoal_against_local_and_s3fs_and_bytes_over_needed() -> None:
    rep = _report()
    s = parquet.summary(rep.results, rep.fetched, 2 * 10**7)["parquet read_parquet warm"]
    assert s["shoal-fsspec"]["x_local"] == 0.25 and s["shoal-fsspec"]["x_s3fs"] == 5.0
    assert s["shoal-fsspec"]["s_per_read"] == 0.4 and s["shoal-fsspec"]["x_needed"] == 0.0
    assert s["s3fs"]["x_needed"] == 5.0 and s["s3fs"]["fetched_bytes"] == 10**8
    assert "x_s3fs" not in s["s3fs"] and "x_local" not in s["local-dir"]


def test_the_report_section_has_a_row_per_result() -> None:
    lines = parquet.markdown(_report())
    assert lines[0].startswith("## Parquet")
    assert any("first-read cost" in line for line in lines)
    rows = [line for line in lines if line.startswith("| parquet")]
    assert len(rows) == 3
    assert "| shoal-fsspec | 0.400 | 0.25 | 5.00 | 0.0 | 0.00 |" in rows[2]
    assert parquet.markdown(Report(Config(), {})) == []
    moto = _report()
    moto.config = Config(store="moto")
    assert any("On moto a ranged GET" in line for line in parquet.markdown(moto))
    assert not any("On moto" in line for line in lines)

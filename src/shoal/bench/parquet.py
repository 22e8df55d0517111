"""The ``parquet`` workload: random-access reads of one parquet file, the way the Python
data stack does them (issue 11 item 8).

One file of float64 columns in several row groups is written into the local data
directory and the store. Each contender then reads two non-adjacent columns of it,
(a) with ``pandas.read_parquet(url, columns=...)`` and (b) with pyarrow
``ParquetFile.read_row_group(i, columns=...)`` for every row group, each read in a
fresh reader process whose time includes creating the filesystem client, opening the
file and reading its footer: the first-read cost a new worker process pays, not the
Python imports (done before the clock starts). Cold means the contender's cache is
empty (and the page cache dropped); warm means the cold read's pages are cached.

The delay proxy in front of the store counts the bytes it carries, so each read of a
remote or caching contender also says how many bytes it fetched from the store, and
how that compares with the bytes the projection needs (the footer plus the two
columns' chunks).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.bench import runner
from shoal.bench.contenders import KEY as ACCESS_KEY
from shoal.bench.contenders import SECRET, Contender, _s3fs, boto3_client
from shoal.bench.stats import Result, Sample, ratio

if TYPE_CHECKING:
    from shoal.bench.suite import Config, Report

#: the file's key in the bucket and under the local data directory
KEY = "parquet/table.parquet"
#: who reads it: the physical limit, direct S3 through fsspec, and shoal through fsspec
CONTENDERS = ("local-dir", "s3fs", "shoal-fsspec")
PANDAS, GROUPS = "parquet read_parquet", "parquet row-groups"
#: (workload, cold) in the order they run: each warm pass reads what the cold one cached
PASSES = ((PANDAS, True), (PANDAS, False), (GROUPS, True), (GROUPS, False))

#: runs one pass and records it, as workloads.Measure
Measure = Callable[[str, Contender, Callable[[], Sample], bool], Sample | None]


@dataclass(frozen=True)
class TableSpec:
    """The file: ``columns`` float64 columns of random values (incompressible, so the
    file is about ``size`` bytes) in ``row_groups`` groups; ``projected`` are the
    indices of the columns read."""

    size: int
    columns: int = 10
    row_groups: int = 8
    projected: tuple[int, ...] = (2, 7)
    seed: int = 11

    def __post_init__(self) -> None:
        if self.columns < 1 or self.row_groups < 1:
            raise ValueError(f"parquet: columns and row groups must be >= 1, got "
                             f"{self.columns} and {self.row_groups}")  # fmt: skip
        if not self.projected or any(not 0 <= i < self.columns for i in self.projected):
            raise ValueError(f"parquet: projected columns {self.projected} not all in "
                             f"0..{self.columns - 1}")  # fmt: skip
        if self.group_rows < 1:
            raise ValueError(f"parquet: {self.size:,} bytes is too small for "
                             f"{self.row_groups} row groups of {self.columns} columns")  # fmt: skip

    @property
    def group_rows(self) -> int:
        return self.size // (8 * self.columns * self.row_groups)

    @property
    def rows(self) -> int:
        """Whole row groups only, so every group has the same size."""
        return self.group_rows * self.row_groups

    @property
    def names(self) -> list[str]:
        return [f"c{i}" for i in range(self.columns)]

    @property
    def projection(self) -> list[str]:
        return [self.names[i] for i in self.projected]

    @property
    def table_bytes(self) -> int:
        """Bytes of the projected columns once decoded (what a read hands back)."""
        return self.rows * 8 * len(self.projected)

    def digest(self) -> str:
        text = f"{self.rows}/{self.columns}/{self.row_groups}/{self.seed}/snappy-plain"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Chunk:
    """One column chunk of the file: where it lies."""

    row_group: int
    column: str
    offset: int
    size: int


@dataclass
class Layout:
    """What a projection must read: the file's size, footer and column chunks."""

    file_size: int
    footer: int  # the metadata plus its 8-byte trailer
    chunks: list[Chunk] = field(default_factory=list)

    def needed(self, columns: list[str]) -> int:
        """The fewest bytes a reader of ``columns`` (every row group) touches."""
        want = set(columns)
        missing = want - {c.column for c in self.chunks}
        if missing:
            raise ValueError(f"parquet: no column {sorted(missing)[0]} in the file")
        return self.footer + sum(c.size for c in self.chunks if c.column in want)


def layout(path: Path) -> Layout:
    """The layout of a parquet file, from its footer."""
    import pyarrow.parquet as pq

    md = pq.ParquetFile(path).metadata
    chunks = []
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for j in range(rg.num_columns):
            col = rg.column(j)
            start = col.dictionary_page_offset or col.data_page_offset
            chunks.append(Chunk(g, col.path_in_schema, start, col.total_compressed_size))
    return Layout(path.stat().st_size, md.serialized_size + 8, chunks)


def write(spec: TableSpec, path: Path) -> None:
    """The file at ``path`` (kept when a marker says it is this spec's)."""
    marker = path.with_name(f".complete-{spec.digest()}")
    if marker.exists() and path.exists():
        return
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob(".complete-*"):
        old.unlink()
    rng = np.random.default_rng(spec.seed)
    schema = pa.schema([(n, pa.float64()) for n in spec.names])
    # plain pages: random floats defeat dictionaries, and a dictionary fallback would
    # make column chunk sizes depend on pyarrow's page limits
    with pq.ParquetWriter(path, schema, compression="snappy", use_dictionary=False) as w:
        for _ in range(spec.row_groups):
            cols = [pa.array(rng.random(spec.group_rows)) for _ in spec.names]
            w.write_table(pa.Table.from_arrays(cols, schema=schema), spec.group_rows)
    marker.write_text("ok\n")


def upload(spec: TableSpec, path: Path, endpoint: str, bucket: str) -> float:
    """Put the file into the store (directly, unshaped) unless the same spec is there;
    seconds taken."""
    s3 = boto3_client(endpoint)
    try:
        head = s3.head_object(Bucket=bucket, Key=KEY)
        if head.get("Metadata", {}).get("spec") == spec.digest():
            return 0.0
    except Exception:  # not there yet (a 404 is a ClientError)
        pass
    t0 = time.perf_counter()
    s3.upload_file(str(path), bucket, KEY, ExtraArgs={"Metadata": {"spec": spec.digest()}})
    return time.perf_counter() - t0


# -- reading, in the reader process ---------------------------------------------------


@dataclass(frozen=True)
class Source:
    """How one contender names the file: for pandas (``url`` + ``storage_options``),
    and for pyarrow (a local path, or an fsspec filesystem made by ``fs`` and a path
    in it)."""

    url: str
    storage_options: dict[str, Any] | None = None
    fs: Callable[[], Any] | None = None
    fs_path: str = ""


def _fsspec_shoal(master: str) -> Any:
    import fsspec

    return fsspec.filesystem("shoal", master=master, skip_instance_cache=True)


def source(c: Contender) -> Source:
    env = c.env
    if c.name == "local-dir":
        return Source(str(env.local_root / KEY))
    if c.name == "s3fs":
        so = {"key": ACCESS_KEY, "secret": SECRET, "endpoint_url": env.endpoint,
              "client_kwargs": {"region_name": "us-east-1"}, "skip_instance_cache": True}  # fmt: skip
        return Source(f"s3://{env.bucket}/{KEY}", so, partial(_s3fs, env.endpoint),
                      f"{env.bucket}/{KEY}")  # fmt: skip
    if c.name == "shoal-fsspec":
        path = f"{env.dataset}/data/{KEY}"
        so = {"master": env.master, "skip_instance_cache": True}
        return Source(f"shoal://{path}", so, partial(_fsspec_shoal, env.master), "/" + path)
    raise ValueError(f"parquet: no reader for contender {c.name}; known: {', '.join(CONTENDERS)}")


def read_pandas(src: Source, columns: list[str]) -> int:
    """``pandas.read_parquet`` of the projection: bytes of the frame it returns."""
    import pandas as pd

    kw = {"storage_options": src.storage_options} if src.storage_options else {}
    df = pd.read_parquet(src.url, columns=columns, **kw)
    return int(df.memory_usage(index=False).sum())


def read_row_groups(src: Source, columns: list[str]) -> int:
    """pyarrow ``read_row_group`` of the projection for every row group, on one opened
    file: bytes of the tables it returns."""
    import pyarrow.parquet as pq

    if src.fs is None:
        pf = pq.ParquetFile(src.url)
        return sum(pf.read_row_group(i, columns=columns).nbytes for i in range(pf.num_row_groups))
    with src.fs().open(src.fs_path, "rb") as f:
        pf = pq.ParquetFile(f)
        return sum(pf.read_row_group(i, columns=columns).nbytes for i in range(pf.num_row_groups))


class _OneRead(Contender):
    """Runs one read of ``workload`` in a reader process as a batch of one item; the
    reader, its filesystem and its file are all made after the clock starts."""

    batch = True

    def __init__(self, c: Contender, workload: str, columns: list[str]) -> None:
        super().__init__(c.env)
        self.inner, self.name, self.kind = c, c.name, c.kind
        self.workload, self.columns = workload, columns

    def batch_reader(self) -> Callable[[list[Any]], int]:
        # imports before the clock: they are the same for every contender
        import pandas  # noqa: F401
        import pyarrow.parquet  # noqa: F401

        if self.name == "s3fs":
            import s3fs  # noqa: F401
        elif self.name.startswith("shoal"):
            import shoal.fsspec  # noqa: F401
        src = source(self.inner)
        fn = read_pandas if self.workload == PANDAS else read_row_groups
        return lambda _items: fn(src, self.columns)

    def daemon_pids(self) -> list[int]:
        return self.inner.daemon_pids()


def one_read(c: Contender, workload: str, columns: list[str]) -> Sample:
    s = runner.run_plan(_OneRead(c, workload, columns), runner.Plan("batches", [[workload]]),
                        lambda _: 1)  # fmt: skip
    s.files = 1
    return s


# -- the passes -----------------------------------------------------------------------


def settled(counter: Callable[[], int], every: float = 0.2, most: float = 5.0) -> int:
    """The counter once it stops moving (a cache may still be landing readahead after
    the read returned), read at most ``most`` seconds."""
    last, end = counter(), time.monotonic() + most
    while time.monotonic() < end:
        time.sleep(every)
        now = counter()
        if now == last:
            break
        last = now
    return last


@dataclass
class Passes:
    """Each contender's parquet passes: cold then warm per read kind (cold passes
    ``cfg.cold_reps`` times, warm ``cfg.warm_reps``, a remote contender's warm once:
    with no cache it is the cold read again). ``counter`` gives the bytes carried from
    the store so far (None: not countable); ``fetched`` records each read's share."""

    cfg: Config
    spec: TableSpec
    measure: Measure
    counter: Callable[[], int] | None = None
    fetched: Callable[[str, str, int], None] = lambda wl, c, n: None
    read: Callable[[Contender, str, list[str]], Sample] = one_read

    def plan(self, c: Contender) -> list[tuple[str, bool]]:
        """(workload name, cold) for every pass ``c`` runs, in order."""
        out = []
        for wl, cold in PASSES:
            reps = self.cfg.cold_reps if cold else (1 if c.kind == "remote" else self.cfg.warm_reps)
            out += [(f"{wl} {'cold' if cold else 'warm'}", cold)] * max(1, reps)
        return out

    def run(self, c: Contender) -> None:
        failed: set[str] = set()
        for name, cold in self.plan(c):
            kind = name.rsplit(" ", 1)[0]
            if kind in failed:
                continue  # a warm pass after a failed cold one would read nothing cached
            s = self.measure(name, c, partial(self._counted, c, kind, name), cold)
            if s is None:
                failed.add(kind)

    def _counted(self, c: Contender, kind: str, name: str) -> Sample:
        count = self.counter if c.kind != "local" else None
        before = count() if count else 0
        s = self.read(c, kind, self.spec.projection)
        if count:
            self.fetched(name, c.name, settled(count) - before)
        return s


# -- the report -----------------------------------------------------------------------


def summary(
    results: Mapping[tuple[str, str], Result], fetched: Mapping[tuple[str, str], list[int]],
    needed: int,
) -> dict[str, dict[str, dict[str, float | None]]]:  # fmt: skip
    """Per parquet workload and contender: seconds per read, shoal / local and shoal /
    s3fs (rates, so > 1 is faster), and the median bytes fetched over the bytes needed."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for (wl, c), r in results.items():
        if not wl.startswith("parquet") or not r.ok:
            continue
        rates = {k[1]: v.files_per_s for k, v in results.items() if k[0] == wl and v.ok}
        row: dict[str, float | None] = {
            "s_per_read": _r(1 / r.files_per_s) if r.files_per_s else None
        }
        for ref, key in (("local-dir", "x_local"), ("s3fs", "x_s3fs")):
            if ref in rates and c != ref:
                row[key] = _r(ratio(rates[c], rates[ref]))
        got = sorted(fetched.get((wl, c), []))
        if got:
            mid = got[len(got) // 2]
            row["fetched_bytes"] = mid
            row["x_needed"] = _r(ratio(mid, needed))
        out.setdefault(wl, {})[c] = row
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _f(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def markdown(rep: Report) -> list[str]:
    """The report's parquet section (empty when the workload did not run)."""
    info = rep.extra.get("parquet")
    if not info:
        return []
    summ = summary(rep.results, rep.fetched, info["needed_bytes"])
    lines = [
        "## Parquet: a column projection and row-group reads", "",
        f"One {info['file_bytes'] / 1e6:,.1f} MB file, {info['columns']} float64 columns in "
        f"{info['row_groups']} row groups of {info['group_rows']:,} rows; every read takes 2 "
        f"non-adjacent columns ({', '.join(info['projection'])}), which need "
        f"{info['needed_bytes'] / 1e6:,.1f} MB of it (footer + their column chunks). "
        "`read_parquet` is `pandas.read_parquet(url, columns=...)`; `row-groups` is pyarrow "
        "`ParquetFile(f).read_row_group(i, columns=...)` for every row group. Each read runs "
        "in a fresh reader process and its time includes the first-read cost: creating the "
        "filesystem client, opening the file, reading the footer (imports excluded). "
        "x local and x s3fs: this contender's reads/s over theirs (> 1 is faster). "
        "Fetched: bytes the delay proxy carried from the store during the read (HTTP "
        "headers and listings included), median over runs; x needed: over the bytes the "
        "projection needs. CPU: reader process plus the contender's daemons, per read and "
        "per GB of the columns it returned (decoded).", "",
        "| workload | contender | s per read | x local | x s3fs | fetched MB | x needed | CPU s | CPU s/GB | runs | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    if rep.config.store == "moto":
        # measured: 17 ms per ranged GET of a 24 MB object, 120 ms of a 160 MB one
        lines[4:4] = [
            "On moto a ranged GET costs time in proportion to the object's size, whatever "
            "the range, so cold reads made of many small ranges (shoal's pages) are slower "
            "here than against a real store; compare cold rows on rgw.", "",
        ]  # fmt: skip
    for (wl, c), r in rep.results.items():
        if not wl.startswith("parquet"):
            continue
        row = summ.get(wl, {}).get(c, {})
        fb = row.get("fetched_bytes")
        cpu = _f(sorted(s.cpu_s for s in r.samples)[len(r.samples) // 2]) if r.ok else "-"
        per_gb = _f(r.cpu_s_per_gb) if r.ok and any(s.nbytes for s in r.samples) else "-"
        lines.append(
            f"| {wl} | {c} | {_f(row.get('s_per_read'), 3)} | {_f(row.get('x_local'))} | "
            f"{_f(row.get('x_s3fs'))} | {_f(None if fb is None else fb / 1e6, 1)} | "
            f"{_f(row.get('x_needed'))} | {cpu} | {per_gb} | {len(r.samples)} | {r.note} |"
        )
    return [*lines, ""]

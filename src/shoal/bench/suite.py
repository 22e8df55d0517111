"""The suite: which workloads run against which contenders, quick or full, and the
set-up and tear-down of everything they need (namespace, shaper, store, cluster)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from shoal.bench import latency, runner
from shoal.bench.contenders import REGISTRY, BenchEnv, Boto3, Contender
from shoal.bench.gatewayrun import gateway_targets
from shoal.bench.netshape import DelayProxy, Link, measure_link
from shoal.bench.stats import Result, Sample, Target
from shoal.bench.stores import DataSpec, MotoStore, RgwStore, Store, upload, write_local
from shoal.bench.workloads import Passes

log = logging.getLogger("shoal.bench")

BUCKET = "shoalbench"


@dataclass
class Config:
    quick: bool = False
    store: str = "rgw"  # "rgw" | "moto"
    workdir: Path = Path("/var/tmp/shoal-bench")
    small_files: int = 20_000
    mix_files: int = 1_000
    large_size: int = 1 << 30
    procs: int = 4  # N reader processes
    cold_threads: int = 16  # in-flight requests per reader process on cold epochs
    warm_threads: int = 1  # warm reads are CPU-bound: threads would only add GIL traffic
    warm_reps: int = 3
    cold_reps: int = 2
    rate_mbit: float = 2400.0  # ~300 MB/s, the field's per-stream object-store figure
    delay_ms: float = 2.0  # per direction: +4 ms per request round trip
    train_samples: int = 4_000
    train_workers: int = 2
    train_batch: int = 32
    train_step_ms: float = 10.0
    meta_stats: int = 2_000
    #: single 100 KB reads timed one by one per contender and pass (bench/latency.py)
    latency_reads: int = 2_000
    #: the parquet workload's file (bytes; its row groups: see bench/parquet.py)
    parquet_size: int = 160_000_000
    #: seconds after which a warm pass stops and is rated on what it read (the slowest
    #: peers would otherwise need hours), and the same for a cold pass; a peer whose cold
    #: pass was stopped reads only what it cached in its warm passes (see workloads.py)
    cap_s: float = 20.0
    cold_cap_s: float = 45.0
    contenders: list[str] = field(default_factory=list)  # empty: all available
    workloads: list[str] = field(default_factory=list)  # empty: all

    @classmethod
    def make(cls, quick: bool, **kw: Any) -> Config:
        if quick:
            base = dict(
                quick=True, store="moto", small_files=2_000, mix_files=150,
                large_size=32 << 20, procs=2, warm_reps=3, cold_reps=1,
                train_samples=1_000, meta_stats=500, latency_reads=300, cap_s=5.0, cold_cap_s=10.0,
                parquet_size=24_000_000,
            )  # fmt: skip
            base.update(kw)
            return cls(**base)  # type: ignore[arg-type]
        return cls(**kw)


def machine() -> dict[str, Any]:
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem / 2**30, 1),
        "kernel": platform.release(),
        "cpu": cpu,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


@dataclass
class Report:
    config: Config
    machine: dict[str, Any]
    results: dict[tuple[str, str], Result] = field(default_factory=dict)
    link: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    about: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    #: wall seconds per section (set-up, each contender, training, data operations)
    timing: dict[str, float] = field(default_factory=dict)
    #: bytes fetched from the store by each run of (workload, contender), where counted
    fetched: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    #: what a workload says about itself ("parquet": the file and the bytes it needs)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, workload: str, contender: str, sample: Sample | None, note: str = "") -> None:
        r = self.results.setdefault((workload, contender), Result(workload, contender))
        if sample is not None:
            r.samples.append(sample)
        if note:
            r.note = note


def targets(procs: int) -> list[Target]:
    cold = f"small-100KB cold p{procs}"
    return [  # noqa: RUF005
        Target("warm 100 KB, client >= 0.8x local page cache",
               ("small-100KB warm p1", "shoal-client"), ("small-100KB warm p1", "local-dir"), 0.8),
        Target("warm 100 KB, client >= 1.5x fsspec filecache",
               ("small-100KB warm p1", "shoal-client"), ("small-100KB warm p1", "fsspec-filecache"), 1.5),
        Target("warm 100 KB, FUSE >= 10x rclone VFS",
               ("small-100KB warm p1", "shoal-fuse"), ("small-100KB warm p1", "rclone-vfs"), 10.0),
        Target("cached large file via FUSE >= 0.9x local file",
               ("large seq warm", "shoal-fuse"), ("large seq warm", "local-dir"), 0.9, "mb_per_s"),
        Target("cold small-file epoch >= 0.9x raw parallel GETs (same shaper)",
               (cold, "shoal-client"), (cold, "boto3"), 0.9),
        Target("cold small-file epoch, cat_many >= 0.9x raw parallel GETs",
               (cold, "shoal-cat_many"), (cold, "boto3"), 0.9),
        Target("large warm sequential, client >= 0.5x local page cache",
               ("large seq warm", "shoal-client"), ("large seq warm", "local-dir"), 0.5, "mb_per_s"),
        Target("training loop warm >= 0.98x synthetic",
               ("train warm", "shoal-client"), ("train warm", "synthetic"), 0.98),
        Target("shoal load of the small files >= 0.9x raw parallel GETs (same shaper)",
               ("small-100KB load", "shoal-load"), (cold, "boto3"), 0.9),
        Target("listing a 1M-file dataset from its manifest in under 5 s",
               ("manifest list-all", "shoal-client"), ("manifest list-all", "goal"), 1.0),
    ] + gateway_targets(procs)  # fmt: skip


class Suite:
    def __init__(self, cfg: Config, say: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.say = say
        self.report = Report(cfg, machine())
        self.link: Link | None = None
        self.store: Store | None = None
        self.proxy: DelayProxy | None = None
        self.cluster: Any = None
        self.cluster_gen = 0
        self.env: BenchEnv | None = None
        self.table: Any = None  # the parquet workload's TableSpec, once written
        self.spec = DataSpec(
            cfg.small_files, mix_files=cfg.mix_files, large_size=cfg.large_size
        ).layout()

    # -- set-up -----------------------------------------------------------------------

    def _want(self, workload: str) -> bool:
        w = self.cfg.workloads
        return not w or any(workload.startswith(x) for x in w)

    def setup(self) -> None:
        cfg = self.cfg
        cfg.workdir.mkdir(parents=True, exist_ok=True)
        local = cfg.workdir / "data"
        t0 = time.perf_counter()
        write_local(self.spec, local)
        total = sum(self.spec.files.values())
        self.say(f"data: {len(self.spec.files)} files, {total / 1e9:.2f} GB in {local} "
                 f"({time.perf_counter() - t0:.0f}s)")  # fmt: skip
        self.link = Link().open()
        if cfg.store == "rgw":
            self.store = RgwStore(self.link, cfg.workdir / "rgw").start()
            marker: Path | None = cfg.workdir / "rgw" / f"uploaded-{BUCKET}"
        else:
            self.store = MotoStore(self.link).start()
            marker = None
        self.say(f"store: {self.store.kind} at {self.store.endpoint} (namespace {self.link.ns})")
        secs = upload(self.spec, local, self.store.endpoint, BUCKET, marker)
        self.say(f"upload: {secs:.0f}s")
        if self._want("parquet"):
            self.setup_parquet(local)
        self.report.link = measure_link(
            self.link, cfg.rate_mbit, cfg.delay_ms, 1.5 if cfg.quick else 3.0
        )
        for row in self.report.link:
            self.say(f"link: {row['path']}: {row['mb_per_s']} MB/s, rtt {row['rtt_ms']} ms")
        self.link.shape(cfg.rate_mbit)
        upstream = self.store.endpoint.replace("http://", "")
        self.proxy = DelayProxy(upstream, cfg.delay_ms).start()
        self.env = BenchEnv(cfg.workdir, self.proxy.endpoint, BUCKET, local)
        self.env.extra["shoal_cold"] = self.shoal_cold
        self.env.extra["direct_endpoint"] = self.store.endpoint

    def setup_parquet(self, local: Path) -> None:
        from shoal.bench import parquet

        assert self.store is not None
        self.table = parquet.TableSpec(self.cfg.parquet_size)
        path = local / parquet.KEY
        t0 = time.perf_counter()
        parquet.write(self.table, path)
        secs = parquet.upload(self.table, path, self.store.endpoint, BUCKET)
        lay = parquet.layout(path)
        t = self.table
        self.report.extra["parquet"] = {
            "file_bytes": lay.file_size, "columns": t.columns, "row_groups": t.row_groups,
            "group_rows": t.group_rows, "projection": t.projection,
            "needed_bytes": lay.needed(t.projection),
        }  # fmt: skip
        self.say(f"parquet: {lay.file_size / 1e6:.1f} MB, {t.row_groups} row groups, "
                 f"{time.perf_counter() - t0:.0f}s (upload {secs:.0f}s)")  # fmt: skip

    def shoal_cold(self) -> None:
        """A fresh cluster with empty caches and the dataset defined again."""
        from shoal.cli.local import LocalCluster
        from shoal.client import Client
        from shoal.core.types import Mount

        assert self.env is not None
        self.stop_cluster()
        self.cluster_gen += 1
        d = self.cfg.workdir / f"shoal-{self.cluster_gen}"
        shutil.rmtree(d, ignore_errors=True)
        # as many requests in flight to the store as the raw-GET reference keeps
        inflight = self.cfg.procs * self.cfg.cold_threads
        c = LocalCluster(d, workers=1, disk="24GiB", env=self.env.s3_env, ufs_concurrency=inflight)
        self.cluster = c
        c.start()
        self.env.master = c.master_url
        self.env.extra["cluster"] = c
        with Client(c.master_url) as cl:
            cl.create_dataset(
                self.env.dataset,
                [Mount("data", f"s3://{BUCKET}", {"endpoint_url": self.env.endpoint})],
            )

    def stop_cluster(self) -> None:
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.stop()
            shutil.rmtree(self.cluster.dir, ignore_errors=True)
            self.cluster = None

    def teardown(self) -> None:
        self.stop_cluster()
        if self.proxy is not None:
            self.proxy.stop()
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.stop()
        if self.link is not None:
            self.link.close()
        shutil.rmtree(self.cfg.workdir / "cache", ignore_errors=True)

    # -- running ----------------------------------------------------------------------

    def contenders(self) -> list[Contender]:
        assert self.env is not None
        out: list[Contender] = []
        names = self.cfg.contenders or list(REGISTRY)
        for name in names:
            cls = REGISTRY[name]
            c = cls(self.env)
            why = c.available()
            if why:
                self.report.skipped[name] = why
                self.say(f"skip {name}: {why}")
                continue
            self.report.about[name] = cls.about
            out.append(c)
        return out

    def _measure(
        self, wl: str, c: Contender, fn: Callable[[], Sample], cold: bool
    ) -> Sample | None:
        if cold:
            c.cold()
            if not runner.drop_caches():
                self.report.notes.append(
                    "drop_caches not permitted: cold local reads hit page cache"
                )
        try:
            s = fn()
        except Exception as exc:
            msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            self.say(f"  {wl:24} {c.name:20} FAILED: {msg}")
            log.debug("failure", exc_info=True)
            self.report.add(wl, c.name, None, f"failed: {msg}")
            return None
        self.report.add(wl, c.name, s)
        mbs = s.nbytes / s.seconds / 1e6 if s.seconds else 0
        capped = " (capped)" if s.read is not None else ""
        self.say(f"  {wl:24} {c.name:20} {s.files / s.seconds:10,.0f} files/s {mbs:8,.0f} MB/s "
                 f"{s.seconds:7.2f}s cpu {s.cpu_s:6.2f}s{capped}")  # fmt: skip
        return s

    def run_contender(self, c: Contender) -> None:
        spec = self.spec
        small, mix = spec.keys("small"), spec.keys("mix")
        Passes(self.cfg, self._measure, self._want).run(c, small, mix, spec.large_size)
        cfg = self.cfg
        if self._want("meta") and c.lister() is not None:
            dirs = sorted({k.rsplit("/", 1)[0] for k in small})
            stats = runner.shuffled(small, 9)[: cfg.meta_stats]
            for phase, cold in (("cold", True), ("warm", False)):
                if cold:
                    c.cold()
                try:
                    res = runner.metadata(c, dirs, stats)
                except Exception as exc:
                    self.report.add(f"meta ls {phase}", c.name, None, f"failed: {exc}"[:200])
                    continue
                if res:
                    self.report.add(f"meta ls {phase}", c.name, res[0])
                    self.report.add(f"meta stat {phase}", c.name, res[1])
                    self.say(f"  meta {phase:5} {c.name:20} ls {res[0].files / res[0].seconds:9,.0f} entries/s"
                             f"  stat {res[1].files / res[1].seconds:9,.0f}/s")  # fmt: skip
        if self._want("latency"):
            latency.run(self, c, small)
        if self._want("parquet") and "parquet" in self.report.extra:
            self.run_parquet(c)

    def run_parquet(self, c: Contender) -> None:
        from shoal.bench import parquet

        if c.name not in parquet.CONTENDERS:
            return
        proxy = self.proxy

        def fetched(wl: str, name: str, n: int) -> None:
            self.report.fetched.setdefault((wl, name), []).append(n)
            self.say(f"  {wl:24} {name:20} fetched {n / 1e6:,.1f} MB from the store")

        counter = (lambda: proxy.carried()[1]) if proxy is not None else None
        parquet.Passes(self.cfg, self.table, self._measure, counter, fetched).run(c)

    def run_train(self, by_name: dict[str, Contender]) -> None:
        from shoal.bench.train import train

        cfg = self.cfg
        keys = self.spec.keys("small")[: cfg.train_samples]
        args = (cfg.train_workers, cfg.train_batch, cfg.train_step_ms)
        todo: list[tuple[str, Contender | None, bool]] = [("synthetic", None, False)]
        # --quick: the target's pair and the mount; the slow peers' cold epochs only in full
        peers: tuple[str, ...] = ("local-dir", "shoal-client", "shoal-fuse")
        if not cfg.quick:
            peers += ("fsspec-filecache", "boto3")
        for name in peers:
            if name in by_name:
                todo.append((name, by_name[name], name not in ("local-dir", "boto3")))
        for name, c, needs_warmup in todo:
            try:
                if c is not None and needs_warmup:
                    c.setup()
                    train(c, keys, *args)  # the cold epoch fills the cache
                for _ in range(max(1, cfg.warm_reps - 1)):
                    s = train(c, keys, *args)
                    self.report.add("train warm", name, s)
                self.say(f"  train warm {name:20} {s.files / s.seconds:9,.0f} samples/s")
            except Exception as exc:
                self.report.add("train warm", name, None, f"failed: {exc}"[:200])
                self.say(f"  train warm {name:20} FAILED: {exc}")
            finally:
                if c is not None and needs_warmup:
                    with contextlib.suppress(Exception):
                        c.teardown()

    def run_gateway(self) -> None:
        """boto3 through the S3 gateway against boto3 direct and the Python client."""
        from shoal.bench import gateway

        assert self.env is not None
        large = "large/blob.bin" if self.cfg.large_size else None
        store = tuple(self.store.pids()) if self.store is not None else ()
        p = gateway.Passes(self.cfg, self.env, self._measure, self.spec.keys("small"), large,
                           self.say, store)  # fmt: skip
        self.report.about.update(gateway.ABOUT)
        self.report.about.setdefault("boto3", REGISTRY["boto3"].about)
        self.report.about.setdefault("shoal-client", REGISTRY["shoal-client"].about)
        try:
            p.run()
        finally:
            self.report.extra["gateway"] = p.cpu
            for k, v in p.cpu.items():
                self.say(f"  cpu {k}: {v}")

    def run_jobs(self) -> None:
        """Data operations: a load job against raw GETs, and listing from a manifest."""
        from shoal.bench import jobs

        assert self.env is not None
        if self._want("load"):
            self.shoal_cold()
            try:
                # the same files the raw-GET reference reads: the 100 KB set only
                s, view = jobs.load_job(self.env.master, self.env.dataset, "data/small")
                self.report.add("small-100KB load", "shoal-load", s,
                                f"{view['files_done']} loaded, {view['files_failed']} failed")  # fmt: skip
                self.say(f"  load {'':19} shoal-load {s.files / s.seconds:14,.0f} files/s "
                         f"{s.nbytes / s.seconds / 1e6:8,.0f} MB/s {s.seconds:7.2f}s")  # fmt: skip
            except Exception as exc:
                self.report.add("small-100KB load", "shoal-load", None, f"failed: {exc}"[:200])
        if self._want("manifest"):
            files = 100_000 if self.cfg.quick else 1_000_000
            try:
                m = jobs.manifest(self.env.master, self.cfg.workdir / "meta-tree", files)
            except Exception as exc:
                self.report.add("manifest list-all", "shoal-client", None, f"failed: {exc}"[:200])
                return
            scale = 1_000_000 / files  # the goal is stated for 1M files
            self.report.add("manifest list-all", "shoal-client",
                            Sample(m["list_all_s"], files, 0),
                            f"{files:,} files: manifest built in {m['build_s']:.1f}s, listed in "
                            f"{m['list_all_s']:.2f}s; {m['stats_per_s']:,.0f} stat/s")  # fmt: skip
            self.report.add("manifest list-all", "goal", Sample(5.0 / scale, files, 0),
                            "1M files in 5 s")  # fmt: skip
            self.say(f"  manifest {files:,} files: built {m['build_s']:.1f}s, all listed "
                     f"{m['list_all_s']:.2f}s, {m['stats_per_s']:,.0f} stat/s")  # fmt: skip

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Say and record how long a part of the run took."""
        t0 = time.perf_counter()
        self.say(f"[{name}]")
        try:
            yield
        finally:
            secs = time.perf_counter() - t0
            self.report.timing[name] = round(self.report.timing.get(name, 0.0) + secs, 1)
            self.say(f"[{name}] {secs:.0f}s")

    def run(self) -> Report:
        t0 = time.perf_counter()
        try:
            with self.section("set-up"):
                self.setup()
            assert self.env is not None
            with self.section("set-up"):
                self.shoal_cold()
            cs = self.contenders()
            # the link check at the epoch level: raw GETs without the shaper
            if "boto3" in [c.name for c in cs] and self._want("small"):
                direct = dataclasses.replace(self.env, endpoint=self.env.extra["direct_endpoint"])
                b = Boto3(direct)
                b.name = "boto3-unshaped"
                self.report.about["boto3-unshaped"] = (
                    "raw parallel GETs straight to the store (no tbf, no delay)"
                )
                self._measure(f"small-100KB cold p{self.cfg.procs}", b,
                              partial(runner.epoch, b, self.spec.keys("small"), self.cfg.procs, self.cfg.cold_threads, 100, cap_s=self.cfg.cold_cap_s), True)  # fmt: skip
            if self._want("gateway"):
                with self.section("S3 gateway"):
                    self.run_gateway()
                    self.shoal_cold()  # what follows starts from an empty cache, as before
            # the per-contender workloads; none asked for: no contender's set-up
            per_contender = ("small", "mix", "large", "meta", "latency", "parquet")
            for c in cs if any(self._want(w) for w in per_contender) else []:
                with self.section(c.name):
                    try:
                        c.setup()
                    except Exception as exc:
                        self.report.skipped[c.name] = f"setup failed: {exc}"[:200]
                        self.say(f"skip {c.name}: setup failed: {exc}")
                        continue
                    try:
                        self.run_contender(c)
                    finally:
                        c.teardown()
            if self._want("train"):
                with self.section("training loop"):
                    self.run_train({c.name: c for c in cs})
            if self._want("load") or self._want("manifest"):
                with self.section("data operations"):
                    self.run_jobs()
        finally:
            self.teardown()
            self.report.seconds = time.perf_counter() - t0
        return self.report

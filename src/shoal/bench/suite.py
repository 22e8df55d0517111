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
from shoal.bench.config import Config
from shoal.bench.contenders import REGISTRY, BenchEnv, Boto3, Contender
from shoal.bench.netshape import DelayProxy, Link, measure_link
from shoal.bench.stats import Result, Sample
from shoal.bench.stores import DataSpec, MotoStore, RgwStore, Store, upload, write_local
from shoal.bench.targets import targets
from shoal.bench.workloads import Passes

log = logging.getLogger("shoal.bench")

BUCKET = "shoalbench"

__all__ = ["Config", "Report", "Suite", "targets"]


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
        self.images: Any = None  # the training loop's ImageSet, once written
        self.spec = DataSpec(
            cfg.small_files, mix_files=cfg.mix_files, large_size=cfg.large_size
        ).layout()

    # -- set-up -----------------------------------------------------------------------

    def _want(self, workload: str) -> bool:
        w = self.cfg.workloads
        if workload == "scale" and not w:
            return not self.cfg.quick  # --quick: only when asked for
        return not w or any(workload.startswith(x) for x in w)

    def _needs_store(self) -> bool:
        others = ("small", "mix", "large", "meta", "latency", "parquet", "train", "load",
                  "manifest", "gateway")  # fmt: skip
        return any(self._want(w) for w in others)

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
        if self._want("train"):
            self.setup_images(local, marker)
        self.report.link = measure_link(
            self.link, cfg.rate_mbit, cfg.delay_ms, cfg.link_seconds, cfg.every_link_path
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

    def setup_images(self, local: Path, marker: Path | None) -> None:
        from shoal.bench.images import ImageSet

        assert self.store is not None
        t0 = time.perf_counter()
        self.images = ImageSet(self.cfg.train_images).write(local)
        spec = DataSpec(0, large_size=0)
        spec.files = dict(self.images.files)
        m = None if marker is None else marker.with_name(f"{marker.name}-img")
        secs = upload(spec, local, self.store.endpoint, BUCKET, m)
        total = sum(spec.files.values())
        self.say(f"images: {len(spec.files)} JPEGs, {total / 1e6:.0f} MB, "
                 f"{time.perf_counter() - t0:.0f}s (upload {secs:.0f}s)")  # fmt: skip

    def shoal_cold(self) -> None:
        """A fresh cluster with empty caches and the dataset defined again. --quick: a
        new dataset over the same bucket on the running cluster instead (none of it is
        cached: pages are keyed by dataset; a restart costs seconds each, most of a
        quick run's shoal sections)."""
        assert self.env is not None
        t0 = time.perf_counter()
        try:
            if self.cfg.quick and self.cluster is not None:
                self._fresh_dataset()
            else:
                self._fresh_cluster()
        finally:  # inside the sections above: how much of them went to restarts
            k = "(within the above) fresh clusters for cold passes"
            self.report.timing[k] = round(
                self.report.timing.get(k, 0.0) + time.perf_counter() - t0, 1
            )

    def _fresh_dataset(self) -> None:
        from shoal.client import Client
        from shoal.core.types import Mount

        assert self.env is not None and self.cluster is not None
        self.cluster_gen += 1
        self.env.dataset = f"bench{self.cluster_gen}"
        with Client(self.cluster.master_url) as cl:
            cl.create_dataset(
                self.env.dataset,
                [Mount("data", f"s3://{BUCKET}", {"endpoint_url": self.env.endpoint})],
            )

    def _fresh_cluster(self) -> None:
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
        # the manifest workload's file:// tree lives under the workdir (default /var/tmp)
        c = LocalCluster(d, workers=1, disk="24GiB", env=self.env.s3_env, ufs_concurrency=inflight,
                         file_roots=(str(self.cfg.workdir),))  # fmt: skip
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
        else:
            # a warm pass reads cached data at rest, for every contender alike: else the
            # kernel's writeback of what the cold pass cached (GBs of dirty pages) runs
            # during it for the contenders that write a cache (shoal's workers, rclone,
            # s3fs-fuse, fsspec's filecache) and not for the local directory. Measured:
            # a fresh reader of a 512 MiB file cached just before, 0.69-0.71x a local
            # file during that writeback, 0.80-0.84x after a sync
            os.sync()
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
            dirs = sorted({k.rsplit("/", 1)[0] for k in small})[: cfg.meta_dirs]
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

    def run_gateway(self) -> None:
        """boto3 through the S3 gateway against boto3 direct and the Python client."""
        from shoal.bench import gateway

        assert self.env is not None
        large = "large/blob.bin" if self.cfg.large_size else None
        store = tuple(self.store.pids()) if self.store is not None else ()
        small = self.spec.keys("small")[: self.cfg.gateway_keys]  # --quick: 400, not 1000
        p = gateway.Passes(self.cfg, self.env, self._measure, small, large, self.say, store)
        self.report.about.update(gateway.ABOUT)
        self.report.about.setdefault("boto3", REGISTRY["boto3"].about)
        self.report.about.setdefault("shoal-client", REGISTRY["shoal-client"].about)
        try:
            p.run()
        finally:
            self.report.extra["gateway"] = p.cpu
            for k, v in p.cpu.items():
                self.say(f"  cpu {k}: {v}")

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

    def run_store(self) -> None:
        """Every workload that reads the shaped store."""
        with self.section("set-up"):
            self.setup()
        assert self.env is not None
        with self.section("set-up"):
            self.shoal_cold()
            if self.cfg.quick:  # the full run keeps its readers' imports as they were
                self.say(f"reader libraries imported once: {runner.preload():.1f}s")
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
            from shoal.bench import train

            with self.section("training loop"):
                train.run_suite(self, {c.name: c for c in cs})
        if self._want("load") or self._want("manifest"):
            from shoal.bench import jobs

            with self.section("data operations"):
                jobs.run_suite(self)

    def run(self) -> Report:
        t0 = time.perf_counter()
        try:
            if self._needs_store():
                self.run_store()
            if self._want("scale"):
                from shoal.bench import scale

                with self.section("scale"):
                    scale.run(self)
        finally:
            self.teardown()
            self.report.seconds = time.perf_counter() - t0
        return self.report

"""The ``latency`` workload: how long single reads take, not how many a pass makes.

A training step waits for the slowest sample of its batch, so the tail matters as much
as the rate. For each contender that reads one file per call: after its ``cold()``
(and a page-cache drop), one reader process reads :attr:`Config.latency_reads` shuffled
100 KB files one at a time, timing each read; then the same files again, warm. The
report gives p50, p90, p99, p99.9 and the maximum per contender and pass, and one CDF
chart of every contender's reads.

Numbers are in milliseconds of wall time per read in the reader, the whole call
(open, read, close or the client call), on a machine shared with the store and the
cache: compare contenders of the same run, not runs.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import resource
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.bench import runner
from shoal.bench.contender import Contender

if TYPE_CHECKING:
    from shoal.bench.suite import Suite

#: the quantiles reported
QUANTILES = (0.5, 0.9, 0.99, 0.999)
PASSES = ("cold", "warm")


@dataclass(frozen=True)
class Latencies:
    contender: str
    phase: str  # "cold" | "warm"
    seconds: tuple[float, ...]  # one per read, in read order
    cpu_s: float = 0.0  # the reader process and the contender's daemons, over the pass
    nbytes: int = 0

    @property
    def cpu_s_per_gb(self) -> float | None:
        return self.cpu_s / (self.nbytes / 1e9) if self.nbytes else None

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (nearest rank) in seconds."""
        xs = sorted(self.seconds)
        if not xs:
            return float("nan")
        rank = min(len(xs) - 1, max(0, int(q * len(xs) + 0.999999) - 1))
        return xs[rank]

    def to_dict(self) -> dict[str, Any]:
        ms = {f"p{q * 100:g}": round(self.quantile(q) * 1e3, 3) for q in QUANTILES}
        return {
            "contender": self.contender,
            "phase": self.phase,
            "reads": len(self.seconds),
            **ms,
            "max": round(max(self.seconds, default=0.0) * 1e3, 3),
            "cpu_s_per_gb": None if self.cpu_s_per_gb is None else round(self.cpu_s_per_gb, 2),
        }


def _child(contender: Contender, keys: list[str], cap_s: float | None, out: Any) -> None:
    try:
        read = contender.reader()
        times = []
        clock = time.perf_counter
        nbytes = 0
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        end = clock() + cap_s if cap_s else float("inf")
        for k in keys:
            if clock() > end:
                break  # a slow peer: the reads so far (the table gives their count)
            t0 = clock()
            nbytes += read(k)
            times.append(clock() - t0)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        out.put((times, None, cpu, nbytes))
        with contextlib.suppress(Exception):
            contender.close_reader()
    except BaseException as exc:  # reported to the parent
        out.put(([], f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}", 0.0, 0))


def measure(contender: Contender, keys: list[str], timeout: float = 600) -> list[float]:
    """Seconds per read of each key, read one after another in one new process."""
    return timed(contender, keys, timeout)[0]


def timed(
    contender: Contender, keys: list[str], timeout: float = 600, cap_s: float | None = None
) -> tuple[list[float], float, int]:
    """(seconds per read, CPU seconds of the reader and the daemons, bytes read); with
    ``cap_s``, the reads stop after that many seconds."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_child, args=(contender, keys, cap_s, out))
    pids = contender.daemon_pids()
    d0 = runner.proc_cpu(pids)
    p.start()
    try:
        times, err, cpu, nbytes = out.get(timeout=timeout)
        cpu += runner.proc_cpu(pids) - d0
    finally:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
    if err:
        raise RuntimeError(err)
    return list(times), cpu, nbytes


def run(suite: Suite, c: Contender, small: list[str]) -> None:
    """Both passes for contender ``c`` into ``suite.report.extra["latency"]``."""
    if c.batch or not small:
        return
    keys = runner.shuffled(small, 77)[: suite.cfg.latency_reads]
    got = suite.report.extra.setdefault("latency", [])
    for phase in PASSES:
        if phase == "cold":
            c.cold()
            runner.drop_caches()
        try:
            times, cpu, nbytes = timed(c, keys, cap_s=suite.cfg.latency_cap_s)
            lat = Latencies(c.name, phase, tuple(times), cpu, nbytes)
        except Exception as exc:
            msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            suite.say(f"  latency {phase:5} {c.name:20} FAILED: {msg}")
            return
        got.append(lat)
        if phase == "cold":
            keys = keys[: len(times)]  # a capped cold pass: warm reads only what it cached
        d = lat.to_dict()
        suite.say(f"  latency {phase:5} {c.name:20} p50 {d['p50']:8.3f} ms  p99 {d['p99']:8.3f} ms  "
                  f"p99.9 {d['p99.9']:8.3f} ms  max {d['max']:8.3f} ms")  # fmt: skip


def markdown(results: list[Latencies]) -> list[str]:
    if not results:
        return []
    lines = [
        "## Latency of single 100 KB reads",
        "",
        "One reader process, one read at a time, the same shuffled files cold (after each "
        "contender's cold reset and a page-cache drop) then warm. Milliseconds per read; "
        "CPU: the reader process plus the contender's daemons over the pass, per GB read.",
        "",
        "| contender | pass | reads | p50 | p90 | p99 | p99.9 | max | CPU s/GB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lat in sorted(results, key=lambda x: (x.phase, x.contender)):
        d = lat.to_dict()
        cpu = "-" if d["cpu_s_per_gb"] is None else f"{d['cpu_s_per_gb']:,.2f}"
        lines.append(
            f"| {lat.contender} | {lat.phase} | {d['reads']:,} | {d['p50']:.3f} | {d['p90']:.3f} "
            f"| {d['p99']:.3f} | {d['p99.9']:.3f} | {d['max']:.3f} | {cpu} |"
        )
    return [*lines, ""]


def chart(results: list[Latencies], outdir: Path) -> Path | None:
    """A CDF of every contender's read latencies, cold and warm side by side."""
    if not results:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    outdir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), squeeze=False)
    for ax, phase in zip(axes[0], PASSES, strict=True):
        for lat in (x for x in results if x.phase == phase):
            xs = sorted(t * 1e3 for t in lat.seconds)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            width = 2.0 if lat.contender.startswith("shoal") else 1.0
            ax.plot(xs, ys, label=lat.contender, linewidth=width)
        ax.set_xscale("log")
        ax.set_title(f"100 KB read latency, {phase}", fontsize=9)
        ax.set_xlabel("ms per read (log)", fontsize=8)
        ax.set_ylabel("fraction of reads", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.tick_params(labelsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    fig.tight_layout()
    path = outdir / "latency-cdf.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

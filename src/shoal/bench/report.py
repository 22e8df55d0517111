"""Writing the results: one JSON object, BENCHMARKS.md tables, PNG charts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from shoal.bench import latency, parquet, scale
from shoal.bench.stats import Result, ratio
from shoal.bench.suite import Report, targets

LOCAL = "local-dir"


def _rate(r: Result) -> float:
    """The headline rate of a result: MB/s for large-file workloads, files/s otherwise."""
    return r.mb_per_s if r.workload.startswith("large") else r.files_per_s


def _unit(wl: str) -> str:
    if wl.startswith("large"):
        return "MB/s"
    if wl.startswith("meta"):
        return "entries/s"
    if wl.startswith("train"):
        return "samples/s"
    return "reads/s" if wl.startswith("parquet") else "files/s"


def workloads(rep: Report) -> list[str]:
    seen: list[str] = []
    for wl, _ in rep.results:
        if wl not in seen:
            seen.append(wl)
    return seen


def ratios(rep: Report) -> dict[str, Any]:
    """Per workload: each contender against the physical limit and against every peer;
    plus the issue's targets."""
    out: dict[str, Any] = {"to_local": {}, "to_peers": {}, "targets": []}
    for wl in workloads(rep):
        rates = {c: _rate(r) for (w, c), r in rep.results.items() if w == wl and r.ok}
        if LOCAL in rates:
            out["to_local"][wl] = {c: _round(ratio(v, rates[LOCAL])) for c, v in rates.items()}
        out["to_peers"][wl] = {
            a: {b: _round(ratio(va, vb)) for b, vb in rates.items() if b != a}
            for a, va in rates.items()
            if a.startswith("shoal")
        }
    for t in targets(rep.config.procs, tuple(rep.config.train_workers)):
        r, met = t.evaluate(rep.results)
        out["targets"].append({"target": t.label, "ratio": _round(r), "goal": t.factor, "met": met})
    if "parquet" in rep.extra:
        out["parquet"] = parquet.summary(
            rep.results, rep.fetched, rep.extra["parquet"]["needed_bytes"]
        )
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def to_json(rep: Report) -> dict[str, Any]:
    cfg = rep.config
    return {
        "machine": rep.machine,
        "config": {
            "quick": cfg.quick,
            "store": cfg.store,
            "small_files": cfg.small_files,
            "mix_files": cfg.mix_files,
            "large_bytes": cfg.large_size,
            "procs": cfg.procs,
            "cold_threads": cfg.cold_threads,
            "warm_threads": cfg.warm_threads,
            "rate_mbit": cfg.rate_mbit,
            "delay_ms_per_direction": cfg.delay_ms,
            "train_images": cfg.train_images,
            "train_workers": list(cfg.train_workers),
            "scale_files": list(cfg.scale_files),
        },
        "link": rep.link,
        "results": [r.to_dict() for r in rep.results.values()],
        "ratios": ratios(rep),
        "skipped": rep.skipped,
        "notes": sorted(set(rep.notes)),
        "seconds": round(rep.seconds, 1),
        "timing": rep.timing,
        "fetched": [
            {"workload": w, "contender": c, "bytes": v} for (w, c), v in rep.fetched.items()
        ],
        "parquet": rep.extra.get("parquet"),
        "gateway_cpu": rep.extra.get("gateway"),
        "latency": [x.to_dict() for x in rep.extra.get("latency", [])],
        "scale": rep.extra.get("scale"),
    }


TRAIN = (
    "Training loop (`train ...`): {n:,} JPEGs of 10-500 KB (log-uniform, made with Pillow) in "
    "10 class folders, read and decoded by a PyTorch DataLoader with {w} workers (rows `wN`), "
    "batches of {b}, a {s:g} ms model step per batch. Decode: PIL open, convert RGB, resize "
    "to 224x224, to a float tensor (torchvision's ImageFolder + Resize + ToTensor, written "
    "out: torchvision does not install beside the CPU torch). local-dir and shoal-fuse: the "
    "ImageFolder-like dataset over the local files and over the FUSE mount; shoal-torch: "
    "ShoalMapDataset with ShoalSampler; boto3: one GET per sample (cold reference); "
    "synthetic: a tensor in memory, no read or decode. Cold: the first epoch on a fresh "
    "cluster; warm: the epochs after it. CPU: the loop's process, its DataLoader workers "
    "and the loader's daemons."
)


def _fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def markdown(rep: Report, charts: list[str]) -> str:
    cfg, m = rep.config, rep.machine
    rat = ratios(rep)
    lines = [
        "# shoal benchmarks",
        "",
        f"Run {m['date']} with `shoal bench{' --quick' if cfg.quick else ''}` in {rep.seconds / 60:.1f} min. "
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, kernel {m['kernel']}, "
        f"Python {m['python']}. Everything (store, shaper, cache, readers) shares these cores.",
        "",
        f"Store: **{cfg.store}** in its own network namespace, behind tbf at {cfg.rate_mbit:g} mbit "
        f"(~{cfg.rate_mbit / 8:g} MB/s) each way and a delay proxy adding {cfg.delay_ms:g} ms per "
        f"direction. Data: {cfg.small_files:,} x 100 KB, {cfg.mix_files:,} files of 10 KB-5 MB "
        f"(log-uniform), one {cfg.large_size / 2**20:,.0f} MiB file. N = {cfg.procs} reader processes; "
        f"cold epochs keep {cfg.cold_threads} requests in flight per process, warm epochs 1 "
        "(they are CPU-bound). Rates are medians over runs; CPU is reader processes plus the "
        "contender's own daemons (shoal worker, FUSE daemon), not the store.",
        "",
        "## Targets",
        "",
        "| target | ratio | goal | met? |",
        "|---|---:|---:|---|",
    ]
    for t in rat["targets"]:
        met = "n/a (not measured)" if t["met"] is None else ("**yes**" if t["met"] else "**no**")
        lines.append(f"| {t['target']} | {_fmt(t['ratio'])} | {t['goal']} | {met} |")
    lines += ["", "## Results", ""]
    if any(wl.startswith("train") for wl in workloads(rep)):
        lines += [TRAIN.format(n=cfg.train_images, w=", ".join(map(str, cfg.train_workers)),
                               b=cfg.train_batch, s=cfg.train_step_ms), ""]  # fmt: skip
    for wl in workloads(rep):
        if wl.startswith("parquet"):
            continue  # its own section, below
        unit = _unit(wl)
        lines += [f"### {wl}", "", f"| contender | {unit} | MB/s | CPU s/GB | x local | runs | note |",
                  "|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
        for (w, c), r in rep.results.items():
            if w != wl:
                continue
            tl = rat["to_local"].get(wl, {}).get(c)
            has_bytes = r.ok and any(s.nbytes for s in r.samples)  # meta, manifests: no bytes
            cpu = _fmt(r.cpu_s_per_gb) if has_bytes else "-"
            lines.append(
                f"| {c} | {_fmt(_rate(r), 0) if r.ok else '-'} | "
                f"{_fmt(r.mb_per_s, 0) if has_bytes else '-'} | {cpu} | "
                f"{_fmt(tl)} | {len(r.samples)} | {r.note} |"
            )
        lines.append("")
    lines += parquet.markdown(rep)
    lines += latency.markdown(rep.extra.get("latency", []))
    lines += scale.markdown(rep.extra.get("scale") or [])
    lines += ["## Shoal against each peer", "",
              "Each cell: shoal's rate / the peer's rate on the same workload.", ""]  # fmt: skip
    for wl, rows in rat["to_peers"].items():
        for a, cols in rows.items():
            if cols:
                cells = ", ".join(f"{b} {_fmt(v)}" for b, v in cols.items())
                lines.append(f"- {wl}, **{a}**: {cells}")
    if rep.timing:
        lines += ["", "## Where the time went", "", "| section | seconds |", "|---|---:|"]
        lines += [f"| {k} | {v:,.0f} |" for k, v in rep.timing.items()]
    lines += ["", "## The shaper is not the bottleneck", "",
              "Raw TCP from the store's namespace (1 MiB writes) and a 1-byte ping:", "",
              "| path | MB/s | RTT ms |", "|---|---:|---:|"]  # fmt: skip
    for row in rep.link:
        lines.append(f"| {row['path']} | {row['mb_per_s']} | {row['rtt_ms']} |")
    lines.append("")
    if rep.skipped or rep.notes:
        lines += ["## Not measured", ""]
        lines += [f"- {k}: {v}" for k, v in rep.skipped.items()]
        lines += [f"- {n}" for n in sorted(set(rep.notes))]
        lines.append("")
    lines += ["## Contenders", ""]
    lines += [f"- **{k}**: {v}" for k, v in rep.about.items()]
    lines.append("")
    if charts:
        lines += ["## Charts", ""] + [f"![{Path(c).stem}]({c})" for c in charts] + [""]
    return "\n".join(lines)


def slug(wl: str) -> str:
    """A workload's chart file name: "small-100KB warm p1" -> "small-100kb-warm-p1"."""
    return re.sub(r"[^a-z0-9]+", "-", wl.lower()).strip("-")


def bars(rep: Report, wl: str) -> list[tuple[str, float, str]]:
    """One workload's bars, slowest first: (contender, rate, colour): shoal red, the
    local copy grey, the peers blue."""
    rs = [(c, _rate(r)) for (w, c), r in rep.results.items() if w == wl and r.ok]
    rs.sort(key=lambda x: x[1])
    colour = {True: "#d62728", False: "#1f77b4"}
    return [(c, v, "#7f7f7f" if c == LOCAL else colour[c.startswith("shoal")]) for c, v in rs]


def charts(rep: Report, outdir: Path, rel_to: Path) -> list[str]:
    """One horizontal bar chart per workload (shoal and the peers side by side) and the
    latency CDF; paths relative to ``rel_to``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    outdir.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    for wl in workloads(rep):
        rows = bars(rep, wl)
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.32 * len(rows)))
        ax.barh([c for c, _, _ in rows], [v for _, v, _ in rows], color=[k for _, _, k in rows])
        top = max(v for _, v, _ in rows) or 1.0
        for i, (_, v, _) in enumerate(rows):
            ax.text(v + top * 0.01, i, f"{v:,.0f}", va="center", fontsize=7)
        ax.set_xlim(0, top * 1.18)
        ax.set_title(wl, fontsize=9)
        ax.set_xlabel(_unit(wl), fontsize=8)
        ax.tick_params(labelsize=7)
        fig.tight_layout()
        p = outdir / f"{slug(wl)}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        made.append(p)
    cdf = latency.chart(rep.extra.get("latency", []), outdir)
    if cdf is not None:
        made.append(cdf)
    return [str(p.relative_to(rel_to)) if p.is_relative_to(rel_to) else str(p) for p in made]


#: text after this line in an existing report (the analysis) survives a new run
KEEP = "<!-- analysis: kept across runs -->"


def write(rep: Report, md_path: Path, chart_dir: Path) -> None:
    made = charts(rep, chart_dir, md_path.parent)
    tail = ""
    if md_path.exists():
        old = md_path.read_text()
        if KEEP in old:
            tail = old[old.index(KEEP) :]
    md_path.write_text(markdown(rep, made) + ("\n" + tail if tail else ""))

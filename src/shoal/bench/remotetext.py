"""The ``remote`` workload's section of BENCHMARKS.md."""

from __future__ import annotations

from typing import Any


def _spread(s: dict[str, float], fmt: str) -> str:
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"


def section(res: dict[str, Any], title: str) -> list[str]:
    cfg = res["config"]
    lines = [
        title,
        "",
        f"A client host reading a worker on another host (network namespaces joined by veth "
        f"pairs on a bridge, no shaper), every byte cached on the worker: a "
        f"{cfg['large_mib']:,} MiB file and {cfg['small_files']:,} files of 100 KB. The "
        f"references run in the same run, round-robin with the contenders "
        f"({cfg['rounds']} rounds; median, spread min-max): raw TCP between the same two "
        f"namespaces (`sendfile` of the file into the socket, `recv_into` a page-aligned "
        f"buffer), and the same reads short-circuited on the worker's own host. cat_many: "
        f"batches of {cfg['batch']} from {cfg['threads']} threads; its reference: "
        f"{cfg['threads']} connections of 100 KB request/response. CPU: the reader "
        f"process's and the serving process's (the worker, or the raw server) user+system "
        f"seconds per GB. "
        f"`python -m shoal.bench.remote{' --quick' if cfg['quick'] else ''}` "
        f"({res['seconds']:.0f} s); the machine is shared and noisy.",
        "",
        "| contender | host | MB/s | files/s | x raw TCP | reader CPU s/GB | server CPU s/GB |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in res["rows"].items():
        if r.get("failed"):
            lines.append(f"| {name} | | failed | | | | |")
            continue
        fps = _spread(r["files_per_s"], ",.0f") if r["kind"] == "small" else ""
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else ""
        lines.append(f"| {name} | {r['host']} | {_spread(r['mb_per_s'], ',.0f')} | {fps} | "
                     f"{ratio} | {_spread(r['cpu_s_per_gb'], '.2f')} | "
                     f"{_spread(r['server_cpu_s_per_gb'], '.2f') if 'server_cpu_s_per_gb' in r else ''} |")  # fmt: skip
    lines += ["", "| target | ratio | goal | |", "|---|---:|---:|---|"]
    for t in res["targets"]:
        met = "n/a" if t["met"] is None else ("met" if t["met"] else "**missed**")
        r = "-" if t["ratio"] is None else f"{t['ratio']:.2f}"
        lines.append(f"| {t['target']} | {r} | {t['goal']} | {met} |")
    lines += ["", f"TLS: {res['tls']}.", ""]
    if res.get("tls_cost"):
        lines += [
            "TLS's cost (the same reads against a worker serving TLS, a second cluster in "
            "the same run; its own raw TCP reference is in the table as `[tls run]`):",
            "",
            "| reads | plain MB/s | TLS MB/s | TLS / plain | reader CPU s/GB plain -> TLS "
            "| worker CPU s/GB plain -> TLS |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for t in res["tls_cost"]:
            rc, wc = t["reader_cpu"], t["worker_cpu"]
            lines.append(f"| {t['reads']} | {t['plain_mb_s']:,.0f} | {t['tls_mb_s']:,.0f} | "
                         f"{t['ratio']:.2f} | {rc[0]:.2f} -> {rc[1]:.2f} | "
                         f"{wc[0]:.2f} -> {wc[1]:.2f} |")  # fmt: skip
        lines.append("")
    return lines

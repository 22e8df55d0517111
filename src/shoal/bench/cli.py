"""``shoal bench``: shoal against the tools users would pick instead, and against the
physical limit, on this machine. Needs root (network namespace, tc, drop_caches,
FUSE); writes BENCHMARKS.md and docs/benchmarks/*.png unless told otherwise."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small data on moto: under 5 minutes")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--store", choices=("rgw", "moto"), help="default: moto with --quick, else rgw")
    p.add_argument("--workdir", type=Path, default=Path("/var/tmp/shoal-bench"))
    p.add_argument("--output", type=Path, default=Path("BENCHMARKS.md"), help="report file")
    p.add_argument("--charts", type=Path, default=Path("docs/benchmarks"), help="PNG folder")
    p.add_argument("--no-report", action="store_true", help="write no files")
    p.add_argument("--contender", action="append", default=[], help="only these (repeat)")
    p.add_argument("--workload", action="append", default=[],
                   help="only these: small, mix, large, meta, train, parquet, load, manifest, "
                        "gateway, latency, scale, remote (repeat; remote runs on namespaced hosts "
                        "of its own; scale runs in --quick only when named)")  # fmt: skip
    p.add_argument("--scale-files", type=lambda v: tuple(int(x) for x in v.split(",")),
                   help="scale: file counts, comma-separated (default 100000,1000000)")  # fmt: skip
    p.add_argument("--tls", action="store_true", help="remote: also against a worker over TLS")
    p.add_argument("--procs", type=int, help="N reader processes")
    p.add_argument("--small-files", type=int)
    p.add_argument("--mix-files", type=int)
    p.add_argument("--large-mib", type=int)
    p.add_argument("--parquet-mb", type=float, help="size of the parquet workload's file")
    p.add_argument("--rate-mbit", type=float)
    p.add_argument("--delay-ms", type=float)
    p.add_argument("--warm-reps", type=int)
    p.add_argument("--cold-reps", type=int)
    p.add_argument("--cap-s", type=float, help="stop a warm pass after this many seconds")
    p.add_argument("--cold-cap-s", type=float, help="stop a cold pass after this many seconds")


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_bench(args: argparse.Namespace) -> int:
    from shoal.bench import report
    from shoal.bench.contenders import REGISTRY
    from shoal.bench.suite import Config, Suite

    # a SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so that the suite's cleanup
    # removes its store, namespace, qdiscs and mounts instead of leaving them running
    signal.signal(signal.SIGTERM, _interrupted)
    if os.geteuid() != 0:
        print("shoal bench: needs root (network namespace, tc, drop_caches, FUSE)", file=sys.stderr)
        return 2
    unknown = [c for c in args.contender if c not in REGISTRY]
    if unknown:
        print(f"shoal bench: unknown contender {unknown[0]}; known: {', '.join(REGISTRY)}",
              file=sys.stderr)  # fmt: skip
        return 2
    for flag in ("cap_s", "cold_cap_s"):
        v = getattr(args, flag)
        if v is not None and not v > 0:
            print(f"shoal bench: --{flag.replace('_', '-')} must be a positive number of "
                  f"seconds, got {v}", file=sys.stderr)  # fmt: skip
            return 2
    kw: dict[str, Any] = {"workdir": args.workdir, "contenders": args.contender,
                          "workloads": args.workload}  # fmt: skip
    for name, attr in (("store", "store"), ("procs", "procs"), ("small_files", "small_files"),
                       ("mix_files", "mix_files"), ("rate_mbit", "rate_mbit"),
                       ("delay_ms", "delay_ms"), ("warm_reps", "warm_reps"),
                       ("cold_reps", "cold_reps"), ("cap_s", "cap_s"),
                       ("cold_cap_s", "cold_cap_s"), ("scale_files", "scale_files")):  # fmt: skip
        v = getattr(args, name)
        if v is not None:
            kw[attr] = v
    if args.large_mib is not None:
        kw["large_size"] = args.large_mib << 20
    if args.parquet_mb is not None:
        from shoal.bench.parquet import TableSpec

        kw["parquet_size"] = int(args.parquet_mb * 1e6)
        try:
            TableSpec(kw["parquet_size"])
        except ValueError as exc:
            print(f"shoal bench: --parquet-mb: {exc}", file=sys.stderr)
            return 2
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else (
        lambda s: print(s, flush=True))  # fmt: skip
    if "remote" in args.workload:
        _remote(args, say)
        kw["workloads"] = [w for w in args.workload if w != "remote"]
        if not kw["workloads"]:
            return 0
    cfg = Config.make(args.quick, **kw)
    rep = Suite(cfg, say).run()
    if not args.no_report:
        report.write(rep, args.output, args.charts)
        say(f"wrote {args.output} and charts in {args.charts}")
    if args.json:
        json.dump(report.to_json(rep), sys.stdout, separators=(",", ":"), default=str)
        sys.stdout.write("\n")
    else:
        for t in report.ratios(rep)["targets"]:
            met = "n/a" if t["met"] is None else ("MET" if t["met"] else "MISSED")
            r = "-" if t["ratio"] is None else f"{t['ratio']:.2f}"
            print(f"{met:6} {r:>6} (goal {t['goal']}) {t['target']}")
    return 0


def _remote(args: argparse.Namespace, say: Any) -> None:
    """The remote workload (its own namespaced cluster): its section of the report."""
    from shoal.bench import remote

    kw: dict[str, Any] = {"tls": args.tls}
    if args.small_files is not None:
        kw["small_files"] = args.small_files
    if args.large_mib is not None:
        kw["large_size"] = args.large_mib << 20
    res = remote.run(remote.RemoteConfig.make(args.quick, **kw), say)
    if "skipped" in res:
        say(f"remote: skipped: {res['skipped']}")
        return
    if not args.no_report:
        remote.write_section(args.output, remote.markdown(res))
    for t in res["targets"]:
        met = "n/a" if t["met"] is None else ("MET" if t["met"] else "MISSED")
        r = "-" if t["ratio"] is None else f"{t['ratio']:.2f}"
        say(f"{met:6} {r:>6} (goal {t['goal']}) {t['target']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="shoal bench", description=__doc__)
    _args(p)
    return cmd_bench(p.parse_args(argv))

"""The ``remote`` workload: the remote read path (a client host reading a worker on
another host over TCP) against raw TCP between the same two hosts, and against the
same reads short-circuited on the worker's own host, in one run.

The hosts are network namespaces (:mod:`shoal.testing.netns`): a master host, one
worker host, one client host (no worker of its own), joined by veth pairs on a bridge,
no shaper (so "the network's speed" is what the kernel moves between two namespaces
on this machine's CPUs). The dataset is a file:// directory (the namespaces share the
disk), loaded into the worker's cache before anything is measured, so every read is
warm: a 1 GiB file and 20,000 files of 100 KB (``--quick``: 256 MiB and 5,000).

Contenders, each a fresh process (:mod:`shoal.bench.remoteio`), run round-robin
``rounds`` times so that the machine's noise falls on all of them alike:

- ``raw-tcp``: ``sendfile`` of the worker host's copy of the file into one socket,
  ``recv_into`` a page-aligned buffer on the client host (the reference);
- ``raw-tcp 1MiB req``: the same, one 1 MiB request/response at a time (the client's
  round-trip pattern, without anything else of the client);
- ``raw-tcp 100KB xC``: C connections, each 100 KB request/response at a time (the
  small-file reference at cat_many's concurrency);
- ``shoal-tcp``: ``Client.read`` in 1 MiB reads (1 and 4 in flight; and 8 MiB reads,
  one request per 8 pages: what fewer round trips would give) and
  ``Client.cat_many`` in batches of 64 from C threads, short_circuit=False;
- ``shoal-short-circuit``: the same reads on the worker's own host (fds over the Unix
  socket, then ``pread``);
- ``shoal-tcp+tls``: ``shoal-tcp`` against a worker serving TLS (``--tls``; needs the
  worker's ``--tls-cert/--tls-key`` and the client's ``tls_ca``).

``python -m shoal.bench.remote [--quick] [--tls]`` runs it on its own;
``shoal bench --workload remote`` runs it and writes its section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.bench.remotetls import make_cert, tls_supported
from shoal.testing.cluster import S3_ENV

SECTION = "## Remote reads (TCP between hosts)"
DATASET = "remote"
SMALL = 100_000
CHUNK = 1 << 20
#: the raw TCP references' names in the run against a TLS worker
TLS_RUN = " [tls run]"


@dataclass
class RemoteConfig:
    workdir: Path = Path("/var/tmp/shoal-bench-remote")
    large_size: int = 1 << 30
    small_files: int = 20_000
    rounds: int = 3
    #: cat_many's batch, and the threads calling it (= raw TCP's connections)
    batch: int = 64
    threads: int = 4
    tls: bool = False
    quick: bool = False
    #: profile a TCP reader and the worker with py-spy into this folder
    profile: Path | None = None
    #: only the contenders whose names start with one of these (all when empty)
    only: tuple[str, ...] = ()
    #: A/B of client code: each shoal-tcp contender again as "NAME [TAG]" with
    #: PYTHONPATH=DIR (a patched copy of src/), same cluster, same rounds
    variants: tuple[tuple[str, str], ...] = ()

    @classmethod
    def make(cls, quick: bool, **kw: Any) -> RemoteConfig:
        if quick:
            kw = {"large_size": 256 << 20, "small_files": 5_000, "rounds": 2, **kw}
        return cls(quick=quick, **kw)


@dataclass
class Contender:
    name: str
    kind: str  # "large" | "small"
    host: str  # "client0" | "worker0"
    argv: Callable[[], list[str]]
    #: one per measured pass (each process first runs one unmeasured pass: a warm client)
    samples: list[dict[str, Any]] = field(default_factory=list)
    #: extra environment of its process
    env: dict[str, str] = field(default_factory=dict)


# -- data -----------------------------------------------------------------------------


def write_data(root: Path, large_size: int, small_files: int, say: Callable[[str], None]) -> None:
    """The large file and the small files, written once per size (a marker says so)."""
    marker = root / f".written-{large_size}-{small_files}"
    if marker.exists():
        return
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    for m in root.glob(".written-*"):
        m.unlink()
    pool = os.urandom(8 << 20)
    with open(root / "large.bin", "wb") as f:
        left, i = large_size, 0
        while left:
            n = min(left, 4 << 20)
            head = i.to_bytes(8, "little")  # every 4 MiB distinct: no dedup anywhere
            f.write(head + pool[(i * 4099) % (4 << 20) :][: n - 8])
            left -= n
            i += 1
    for i in range(small_files):
        d = root / "small" / f"{i // 100:03d}"
        if i % 100 == 0:
            d.mkdir(parents=True, exist_ok=True)
        off = (i * 7919) % (len(pool) - SMALL)
        (d / f"f{i:06d}.bin").write_bytes(i.to_bytes(8, "little") + pool[off : off + SMALL - 8])
    marker.touch()
    say(f"data: {large_size >> 20} MiB + {small_files:,} x 100 KB in {root} "
        f"({time.perf_counter() - t0:.0f}s)")  # fmt: skip


def small_paths(n: int) -> list[str]:
    return [f"/{DATASET}/data/small/{i // 100:03d}/f{i:06d}.bin" for i in range(n)]


# -- running ----------------------------------------------------------------------------


def _env(node: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(S3_ENV)
    env["SHOAL_NODE"] = node
    env.pop("SHOAL_MASTER", None)
    return env


def _in_host(
    mh: Any, host: str, argv: list[str], timeout: float, extra: dict[str, str] | None = None
) -> dict[str, Any]:
    h = mh.plan.host(host)
    full = mh.plan.exec_argv(host, [sys.executable, "-m", "shoal.bench.remoteio", *argv])
    env = {**_env(h.node), **(extra or {})}
    r = subprocess.run(full, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{host}: {' '.join(argv[:1])}: {r.stderr.strip()[-800:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def _cluster(cfg: RemoteConfig, say: Callable[[str], None], tls_dir: Path | None) -> Any:
    from shoal.testing import netns

    kw: dict[str, Any] = {"file_roots": (str(cfg.workdir),), "disk": "16GiB"}
    if tls_dir is not None:
        kw["role_args"] = {"worker": ["--tls-cert", str(tls_dir / "cert.pem"),
                                      "--tls-key", str(tls_dir / "key.pem")]}  # fmt: skip
    name = "cluster-tls" if tls_dir is not None else "cluster"
    shutil.rmtree(cfg.workdir / name, ignore_errors=True)  # a fresh master and cache
    return netns.multihost(cfg.workdir / name, workers=1, clients=1, **kw)


def _load(mh: Any, cfg: RemoteConfig, say: Callable[[str], None], tls_ca: str | None) -> None:
    ctl = mh.agent("client0")
    settings: dict[str, Any] = {"request_timeout": 120.0}
    if tls_ca:
        settings["tls_ca"] = tls_ca
    ctl.call("connect", master=mh.master_url, **settings)
    ctl.call("create_dataset", name=DATASET, url=f"file://{cfg.workdir / 'src'}")
    t0 = time.perf_counter()
    view = ctl.call("load", dataset=DATASET, timeout=1200.0, wait=1300.0)
    st = mh.worker_stats(0, DATASET, via="client0")
    say(f"load: {view['state']}, {st['cached_files']:,.0f} files, "
        f"{st['cached_bytes'] / 1e9:.2f} GB cached in {time.perf_counter() - t0:.0f}s")  # fmt: skip
    if st["cached_files"] < cfg.small_files + 1:
        raise RuntimeError(f"load left {st['cached_files']:.0f} files cached: {view}")


def contenders(
    cfg: RemoteConfig, mh: Any, port: int, paths_file: Path, tls_ca: str | None
) -> list[Contender]:
    w = mh.plan.host("worker0").addr
    big = f"/{DATASET}/data/large.bin"
    size, n = cfg.large_size, cfg.small_files
    master = ["--master", mh.master_url]
    tls = ["--tls-ca", tls_ca] if tls_ca else []
    raw = ["raw", "--host", w, "--port", str(port), "--file-size", str(size)]
    lg = ["large", *master, "--path", big, "--size", str(size), "--warm", "1", *tls]
    sm = ["small", *master, "--paths-file", str(paths_file), "--batch", str(cfg.batch),
          "--threads", str(cfg.threads), "--warm", "1", *tls]  # fmt: skip
    c = cfg.threads
    # against a TLS worker: "shoal-tls ..." and the same-run raw TCP "... [tls run]"
    tag, sh = (TLS_RUN, "shoal-tls") if tls_ca else ("", "shoal-tcp")
    out = [
        Contender("raw-tcp" + tag, "large", "client0",
                  lambda: [*raw, "--msg", str(size), "--total", str(size)]),
        Contender(f"raw-tcp 1MiB req{tag}", "large", "client0",
                  lambda: [*raw, "--msg", str(CHUNK), "--total", str(size)]),
        Contender(f"{sh} 1MiB x1", "large", "client0", lambda: lg),
        Contender(f"{sh} 1MiB x4", "large", "client0", lambda: [*lg, "--inflight", "4"]),
        Contender(f"{sh} 8MiB x1", "large", "client0",
                  lambda: [*lg, "--chunk", str(8 * CHUNK)]),
        Contender(f"raw-tcp 100KB x{c}{tag}", "small", "client0",
                  lambda: [*raw, "--msg", str(SMALL), "--total", str(SMALL * n), "--conns", str(c)]),
        Contender(f"{sh} cat_many", "small", "client0", lambda: sm),
    ]  # fmt: skip
    if not tag:
        out += [
            Contender("shoal-short-circuit 1MiB x1", "large", "worker0",
                      lambda: [*lg, "--short-circuit"]),
            Contender("shoal-short-circuit cat_many", "small", "worker0",
                      lambda: [*sm, "--short-circuit"]),
        ]  # fmt: skip
    return out


def _raw_server(mh: Any, cfg: RemoteConfig) -> tuple[subprocess.Popen[str], int]:
    h = mh.plan.host("worker0")
    argv = [sys.executable, "-m", "shoal.bench.remoteio", "serve", "--host", h.addr,
            "--file", str(cfg.workdir / "src" / "large.bin")]  # fmt: skip
    p = subprocess.Popen(mh.plan.exec_argv("worker0", argv), stdout=subprocess.PIPE, text=True,
                         start_new_session=True)  # fmt: skip
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        raise RuntimeError("the raw TCP server did not start")
    return p, int(json.loads(line)["port"])


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    f = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _measure(
    cs: list[Contender], mh: Any, rounds: int, say: Callable[[str], None], raw_pid: int
) -> None:
    """Each contender once per round, in turn; the serving process's CPU (the worker's,
    or the raw server's) per GB it sent, the reader's warm-up pass included."""
    wpid = mh.cluster.pids["worker-0"]
    for r in range(rounds):
        for c in cs:
            spid = raw_pid if c.name.startswith("raw-tcp") else wpid
            s0 = proc_cpu(spid)
            try:
                res = _in_host(mh, c.host, c.argv(), timeout=600, extra=c.env)
            except Exception as exc:  # one failed contender does not end the run
                say(f"  round {r + 1} {c.name:32} FAILED: {exc}")
                continue
            sent = sum(s["bytes"] for s in res["runs"]) * (1 if spid == raw_pid else 2)
            scpu = (proc_cpu(spid) - s0) / (sent / 1e9)
            for s in res["runs"]:
                s["server_cpu"] = scpu
                c.samples.append(s)
                say(f"  round {r + 1} {c.name:32} {s['bytes'] / s['seconds'] / 1e6:9,.0f} MB/s "
                    f"{s.get('files', 0) / s['seconds']:9,.0f} files/s  "
                    f"cpu {s['cpu'] / (s['bytes'] / 1e9):5.2f} s/GB, server {scpu:5.2f} s/GB")  # fmt: skip


def one_cluster(cfg: RemoteConfig, say: Callable[[str], None], tls: bool) -> list[Contender]:
    tls_dir = cfg.workdir / "tls" if tls else None
    tls_ca = None
    if tls_dir is not None:
        tls_ca = str(make_cert(tls_dir, "10.213.0.0/24"))
    paths_file = cfg.workdir / f"paths-{cfg.small_files}.txt"
    paths_file.write_text("\n".join(small_paths(cfg.small_files)))
    with _cluster(cfg, say, tls_dir) as mh:
        _load(mh, cfg, say, tls_ca)
        server, port = _raw_server(mh, cfg)
        try:
            cs = contenders(cfg, mh, port, paths_file, tls_ca)
            if cfg.only:
                cs = [c for c in cs if c.name.startswith(cfg.only)]
            cs += [
                Contender(f"{c.name} [{tag}]", c.kind, c.host, c.argv, env={"PYTHONPATH": path})
                for tag, path in cfg.variants
                for c in list(cs)
                if c.name.startswith("shoal-tcp")
            ]
            _measure(cs, mh, cfg.rounds, say, server.pid)
            if cfg.profile is not None and not tls:
                from shoal.bench.remoteprof import profile

                profile(mh, cfg, cs, say)
        finally:
            server.kill()
            server.wait()
    return cs


def run(cfg: RemoteConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    from shoal.testing import netns

    why = netns.unavailable()
    if why is not None:
        return {"skipped": f"namespaced hosts unavailable: {why}"}
    t0 = time.perf_counter()
    write_data(cfg.workdir / "src", cfg.large_size, cfg.small_files, say)
    cs = one_cluster(cfg, say, tls=False)
    tls_note = ""
    if cfg.tls:
        why_tls = tls_supported()
        if why_tls is None:
            cs += one_cluster(cfg, say, tls=True)
        else:
            tls_note = why_tls
            say(f"tls: skipped: {why_tls}")
    return summarize(cfg, cs, time.perf_counter() - t0, tls_note)


# -- results ----------------------------------------------------------------------------


def _stat(vals: list[float]) -> dict[str, float]:
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def summarize(cfg: RemoteConfig, cs: list[Contender], secs: float, tls_note: str) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for c in cs:
        if not c.samples:
            rows[c.name] = {"kind": c.kind, "failed": True}
            continue
        mbs = [s["bytes"] / s["seconds"] / 1e6 for s in c.samples]
        fps = [s.get("files", 0) / s["seconds"] for s in c.samples]
        cpu = [s["cpu"] / (s["bytes"] / 1e9) for s in c.samples]
        scpu = [s.get("server_cpu", 0.0) for s in c.samples]
        rows[c.name] = {"kind": c.kind, "host": c.host, "runs": len(c.samples),
                        "mb_per_s": _stat(mbs), "files_per_s": _stat(fps),
                        "cpu_s_per_gb": _stat(cpu), "server_cpu_s_per_gb": _stat(scpu)}  # fmt: skip
    refs = {"large": "raw-tcp", "small": f"raw-tcp 100KB x{cfg.threads}"}
    tls_refs = {k: v + TLS_RUN for k, v in refs.items()}
    for name, row in rows.items():
        if row.get("failed"):
            continue
        tls = name.startswith("shoal-tls") or name.endswith(TLS_RUN)
        ref = rows.get((tls_refs if tls else refs)[row["kind"]], {})
        if "mb_per_s" in ref:
            row["ratio"] = row["mb_per_s"]["median"] / ref["mb_per_s"]["median"]
    t = [
        ("large file via TCP >= 0.8x raw TCP", "shoal-tcp 1MiB x1", "raw-tcp", 0.8),
        ("100 KB files via cat_many >= 0.8x raw TCP in 100 KB messages",
         "shoal-tcp cat_many", refs["small"], 0.8),
    ]  # fmt: skip
    targets = []
    for what, a, b, goal in t:
        ra, rb = rows.get(a, {}), rows.get(b, {})
        ratio = None
        if "mb_per_s" in ra and "mb_per_s" in rb:
            ratio = ra["mb_per_s"]["median"] / rb["mb_per_s"]["median"]
        targets.append({"target": what, "ratio": ratio, "goal": goal,
                        "met": None if ratio is None else ratio >= goal})  # fmt: skip
    tls_cost = []
    for name, row in rows.items():
        plain = rows.get(name.replace("shoal-tls", "shoal-tcp"), {})
        if not name.startswith("shoal-tls") or "mb_per_s" not in row or "mb_per_s" not in plain:
            continue
        tls_cost.append({
            "reads": name.removeprefix("shoal-tls "),
            "plain_mb_s": plain["mb_per_s"]["median"], "tls_mb_s": row["mb_per_s"]["median"],
            "ratio": row["mb_per_s"]["median"] / plain["mb_per_s"]["median"],
            "reader_cpu": (plain["cpu_s_per_gb"]["median"], row["cpu_s_per_gb"]["median"]),
            "worker_cpu": (plain["server_cpu_s_per_gb"]["median"],
                           row["server_cpu_s_per_gb"]["median"]),
        })  # fmt: skip
    return {"tls_cost": tls_cost, "config": {"large_mib": cfg.large_size >> 20, "small_files": cfg.small_files,
                       "rounds": cfg.rounds, "batch": cfg.batch, "threads": cfg.threads,
                       "quick": cfg.quick},
            "rows": rows, "targets": targets, "seconds": round(secs, 1),
            "tls": tls_note or ("measured" if cfg.tls else "not asked (--tls)")}  # fmt: skip


def markdown(res: dict[str, Any]) -> list[str]:
    from shoal.bench.remotetext import section

    return section(res, SECTION)


def write_section(path: Path, lines: list[str]) -> None:
    """Put the section into ``path``, replacing an earlier one (up to the next ``## ``)."""
    text = path.read_text() if path.exists() else ""
    new = "\n".join(lines).rstrip() + "\n"
    if SECTION in text:
        head, _, rest = text.partition(SECTION)
        nxt = rest.find("\n## ")
        tail = rest[nxt + 1 :] if nxt >= 0 else ""
        text = head + new + ("\n" + tail if tail else "")
    else:
        text = text.rstrip() + "\n\n" + new
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m shoal.bench.remote", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="256 MiB and 5,000 files, 2 rounds")
    ap.add_argument("--tls", action="store_true", help="also against a worker serving TLS")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--large-mib", type=int)
    ap.add_argument("--small-files", type=int)
    ap.add_argument("--threads", type=int, help="cat_many threads = raw TCP connections (4)")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--only", action="append", help="contenders whose names start so (repeat)")
    ap.add_argument("--variant", action="append", default=[], metavar="TAG=DIR",
                    help="A/B: the shoal-tcp readers again with PYTHONPATH=DIR (repeat)")  # fmt: skip
    ap.add_argument("--profile", type=Path, help="py-spy the TCP reader and the worker here")
    ap.add_argument("--output", type=Path, help="write the section into this file")
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args(argv)
    kw: dict[str, Any] = {"tls": a.tls, "only": tuple(a.only or ()),
                          "variants": tuple(tuple(v.split("=", 1)) for v in a.variant)}  # fmt: skip
    for k in ("rounds", "small_files", "threads", "workdir", "profile"):
        if getattr(a, k) is not None:
            kw[k] = getattr(a, k)
    if a.large_mib is not None:
        kw["large_size"] = a.large_mib << 20
    res = run(RemoteConfig.make(a.quick, **kw), lambda s: print(s, file=sys.stderr, flush=True))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    if a.output and "skipped" not in res:
        write_section(a.output, markdown(res))
    print("\n".join(markdown(res)) if "skipped" not in res else res["skipped"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

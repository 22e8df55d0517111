"""Timed runs in reader processes: wall time from a common start, CPU time of the
readers (getrusage in each) plus the contender's daemons (/proc/<pid>/stat)."""

from __future__ import annotations

import contextlib
import gc
import importlib
import multiprocessing as mp
import os
import random
import resource
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from shoal.bench.contenders import Contender
from shoal.bench.stats import Sample

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pids: list[int]) -> float:
    """User + system seconds of these processes (and their reaped children)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            # fields[11..14] = utime stime cutime cstime (after the comm field)
            total += sum(int(x) for x in fields[11:15]) / _TICK
    return total


#: what reader processes import to make their clients (boto3, s3fs, the fsspec caches,
#: shoal's fsspec filesystem, the parquet readers)
READER_MODULES = ("boto3", "botocore.config", "s3fs", "fsspec.implementations.cached",
                  "pandas", "pyarrow.parquet", "shoal.client", "shoal.fsspec")  # fmt: skip


def preload(modules: tuple[str, ...] = READER_MODULES) -> float:
    """Import the readers' libraries here, so that every reader process forked later
    inherits them instead of importing them itself: outside the clock either way, but
    seconds of the run per process on a loaded machine (s3fs alone: 3-9 s). Seconds
    taken; a module that is not installed is left to its contender's ``available()``."""
    t0 = time.perf_counter()
    for name in modules:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    return time.perf_counter() - t0


def drop_caches() -> bool:
    """Sync and drop the page cache; False when not permitted."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


@dataclass
class Plan:
    """What each reader process does: whole files, ranges, or batches."""

    mode: str  # "files" | "ranges" | "batches"
    shards: list[list[Any]]  # per process: keys, (key, off, len) or lists of keys
    threads: int = 1
    #: stop a pass after this many seconds and rate what was done (slow peers on the
    #: full data set would otherwise take hours); None = always finish
    cap_s: float | None = None


def _child(contender: Contender, plan: Plan, i: int, ready: Any, go: Any, out: Any) -> None:
    try:
        if plan.mode == "files":
            fn: Callable[[Any], int] = contender.reader()
        elif plan.mode == "ranges":
            rr = contender.range_reader()
            fn = lambda t: rr(*t)  # noqa: E731
        else:
            fn = contender.batch_reader()
        items = plan.shards[i]
        threads = min(plan.threads, contender.max_threads or plan.threads)
        ready.release()
        go.wait()
        end = time.perf_counter() + plan.cap_s if plan.cap_s else float("inf")
        done: list[Any] = []

        def one(x: Any) -> int:
            if time.perf_counter() > end:
                return 0
            n = fn(x)
            done.append(x)
            return n

        r0 = resource.getrusage(resource.RUSAGE_SELF)
        if threads <= 1:
            nbytes = sum(one(x) for x in items)
        else:
            with ThreadPoolExecutor(threads) as pool:
                nbytes = sum(pool.map(one, items))
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        out.put((i, nbytes, cpu, None, done if len(done) < len(items) else None))
        with contextlib.suppress(Exception):
            contender.close_reader()
    except BaseException as exc:  # reported to the parent, which fails the run
        out.put((i, 0, 0.0, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}", None))


def run_plan(
    contender: Contender, plan: Plan, files_per_item: Callable[[Any], int], timeout: float = 1800
) -> Sample:
    ctx = mp.get_context("fork")
    n = len(plan.shards)
    ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_child, args=(contender, plan, i, ready, go, out)) for i in range(n)
    ]
    # readers start from the harness's heap: without this, their first collections walk
    # (and copy on write) whatever earlier contenders left in it, and a contender measured
    # late pays for the ones before it (seen: 15k instead of 50k files/s)
    gc.freeze()
    for p in procs:
        p.start()
    gc.unfreeze()
    try:
        for _ in range(n):
            if not ready.acquire(timeout=120):
                raise RuntimeError("reader processes did not start")
        pids = contender.daemon_pids()
        d0 = proc_cpu(pids)
        t0 = time.perf_counter()
        go.set()
        got = [out.get(timeout=timeout) for _ in range(n)]
        secs = time.perf_counter() - t0
        dcpu = proc_cpu(pids) - d0
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    errors = [g[3] for g in got if g[3]]
    if errors:
        raise RuntimeError(errors[0])
    nbytes = sum(g[1] for g in got)
    files = 0
    capped = any(g[4] is not None for g in got)
    read: list[Any] = []
    for g in got:  # a capped pass counts only what it read
        items = g[4] if g[4] is not None else plan.shards[g[0]]
        files += sum(files_per_item(x) for x in items)
        if capped:
            read.extend(items)
    return Sample(secs, files, nbytes, sum(g[2] for g in got) + dcpu, read if capped else None)


def shuffled(keys: list[str], seed: int) -> list[str]:
    out = keys[:]
    random.Random(seed).shuffle(out)
    return out


def epoch(
    contender: Contender,
    keys: list[str],
    procs: int,
    threads: int,
    seed: int,
    batch: int = 64,
    cap_s: float | None = None,
) -> Sample:
    """One shuffled pass over ``keys`` split across ``procs`` reader processes."""
    order = shuffled(keys, seed)
    shards = [order[i::procs] for i in range(procs)]
    if contender.batch:
        bshards: list[list[Any]] = [
            [s[j : j + batch] for j in range(0, len(s), batch)] for s in shards
        ]
        return run_plan(contender, Plan("batches", bshards, 1, cap_s), len)
    return run_plan(contender, Plan("files", list(shards), threads, cap_s), lambda _: 1)


def ranges(
    contender: Contender,
    key: str,
    size: int,
    chunk: int,
    sequential: bool,
    seed: int,
    cap_s: float | None = None,
) -> Sample:
    """One pass of ``chunk``-sized reads over one file, in order or shuffled."""
    offs = list(range(0, size, chunk))
    if not sequential:
        random.Random(seed).shuffle(offs)
    items = [(key, o, min(chunk, size - o)) for o in offs]
    s = run_plan(contender, Plan("ranges", [items], 1, cap_s), lambda _: 1)
    s.files = 1
    return s


def metadata(
    contender: Contender, dirs: list[str], stat_keys: list[str]
) -> tuple[Sample, Sample] | None:
    """(listing: entries/s as files, stat: stats/s as files), one process each."""
    if contender.lister() is None:
        return None

    class _L(Contender):
        name = contender.name
        batch = True

        def batch_reader(self) -> Callable[[list[str]], int]:
            ls, _ = contender.lister()  # type: ignore[misc]
            return lambda items: sum(ls(d) for d in items)

        def daemon_pids(self) -> list[int]:
            return contender.daemon_pids()

    class _S(_L):
        def batch_reader(self) -> Callable[[list[str]], int]:
            _, st = contender.lister()  # type: ignore[misc]
            return lambda items: sum(1 for k in items if st(k) >= 0)

    lst = run_plan(_L(contender.env), Plan("batches", [[dirs]], 1), len)
    lst.files, lst.nbytes = lst.nbytes, 0  # entries listed
    st = run_plan(_S(contender.env), Plan("batches", [[stat_keys]], 1), len)
    st.files, st.nbytes = st.nbytes, 0
    return lst, st

"""py-spy profiles of the ``remote`` workload's TCP path: a reader on the client host
and the worker serving it, sampled together, written as collapsed stacks (``*.txt``,
for flamegraph tools) with a summary of where each spends its time (``summary.md``)."""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shoal.bench.remote import Contender, RemoteConfig


#: frames of a thread that waits (on a lock, a queue, epoll) or of start-up (imports):
#: not where a read spends its time
_WAITING = ("epoll_pwait", "PyThread_acquire_lock_timed", "_find_and_load", "sem_wait",
            "select.select", "_client remoteio")  # fmt: skip
#: extra measured passes under the profiler, so start-up is a small part of the samples
REPS = {"large": 6, "small": 3}


def top(path: Path, n: int = 15) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(self, inclusive) shares of the busy samples by function, from collapsed stacks:
    self over every frame (native ones too: syscalls, memcpy), inclusive over shoal's
    own frames only (the loop's and the interpreter's are in every stack)."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit() or any(w in stack for w in _WAITING):
            continue
        k = int(count)
        total += k
        raw = stack.split(";")
        own[_name(raw[-1])] += k
        for f in {_name(f) for f in raw if "(shoal/" in f or "/shoal/" in f}:
            incl[f] += k
    if not total:
        return [], []
    return ([(f, c / total) for f, c in own.most_common(n)],
            [(f, c / total) for f, c in incl.most_common(n)])  # fmt: skip


def _name(frame: str) -> str:
    """``func (path/file.py:line)`` -> ``func (file.py)``."""
    fn, _, where = frame.partition(" (")
    return f"{fn} ({where.rsplit('/', 1)[-1].split(':')[0].rstrip(')')})" if where else fn


def profile(mh: Any, cfg: RemoteConfig, cs: list[Contender], say: Callable[[str], None]) -> None:
    from shoal.bench.remote import _env

    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = cfg.profile
    assert out is not None
    out.mkdir(parents=True, exist_ok=True)
    wpid = mh.cluster.pids["worker-0"]
    lines = ["# py-spy: the remote read path (TCP)", ""]
    for c in cs:
        if c.host != "client0" or not c.name.startswith("shoal-tcp"):
            continue
        tag = c.name.replace(" ", "_")
        wfile, rfile = out / f"{tag}.worker.txt", out / f"{tag}.client.txt"
        w = subprocess.Popen([spy, "record", "-r", "250", "-f", "raw", "-o", str(wfile),
                              "--pid", str(wpid), "-n"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        argv = [spy, "record", "-r", "250", "-f", "raw", "-o", str(rfile), "-n", "--",
                sys.executable, "-m", "shoal.bench.remoteio", *c.argv(), "--reps", str(REPS[c.kind])]  # fmt: skip
        subprocess.run(mh.plan.exec_argv("client0", argv), capture_output=True, timeout=900,
                       env={**_env(mh.plan.host("client0").node), **c.env})  # fmt: skip
        w.send_signal(signal.SIGINT)
        w.wait(60)
        lines += [f"## {c.name}", ""]
        for who, f in (("client", rfile), ("worker", wfile)):
            if not f.exists():
                lines.append(f"{who}: no profile")
                continue
            own, incl = top(f)
            lines += [f"### {who}: self time", ""] + [f"- {s:5.1%} {fn}" for fn, s in own]
            lines += ["", f"### {who}: inclusive", ""] + [f"- {s:5.1%} {fn}" for fn, s in incl]
            lines.append("")
        say(f"  profiled {c.name}: {rfile.name}, {wfile.name}")
    (out / "summary.md").write_text("\n".join(lines) + "\n")

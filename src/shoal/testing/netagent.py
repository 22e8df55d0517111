"""The multi-host harness's agents: a Python process inside a host's namespace that
answers one JSON request per line (``python -m shoal.testing.netns agent`` runs
:func:`agent_main`), and :class:`HostAgent`, the harness's end of it. Re-exported by
:mod:`shoal.testing.netns`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shoal.testing.netns import Network


class AgentError(RuntimeError):
    pass


class HostAgent:
    """A Python process inside a host's namespace answering JSON requests (see
    :func:`agent_main`); ``call(op, **args)`` returns its result or raises."""

    def __init__(self, net: Network, host: str, log: Path, env: dict[str, str]) -> None:
        self.host = host
        h = net.plan.host(host)
        full = dict(os.environ)
        full.update(env)
        full["SHOAL_NODE"] = h.node  # the client's own node: short circuit on this host only
        full.pop("SHOAL_MASTER", None)
        self._log = open(log, "ab")  # noqa: SIM115 -- closed in close()
        self.proc = subprocess.Popen(
            net.plan.exec_argv(host, [sys.executable, "-m", "shoal.testing.netns", "agent"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=full,
            start_new_session=True,
        )
        self._buf = b""

    def call(self, op: str, *, wait: float = 120.0, **args: Any) -> Any:
        """Ask for ``op``; raise AgentError when it fails or no answer comes in ``wait``
        seconds (the op's own arguments, ``timeout`` among them, go to the agent)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, "args": args}).encode() + b"\n")
        self.proc.stdin.flush()
        reply = json.loads(self._line(wait))
        if not reply["ok"]:
            raise AgentError(f"{self.host}: {op}: {reply['error']}")
        return reply["result"]

    def _line(self, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AgentError(f"{self.host}: no answer within {timeout:.0f}s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise AgentError(f"{self.host}: the agent exited ({self.proc.poll()})")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # EOF: the agent closes its client and exits
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _digest(data: bytes) -> list[Any]:
    return [len(data), hashlib.sha256(data).hexdigest()]


def expected(files: dict[str, bytes], dataset: str, mount: str = "data") -> dict[str, list[Any]]:
    """What the agent's ``read`` answers for byte-exact reads of ``files``."""
    return {f"/{dataset}/{mount}/{k}": _digest(v) for k, v in files.items()}


class _AgentState:
    """What an agent holds between requests: its client."""

    def __init__(self) -> None:
        self.client: Any = None

    def op_connect(self, master: str, **settings: Any) -> dict[str, Any]:
        from shoal.client import Client
        from shoal.config import ClientSettings

        self.close()
        self.client = Client(settings=ClientSettings(master=master, **settings))
        return {"node": self.client.settings.node}

    def op_seed(self, endpoint: str, bucket: str, spec: list[dict[str, Any]]) -> dict[str, int]:
        from shoal.testing.cluster import sample_files
        from shoal.testing.s3 import make_bucket

        files: dict[str, bytes] = {}
        for s in spec:
            files.update(sample_files(**s))
        make_bucket(endpoint, bucket, files)
        return {"files": len(files), "bytes": sum(map(len, files.values()))}

    def op_create_dataset(
        self,
        name: str,
        bucket: str = "",
        endpoint: str = "",
        options: dict[str, str] | None = None,
        url: str = "",
    ) -> dict[str, Any]:
        """Dataset ``name`` over bucket ``bucket`` of the store at ``endpoint``, or over
        ``url`` (a file:// directory every host sees: the namespaces share one disk)."""
        from shoal.core.types import Mount

        if url:
            mount = Mount("data", url, {})
        else:
            mount = Mount("data", f"s3://{bucket}", {"endpoint_url": endpoint})
        ds = self.client.create_dataset(name, [mount], options)
        return {"name": ds.name}

    def op_read(self, paths: list[str], how: str = "cat") -> dict[str, Any]:
        out: dict[str, Any] = {}
        if how == "cat_many":
            for p, v in self.client.cat_many(paths).items():
                out[p] = _digest(v) if isinstance(v, bytes) else f"error: {v!r}"
            return out
        for p in paths:
            try:
                out[p] = _digest(self.client.cat(p))
            except Exception as exc:  # a failed read is an answer, not the agent's end
                out[p] = f"error: {exc!r}"
        return out

    def op_counters(self) -> dict[str, int]:
        return dict(self.client.counters())

    def op_load(self, dataset: str, timeout: float = 60.0) -> dict[str, Any]:
        job = self.client.submit_job({"kind": "load", "dataset": dataset, "paths": [""]})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            view: dict[str, Any] = self.client.job(job["id"])
            if view["state"] in ("done", "failed", "stopped"):
                return view
            time.sleep(0.1)
        raise TimeoutError(f"load of {dataset} not done within {timeout:.0f}s")

    def op_get(self, url: str, timeout: float = 5.0) -> dict[str, Any]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return {"status": r.status, "body": r.read().decode()}
        except urllib.error.HTTPError as exc:
            return {"status": exc.code, "body": exc.read().decode(errors="replace")}

    def op_wait_get(self, url: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.op_get(url, timeout=1.0)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def agent_main() -> None:
    """Answer one JSON request per stdin line on stdout until EOF."""
    # replies go to the original stdout; anything else printed goes to stderr (the log)
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    state = _AgentState()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            fn = getattr(state, "op_" + req["op"])
            reply = {"ok": True, "result": fn(**req.get("args", {}))}
        except Exception as exc:  # the test reads the error; the agent serves on
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
    state.close()

"""The worker's share of jobs: it long-polls the master for tasks and runs them.

- ``list``: parallel listing of paths in under storage -> entries for the manifest;
- ``load``: preload files (skipping what is cached at its version), bounded parallelism;
- ``free``: drop cached files under paths;
- ``invalidate``: drop versions that a sync found changed or gone.

Progress goes back as deltas every half second; the master's answer says whether the
job was stopped, in which case the files not yet done are handed back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgpack

from shoal.core.jobs import MAX_FAILURES, Progress
from shoal.core.types import FileInfo
from shoal.errors import NotFound, ShoalError
from shoal.ufs.base import UnderStore
from shoal.worker.datasets import DatasetTable
from shoal.worker.loader import Loader

log = logging.getLogger("shoal.worker.tasks")

#: concurrent tasks a worker runs (each with bounded under-storage parallelism)
PARALLEL_TASKS = 2
#: concurrent directory walks while listing
LIST_PARALLELISM = 16
REPORT_EVERY = 0.5


class Stopped(Exception):
    """The master said the job was stopped."""


class TaskRunner:
    def __init__(
        self,
        master: str,
        worker_id: str,
        http: Callable[[], aiohttp.ClientSession],
        loader: Loader,
        table: DatasetTable,
        ensure_dataset: Callable[[], Awaitable[bool]],
        refresh: Callable[[], Awaitable[None]],
    ) -> None:
        self.master = master
        self.worker_id = worker_id
        self._http = http
        self.loader = loader
        self.table = table
        self._ensure_dataset = ensure_dataset
        self._refresh = refresh
        self._slots = asyncio.Semaphore(PARALLEL_TASKS)
        self._running: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        url = f"{self.master}/api/v1/workers/{self.worker_id}/tasks"
        while True:
            await self._slots.acquire()
            try:
                async with self._http().get(
                    url, params={"wait": "10"}, timeout=aiohttp.ClientTimeout(total=40)
                ) as r:
                    body = await r.json()
                task = body.get("task") if r.status == 200 else None
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                self._slots.release()
                log.debug("task poll failed: %s", exc)
                await asyncio.sleep(1.0)
                continue
            if task is None:
                self._slots.release()
                continue
            t = asyncio.get_running_loop().create_task(self._run_one(task))
            self._running.add(t)
            t.add_done_callback(self._running.discard)

    async def close(self) -> None:
        for t in list(self._running):
            t.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)

    async def _run_one(self, task: dict[str, Any]) -> None:
        try:
            await self._execute(task)
        except Exception as exc:  # a task must never take the runner down
            log.error(
                "task %s (%s) failed: %s", task.get("id"), task.get("kind"), exc, exc_info=exc
            )
            with contextlib.suppress(Exception):
                await self._report(
                    task["id"],
                    {
                        "final": True,
                        "progress": Progress(
                            files_failed=len(task.get("items") or []),
                            failures=[["*", f"worker error: {exc}"]],
                        ).to_dict(),
                    },
                )
        finally:
            self._slots.release()

    async def _report(self, tid: int, body: dict[str, Any], packed: bool = False) -> bool:
        url = f"{self.master}/api/v1/tasks/{tid}"
        for attempt in range(5):
            try:
                if packed:
                    data = msgpack.packb(body, use_bin_type=True)
                    req = self._http().post(
                        url, data=data, headers={"Content-Type": "application/msgpack"}
                    )
                else:
                    req = self._http().post(url, json=body)
                async with req as r:
                    if r.status >= 400:
                        # a refused report is not retried: the master said no for good
                        log.error(
                            "task %s report refused: %s %s", tid, r.status, (await r.text())[:200]
                        )
                        return True
                    reply = await r.json()
                    return bool(reply.get("stop", False))
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                log.warning("task %s report failed (%s); retrying", tid, exc)
                await asyncio.sleep(0.5 * (attempt + 1))
        return False

    async def _execute(self, task: dict[str, Any]) -> None:
        kind, ds, items, tid = task["kind"], task["dataset"], task["items"], task["id"]
        if ds not in self.table:
            await self._ensure_dataset()
        if kind == "list":
            entries, missing = await self.list(ds, items, bool(task.get("files")))
            await self._report(
                tid,
                {"final": True, "entries": entries, "missing": missing, "progress": {}},
                packed=True,
            )
        elif kind == "load":
            await self._load(tid, ds, items, bool(task.get("verify")))
        elif kind == "free":
            freed = files = 0
            for prefix in items:
                for fk in self.loader.store.files(ds, prefix):
                    freed += self.loader.store.delete(fk)
                    self.loader.forget_path(ds, fk.path)
                    files += 1
            await self._report(
                tid,
                {"final": True, "progress": Progress(files_done=files, bytes_done=freed).to_dict()},
            )
        elif kind == "invalidate":
            # the sync's new manifest is saved before these tasks exist: take it first, so
            # that when the job is done no worker still answers from the old one
            await self._refresh()
            files = 0
            for path, keep in items:
                self.loader.forget_path(ds, path)
                for fk in self.loader.store.files(ds, path):
                    if fk.path == path and fk.version != keep:
                        self.loader.store.delete(fk)
                        files += 1
            await self._report(
                tid, {"final": True, "progress": Progress(files_done=files).to_dict()}
            )
        else:
            log.warning("unknown task kind %r", kind)
            await self._report(tid, {"final": True, "progress": {}})

    # -- load -----------------------------------------------------------------------

    async def _load(self, tid: int, ds: str, items: list[list[Any]], verify: bool) -> None:
        delta = Progress()
        done: set[int] = set()
        stop = asyncio.Event()

        slots = asyncio.Semaphore(self.loader.concurrency)

        async def one(i: int, path: str, size: int, version: str) -> None:
            async with slots:
                if not stop.is_set():
                    await load(i, path, size, version)

        async def load(i: int, path: str, size: int, version: str) -> None:
            try:
                fetched, nbytes = await self.loader.load(ds, path, int(size), str(version), verify)
                if fetched:
                    delta.files_done += 1
                    delta.bytes_done += nbytes
                else:
                    delta.files_skipped += 1
            except ShoalError as exc:
                delta.files_failed += 1
                if len(delta.failures) < MAX_FAILURES:
                    delta.failures.append([path, f"{exc.code}: {exc.message}"])
            done.add(i)

        async def reporter() -> None:
            while True:
                await asyncio.sleep(REPORT_EVERY)
                nonlocal delta
                d, delta = delta, Progress()
                if await self._report(tid, {"progress": d.to_dict()}):
                    stop.set()

        rep = asyncio.get_running_loop().create_task(reporter())
        try:
            await asyncio.gather(*(one(i, *it) for i, it in enumerate(items)))
        finally:
            rep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rep
        remaining = [it for i, it in enumerate(items) if i not in done]
        body: dict[str, Any] = {"final": True, "progress": delta.to_dict()}
        if remaining:
            body["remaining"] = remaining
        await self._report(tid, body)

    # -- list -----------------------------------------------------------------------

    async def list(
        self, dataset: str, paths: list[str], named_files: bool
    ) -> tuple[list[list[Any]], list[str]]:
        """Entries [path, size, version, mtime] under key paths (or exactly the named files)."""
        ds = self.table.get(dataset)
        sem = asyncio.Semaphore(LIST_PARALLELISM)
        out: list[list[Any]] = []
        missing: list[str] = []

        def add(mount: str, e: FileInfo) -> None:
            out.append([f"{mount}/{e.path}" if e.path else mount, e.size, e.version, e.mtime])

        async def flat(ufs: UnderStore, mount: str, rel: str) -> None:
            async with sem:
                async for e in ufs.walk(rel):
                    add(mount, e)

        async def walk(ufs: UnderStore, mount: str, rel: str, depth: int) -> None:
            """Split the tree by directory a few levels deep, then list each part flat."""
            async with sem:
                if depth == 0 and rel:
                    info = await ufs.info(rel)
                    if not info.is_dir:
                        add(mount, info)
                        return
                children = await ufs.ls(rel)
            dirs = [c for c in children if c.is_dir]
            for c in children:
                if not c.is_dir:
                    add(mount, c)
            if depth >= 2:
                await asyncio.gather(*(flat(ufs, mount, d.path) for d in dirs))
            else:
                await asyncio.gather(*(walk(ufs, mount, d.path, depth + 1) for d in dirs))

        if named_files:
            by_dir: dict[tuple[str, str], set[str]] = {}
            for p in paths:
                mount, _, rel = p.partition("/")
                by_dir.setdefault((mount, posixpath.dirname(rel)), set()).add(p)

            async def scan(mount: str, rel_dir: str, want: set[str]) -> None:
                ufs = self.table.ufs(ds, mount)
                async with sem:
                    try:
                        children = await ufs.ls(rel_dir)
                    except NotFound:
                        children = []
                found = {f"{mount}/{c.path}": c for c in children if not c.is_dir}
                for p in sorted(want):
                    if p in found:
                        add(mount, found[p])
                    else:
                        missing.append(p)

            await asyncio.gather(*(scan(m, d, w) for (m, d), w in by_dir.items()))
            return out, missing

        async def top(p: str, mount: str, rel: str) -> None:
            try:
                await walk(self.table.ufs(ds, mount), mount, rel, 0)
            except NotFound:
                missing.append(p)

        jobs = []
        for p in paths:
            mount, _, rel = p.partition("/")
            for m in [m.name for m in ds.mounts] if not mount else [mount]:
                jobs.append(top(p, m, rel))
        t0 = time.monotonic()
        await asyncio.gather(*jobs)
        log.info("listed %d files of %s in %.1fs", len(out), dataset, time.monotonic() - t0)
        return out, missing

"""The worker's share of jobs: it long-polls the master for tasks and runs them.

- ``list``: parallel listing of paths in under storage -> entries for the manifest;
- ``load``: preload files (skipping what is cached at its version), bounded parallelism;
- ``free``: drop cached files under paths;
- ``invalidate``: drop versions that a sync found changed or gone.

Progress goes back every half second as the cumulative count of this attempt (the
claim's ``attempt``) with a rising sequence number, so a report that is lost, repeated
or overtaken changes nothing: the final report carries the whole count, and it is
retried until the master takes it (or the lease would be over anyway). The master's
answer says whether to stop, in which case the files not yet done are handed back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import time
from collections.abc import Awaitable, Callable
from typing import Any

from shoal.core.jobs import MAX_FAILURES, Progress, TaskReport
from shoal.core.types import FileInfo
from shoal.errors import NotFound, ShoalError, Unavailable
from shoal.proto.master_api import MasterAPI
from shoal.ufs.base import UnderStore
from shoal.worker.datasets import DatasetTable
from shoal.worker.loader import Loader

log = logging.getLogger("shoal.worker.tasks")

#: concurrent tasks a worker runs (each with bounded under-storage parallelism)
PARALLEL_TASKS = 2
#: concurrent directory walks while listing
LIST_PARALLELISM = 16
REPORT_EVERY = 0.5
#: small files of a load task read together, in one under-storage call per group
#: (mounts with ``read_many``: file://), and groups in flight per task
LOAD_GROUP = 64
GROUPS_IN_FLIGHT = 2
#: how long a final report is retried (the master's lease on a task is 30 s)
FINAL_REPORT_FOR = 30.0
#: how long the master holds a task poll open, and when the worker gives up on one
CLAIM_WAIT = 10.0
CLAIM_HOLD = 40.0


class _Attempt:
    """The reports of one claimed task: its attempt and their sequence numbers."""

    def __init__(self, runner: TaskRunner, task: dict[str, Any]) -> None:
        self.runner = runner
        self.tid = int(task["id"])
        self.attempt = int(task.get("attempt", 0))
        self.seq = 0

    async def send(
        self,
        progress: Progress,
        final: bool = False,
        remaining: list[list[Any]] | None = None,
        entries: list[list[Any]] | None = None,
        missing: list[str] | None = None,
    ) -> bool:
        """Report; True when the master says stop."""
        self.seq += 1
        r = TaskReport(
            self.attempt, self.seq, progress, final, remaining, entries, tuple(missing or ())
        )
        # to_body copies the counts now, before anything else can change them
        return await self.runner._report(self.tid, r.to_body(), entries is not None, final)


class TaskRunner:
    def __init__(
        self,
        master: MasterAPI,
        worker_id: str,
        loader: Loader,
        table: DatasetTable,
        ensure_dataset: Callable[[], Awaitable[bool]],
        refresh: Callable[[], Awaitable[None]],
    ) -> None:
        self.master = master
        self.worker_id = worker_id
        self.loader = loader
        self.table = table
        self._ensure_dataset = ensure_dataset
        self._refresh = refresh
        self._slots = asyncio.Semaphore(PARALLEL_TASKS)
        self._running: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                task = await self.master.claim(self.worker_id, CLAIM_WAIT, CLAIM_HOLD)
            except ShoalError as exc:
                # unreachable, or refused: ask again in a second either way
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
        att = _Attempt(self, task)
        try:
            await self._execute(task, att)
        except Exception as exc:  # a task must never take the runner down
            log.error(
                "task %s (%s) failed: %s", task.get("id"), task.get("kind"), exc, exc_info=exc
            )
            with contextlib.suppress(Exception):
                failed = Progress(
                    files_failed=len(task.get("items") or []),
                    failures=[["*", f"worker error: {exc}"]],
                )
                await att.send(failed, final=True)
        finally:
            self._slots.release()

    async def _report(
        self, tid: int, body: dict[str, Any], packed: bool = False, final: bool = False
    ) -> bool:
        """Post one report; a progress report is tried once (the next one carries its
        counts too), a final one until the master answers or FINAL_REPORT_FOR passed."""
        deadline = time.monotonic() + FINAL_REPORT_FOR
        attempt = 0
        while True:
            attempt += 1
            try:
                reply = await self.master.report_task(tid, body, packed)
                return bool(reply.get("stop", False))
            except Unavailable as exc:
                if not final:
                    log.debug("task %s progress report failed (%s)", tid, exc)
                    return False
                if time.monotonic() > deadline:
                    log.error("task %s: final report failed for good (%s)", tid, exc)
                    return False
                log.warning("task %s report failed (%s); retrying", tid, exc)
                await asyncio.sleep(min(2.0, 0.25 * attempt))
            except ShoalError as exc:
                # a refused report is not retried: the master said no for good
                log.error("task %s report refused: %s: %s", tid, exc.code, exc.message[:200])
                return True

    async def _execute(self, task: dict[str, Any], att: _Attempt) -> None:
        kind, ds, items = task["kind"], task["dataset"], task["items"]
        if ds not in self.table:
            await self._ensure_dataset()
        if kind == "list":
            entries, missing = await self.list(ds, items, bool(task.get("files")))
            await att.send(Progress(), final=True, entries=entries, missing=missing)
        elif kind == "load":
            await self._load(att, ds, items, bool(task.get("verify")))
        elif kind == "free":
            freed = files = 0
            for prefix in items:
                for fk in self.loader.store.files(ds, prefix):
                    freed += self.loader.store.delete(fk)
                    self.loader.forget_path(ds, fk.path)
                    files += 1
            await att.send(Progress(files_done=files, bytes_done=freed), final=True)
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
            await att.send(Progress(files_done=files), final=True)
        else:
            log.warning("unknown task kind %r", kind)
            await att.send(Progress(), final=True)

    # -- load -----------------------------------------------------------------------

    async def _load(self, att: _Attempt, ds: str, items: list[list[Any]], verify: bool) -> None:
        total = Progress()  # this attempt so far: every report carries all of it
        done: set[int] = set()
        stop = asyncio.Event()

        slots = asyncio.Semaphore(self.loader.concurrency)
        group_slots = asyncio.Semaphore(GROUPS_IN_FLIGHT)

        def count(i: int, path: str, outcome: tuple[bool, int] | ShoalError) -> None:
            if isinstance(outcome, ShoalError):
                total.files_failed += 1
                if len(total.failures) < MAX_FAILURES:
                    total.failures.append([path, f"{outcome.code}: {outcome.message}"])
            elif outcome[0]:
                total.files_done += 1
                total.bytes_done += outcome[1]
            else:
                total.files_skipped += 1
            done.add(i)

        async def one(i: int, path: str, size: int, version: str) -> None:
            async with slots:
                if stop.is_set():
                    return
                try:
                    got = await self.loader.load(ds, path, int(size), str(version), verify)
                except ShoalError as exc:
                    count(i, path, exc)
                else:
                    count(i, path, got)

        async def group(chunk: list[int]) -> None:
            """Small files read together (one under-storage call for the group)."""
            async with group_slots:
                if stop.is_set():
                    return
                got = await self.loader.load_many(ds, [items[i] for i in chunk], verify)
            for i, outcome in zip(chunk, got, strict=True):
                count(i, items[i][0], outcome)

        async def reporter() -> None:
            while True:
                await asyncio.sleep(REPORT_EVERY)
                # what a report counts done must be in the index a restart reads: a
                # worker killed right after it would otherwise come back without files
                # the master will not plan again (no await between this and the counts)
                self.loader.store.flush()
                if await att.send(total):
                    stop.set()

        batched, alone = self.loader.batchable(ds, items)
        work = [one(i, *items[i]) for i in alone]
        for k in range(0, len(batched), LOAD_GROUP):
            work.append(group(batched[k : k + LOAD_GROUP]))
        rep = asyncio.get_running_loop().create_task(reporter())
        try:
            await asyncio.gather(*work)
        finally:
            rep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rep
        remaining = [it for i, it in enumerate(items) if i not in done]
        # "done" must mean the pages are in the index a restart reads, not just in memory
        self.loader.store.flush()
        await att.send(total, final=True, remaining=remaining or None)

    # -- list -----------------------------------------------------------------------

    async def list(
        self, dataset: str, paths: list[str], named_files: bool
    ) -> tuple[list[list[Any]], list[str]]:
        """Entries [path, size, version, mtime, mtime_ns, link] under key paths (or named files)."""
        ds = self.table.get(dataset)
        sem = asyncio.Semaphore(LIST_PARALLELISM)
        out: list[list[Any]] = []
        missing: list[str] = []

        def add(mount: str, e: FileInfo) -> None:
            path = f"{mount}/{e.path}" if e.path else mount
            out.append([path, e.size, e.version, e.mtime, e.mtime_ns, e.link])

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

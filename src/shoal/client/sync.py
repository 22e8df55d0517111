"""Client: the synchronous façade over AsyncClient.

The event loop runs on a private daemon thread started on first use (never in
``__init__``); until then, reads of files cached by a worker on this host go through
:mod:`shoal.client.direct` on the caller's thread, so that a fresh process imports no
asyncio and starts no thread for them (the async client itself is built on first
use). Warm reads whose metadata and page locations are already known never
touch that thread: they are a ``pread`` on the caller's thread; reads and ``cat_many``
of workers on other hosts are a blocking request on the caller's own connection to the
worker (shoal.client.blocking: no hop to the loop), handed to the loop when anything
goes wrong. The façade is safe to use after ``os.fork()`` (a DataLoader worker gets a
fresh loop and connections but keeps the caches and descriptors) and pickles to its
settings (DataLoader with spawn).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from shoal.client.cache import FORKS, ClientCache
from shoal.client.direct import DirectReads
from shoal.client.local import read_path, stat_path, touches_due
from shoal.config import ClientSettings, master_from_env
from shoal.core.types import Dataset, FileInfo, Mount
from shoal.errors import ShoalError
from shoal.proto import wire

if TYPE_CHECKING:
    import asyncio

    from shoal.client.aio import AsyncClient
    from shoal.client.blocking import BlockingReads

T = TypeVar("T")


class Client:
    def __init__(
        self, master: str | None = None, *, settings: ClientSettings | None = None
    ) -> None:
        self.settings = settings or ClientSettings(master=master_from_env(master))
        wire.make_room_for_fds()  # now, while this thread is likely the only one
        self.cache = ClientCache()
        #: the async client and the blocking remote reads over it, built on first use
        self._made: tuple[AsyncClient, BlockingReads] | None = None
        self._direct = DirectReads(self.settings, self.cache)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._gen = FORKS[0]
        self._lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------------

    @property
    def _aio(self) -> AsyncClient:
        return (self._made or self._make())[0]

    @property
    def _blocking(self) -> BlockingReads:
        return (self._made or self._make())[1]

    def _make(self) -> tuple[AsyncClient, BlockingReads]:
        """Build the async client (imports asyncio and the async parts: on first use)."""
        from shoal.client.aio import AsyncClient
        from shoal.client.blocking import BlockingReads

        with self._lock:
            if self._made is None:
                aio = AsyncClient(self.settings, self.cache)
                self._made = (aio, BlockingReads(aio, self._refresh_soon))
            return self._made

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(settings=state["settings"])  # type: ignore[misc]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _after_fork(self) -> None:
        # the loop thread does not exist in the child; sockets are shared with the parent
        if self._made is not None:
            self._made[0].abandon()
        self._made = None
        self._direct.abandon()
        self._direct = DirectReads(self.settings, self.cache)
        self._loop = None
        self._thread = None
        self._lock = threading.Lock()
        self._gen = FORKS[0]

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._gen != FORKS[0]:
            self._after_fork()
        loop = self._loop
        if loop is not None:
            return loop
        self._make()
        with self._lock:
            if self._loop is None:
                import uvloop

                loop = uvloop.new_event_loop()
                t = threading.Thread(target=loop.run_forever, name="shoal-client", daemon=True)
                t.start()
                self._loop, self._thread = loop, t
                self._direct.hand_over()  # the loop's ticker reports the hits now
                # close at process exit: sends buffered hits and closes the sessions
                # before the interpreter tears them down ("Unclosed client session").
                # multiprocessing's exit hook runs at interpreter exit and also at the
                # end of a forked DataLoader worker, which never runs atexit handlers
                from multiprocessing import util

                util.Finalize(self, _close_at_exit, args=(weakref.ref(self),), exitpriority=10)
            return self._loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        import asyncio

        loop = self._get_loop()
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def _refresh_soon(self) -> None:
        """A blocking read saw a newer ring epoch: refresh the ring on the loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._aio.router.refresh_soon)

    def close(self) -> None:
        if self._gen != FORKS[0]:
            self._after_fork()
            return
        try:
            self._close()
        finally:
            # the descriptors workers handed over (until now they outlived the client:
            # a process that made and closed clients kept hundreds of them open)
            self.cache.drop_locations()

    def _close(self) -> None:
        self._direct.close()
        if self._made is not None:
            self._made[1].close()
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        import asyncio

        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()
            self._loop = self._thread = None

    def close_quietly(self, timeout: float = 5.0) -> None:
        """Close at interpreter exit: bounded, and never raising."""
        loop, thread = self._loop, self._thread
        if self._gen != FORKS[0] or loop is None or thread is None or not thread.is_alive():
            return
        import asyncio

        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=timeout)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=timeout)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = None
        except Exception:  # exiting anyway: nothing to report to
            pass

    async def _shutdown(self) -> None:
        import asyncio

        await self._aio.close()
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:  # e.g. a touch flush the fast path scheduled
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    @property
    def aio(self) -> AsyncClient:
        """The AsyncClient behind this façade (runs on the façade's loop thread)."""
        return self._aio

    # -- data -----------------------------------------------------------------------

    def read_fast(self, path: str, offset: int = 0, length: int = -1) -> bytes | None:
        """The zero-round-trip read (see AsyncClient.read_fast): the bytes when the
        file's metadata and page locations on a local worker are known, read with
        ``pread`` on the caller's thread, else None (then :meth:`read` it). Never
        raises for a path it cannot serve; hits are reported to their workers later."""
        if self._gen != FORKS[0]:
            self._after_fork()
        data = read_path(self.cache, path, offset, length)
        if data is not None:
            loop = self._loop
            if loop is None:
                self._direct.touched()  # no loop (yet): sent by its own thread
            elif touches_due(self.cache):
                import asyncio

                self.cache.touched_at = time.monotonic()
                asyncio.run_coroutine_threadsafe(self._aio.flush_touches(), loop)
        return data

    def read(self, path: str, offset: int = 0, length: int = -1) -> bytes:
        data = self.read_fast(path, offset, length)
        if data is None and self._made is not None:
            data = self._aio.read_ahead_fast(path, offset, length)
        if data is None and self._loop is None:
            # no loop yet: a local worker's pages, located on this thread (no asyncio)
            data = self._direct.read(path, offset, length)
        if data is None and self._loop is not None:
            # a remote worker: a blocking request on this thread (no hop to the loop)
            data = self._blocking.read(path, offset, length)
        if data is not None:
            return data
        return self._run(self._aio.read(path, offset, length))

    def cat(self, path: str) -> bytes:
        return self.read(path)

    def cat_many(self, paths: Iterable[str]) -> dict[str, bytes | ShoalError]:
        todo = list(paths)
        if self._gen != FORKS[0]:
            self._after_fork()
        if self._loop is not None:
            from shoal.client import blockbatch

            got = blockbatch.cat_many(self._blocking, todo)
        else:
            got = None
        if got is None:
            return self._run(self._aio.cat_many(todo))
        out, rest = got  # remote workers, asked on this thread; the rest the async way
        if rest:
            out.update(self._run(self._aio.cat_many(rest)))
        return out

    def stat(self, path: str) -> FileInfo:
        """A file's or directory's metadata: from this process's metadata cache or the
        dataset's manifest on the caller's thread when it holds them within the
        staleness bound (no round trip, no hop to the loop thread), else asked."""
        if self._gen != FORKS[0]:
            self._after_fork()
        info = stat_path(self.cache, path)
        if info is None and self._loop is None:
            info = self._direct.stat(path)  # no loop yet: a local owner, on this thread
        if info is not None:
            return info
        return self._run(self._aio.stat(path))

    def ls(self, path: str) -> list[FileInfo]:
        return self._run(self._aio.ls(path))

    def open_local(self, path: str, load: bool = True) -> tuple[int, FileInfo] | None:
        """See AsyncClient.open_local: a descriptor of the whole file on a local worker."""
        return self._run(self._aio.open_local(path, load))

    def note_local_read(self, path: str, nbytes: int) -> None:
        """See AsyncClient.note_local_read: count bytes a front-end served from a local
        worker's file itself (batched; no I/O here)."""
        if self._gen != FORKS[0]:
            self._after_fork()
        self._aio.note_local_read(path, nbytes)

    def flush(self) -> None:
        """Report short-circuit hits to their workers now."""
        self._run(self._aio.flush_touches())

    # -- control --------------------------------------------------------------------

    def create_dataset(
        self, name: str, mounts: list[Mount], options: dict[str, str] | None = None
    ) -> Dataset:
        return self._run(self._aio.create_dataset(name, mounts, options))

    def update_dataset(self, name: str, options: dict[str, str]) -> Dataset:
        return self._run(self._aio.update_dataset(name, options))

    def delete_dataset(self, name: str) -> None:
        self._run(self._aio.delete_dataset(name))

    def datasets(self) -> list[Dataset]:
        return self._run(self._aio.datasets())

    def dataset(self, name: str) -> Dataset:
        return self._run(self._aio.dataset(name, refresh=True))

    def submit_job(self, spec: dict[str, Any], schedule: str | None = None) -> dict[str, Any]:
        return self._run(self._aio.submit_job(spec, schedule))

    def jobs(self) -> dict[str, Any]:
        return self._run(self._aio.jobs())

    def job(self, job_id: str, wait: float = 0.0) -> dict[str, Any]:
        """A job's view; with ``wait``, once it has ended or after ``wait`` seconds."""
        return self._run(self._aio.job(job_id, wait))

    def stop_job(self, job_id: str) -> dict[str, Any]:
        return self._run(self._aio.stop_job(job_id))

    def resume_job(self, job_id: str) -> dict[str, Any]:
        return self._run(self._aio.resume_job(job_id))

    def report(self) -> dict[str, Any]:
        return self._run(self._aio.report())

    def counters(self) -> dict[str, int]:
        return self.cache.counters.to_dict()


def _close_at_exit(ref: weakref.ref[Client]) -> None:
    client = ref()
    if client is not None:
        client.close_quietly()

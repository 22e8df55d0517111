"""Descriptors for local clients: which backing files a reply hands over, and the
directory location answers (LOCATE_DIR) kept between requests.

Every new reader process (each DataLoader worker, every epoch) asks for the same
directories again. Working an answer out costs a lookup per file; keeping it costs
memory. Answers are kept, already encoded, until the store reports any page added,
dropped or moved (``Handover.changes``) or the dataset's generation or manifest moves,
and the descriptors they hand over stay open in the worker for as long; so a warm
answer is one dictionary lookup and one ``sendmsg``.

And which handed-over pages this worker has read back and checked (:class:`Verified`):
a LOCATE answer stamps each descriptor with the data file's ctime at that check, and a
local reader then skips its own xxh3 while the file keeps that ctime -- one check per
node and file, not one per reader process (see ``shoal.client.local``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import xxhash

from shoal.core.types import Dataset
from shoal.proto import wire

log = logging.getLogger("shoal.worker")

#: encoded directory answers kept, in bytes (about 70 bytes per file)
DIR_CACHE_BYTES = 64 << 20
#: descriptors kept open for them, at most (then everything is dropped and rebuilt)
DIR_CACHE_FDS = 1024
#: seconds a kept answer's stamps are sent again as they are (once all are set):
#: working them out is a lookup per run page
DIR_STAMPS_FOR = 10.0
#: bytes a kept answer's record of one run page takes (a tuple of three ints)
_PAGE_COST = 128
#: seconds a data file's check stands; past it the next handover checks it again, so
#: bit rot below the kernel (bytes that changed with no write) is caught by then
VERIFY_EVERY = 900.0
#: data files checked at once (each check is a thread reading up to LOCATE's window)
VERIFY_AT_ONCE = 2
#: data files whose checks are remembered (then the oldest are forgotten)
VERIFY_FILES = 65536
#: data files whose handed-over pages wait for a check, at most (then the oldest wait
#: is dropped: its readers check their own pages, as without a queue); each holds its
#: answers' page lists until checked
VERIFY_QUEUE = 256
#: a data file written to less than this long ago (ns) is not checked yet: a file that
#: a cold reader's pages are still being appended to would change under every check
#: (each then read back and hashed in vain: 29% of the worker's samples in a cold
#: sequential read); its readers check their own pages until it settles, and its
#: queued pages are checked then, with no further answer needed
SETTLE_NS = 1_000_000_000

#: one page handed over: offset in its data file, length, xxh3 checksum
Page = tuple[int, int, int]
#: what a LOCATE answer does with those of its pages a background check found bad
OnBad = Callable[[str, list[Page]], None]


class Handover:
    """Descriptors to hand to a local client: one per backing file, with its identity.
    Opened here and closed by the sender once sent."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.ids: list[list[int]] = []
        self.paths: list[str] = []
        #: each descriptor's st_ctime_ns when it was opened (see :class:`Verified`)
        self.ctimes: list[int] = []
        self._slot: dict[str, int] = {}

    def slot(self, path: str) -> int | None:
        """The slot of ``path``'s descriptor, opening it if needed; None when full."""
        slot = self._slot.get(path)
        if slot is None:
            if len(self.fds) >= wire.MAX_FDS:
                return None
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            st = os.fstat(fd)
            slot = self._slot[path] = len(self.fds)
            self.fds.append(fd)
            self.ids.append([st.st_dev, st.st_ino])
            self.paths.append(path)
            self.ctimes.append(st.st_ctime_ns)
        return slot

    def refresh(self) -> None:
        """Take each file's ctime again (a kept answer's descriptors outlive many
        changes of ctime that move no page: a revoke, a chmod); a path that is another
        file now keeps the old one, which no check of that file can match."""
        for slot, path in enumerate(self.paths):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if [st.st_dev, st.st_ino] == self.ids[slot]:
                self.ctimes[slot] = st.st_ctime_ns

    def abort(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


@dataclass(slots=True)
class DirAnswer:
    """One LOCATE_DIR answer as kept: packed without its stamps (LocateDirReply's
    ``encode_unstamped``), with what restamping it takes -- the run pages it hands
    over per descriptor and what to do with those a check finds bad -- and the stamps
    last worked out (``stamped_at``, monotonic)."""

    meta: bytes
    handover: Handover
    #: asked with ``runs``: the answer ends in stamps (else ``meta`` is sent as is)
    runs: bool = False
    run_pages: list[list[Page]] = field(default_factory=list)
    on_bad: OnBad | None = None
    stamps: list[int] | None = None
    stamped_at: float = 0.0

    @property
    def cost(self) -> int:
        """Bytes it holds, about: the packed answer and each run page's record."""
        return len(self.meta) + _PAGE_COST * sum(map(len, self.run_pages))


class DirAnswers:
    """LOCATE_DIR answers with their descriptors, valid while ``stamp()`` holds.

    ``stamp`` returns None when the store cannot say whether it changed: then nothing
    is kept. Descriptors are owned here (the sender must not close them) and closed
    when the answers they serve are dropped.
    """

    def __init__(self, stamp: Callable[[], Any], limit: int = DIR_CACHE_BYTES) -> None:
        self._stamp = stamp
        self._at: Any = None
        self._limit = limit
        self._bytes = 0
        #: (dataset, directory, runs) -> (generation, manifest, answer)
        self._answers: OrderedDict[tuple[str, str | None, bool], tuple[int, str, DirAnswer]] = (
            OrderedDict()
        )
        #: backing file -> open descriptor, shared by every answer naming it
        self._fds: dict[str, int] = {}
        self.hits = 0

    def get(
        self, ds: Dataset, directory: str | None, runs: bool
    ) -> tuple[DirAnswer, list[int]] | None:
        """The answer and the descriptors to send with it, if still valid."""
        if not self._valid(ds):
            return None
        key = (ds.name, directory, runs)
        hit = self._answers.get(key)
        if hit is None or hit[0] != ds.generation or hit[1] != ds.manifest:
            return None
        self._answers.move_to_end(key)
        self.hits += 1
        ans = hit[2]
        return ans, [self._fds[p] for p in ans.handover.paths]

    def put(self, ds: Dataset, directory: str | None, ans: DirAnswer) -> list[int] | None:
        """Keep an answer worked out just now; the descriptors to send with it (owned
        here from now on), or None if it is not kept (the caller sends and closes
        ``ans.handover.fds`` as usual)."""
        h = ans.handover
        if not self._valid(ds) or ans.cost > self._limit // 4:
            return None
        if len(self._fds) + len(h.paths) > DIR_CACHE_FDS:
            self.clear()
        fds = []
        for path, fd in zip(h.paths, h.fds, strict=True):
            have = self._fds.get(path)
            if have is None:
                self._fds[path] = have = fd
            else:
                os.close(fd)
            fds.append(have)
        h.fds.clear()
        key = (ds.name, directory, ans.runs)
        old = self._answers.pop(key, None)
        if old is not None:
            self._bytes -= old[2].cost
        self._answers[key] = (ds.generation, ds.manifest, ans)
        self._bytes += ans.cost
        while self._bytes > self._limit and len(self._answers) > 1:
            _, dropped = self._answers.popitem(last=False)
            self._bytes -= dropped[2].cost
        return fds

    def _valid(self, ds: Dataset) -> bool:
        """Whether answers may be kept now; drops everything when the store moved."""
        if ds.policy.ttl:
            return False  # an answer must not outlive a page's expiry
        at = self._stamp()
        if at is None:
            self.clear()
            return False
        if at != self._at:
            self.clear()
            self._at = at
        return True

    def clear(self) -> None:
        self._answers.clear()
        self._bytes = 0
        fds = list(self._fds.values())
        self._fds.clear()
        for fd in fds:
            os.close(fd)


#: CLOCK_REALTIME_COARSE (Linux), which typeshed does not name
_COARSE: int = getattr(time, "CLOCK_REALTIME_COARSE", 5)


def _coarse_now() -> int:
    """The clock the kernel stamps ctime from, in ns (a tick behind the precise one)."""
    return time.clock_gettime_ns(_COARSE)


def check_pages(path: str, dev: int, ino: int, pages: list[Page]) -> tuple[int, list[Page]] | None:
    """Read back and checksum ``pages`` of the data file at ``path`` (run it in a
    thread): (the ctime they were checked at, the pages that failed), or None when a
    stamp of that ctime would not hold -- another file at that path now, a change to
    the file within the current clock tick (a later write in the same tick would leave
    its ctime as it is), a write during the check, an I/O error."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        ctime = st.st_ctime_ns
        if (st.st_dev, st.st_ino) != (dev, ino) or _coarse_now() <= ctime:
            return None
        # from here on any write to the file stamps it with a later ctime than ``ctime``
        bad = []
        for p in pages:
            data = os.pread(fd, p[1], p[0])
            if len(data) != p[1] or xxhash.xxh3_64_intdigest(data) != p[2]:
                bad.append(p)
        if os.fstat(fd).st_ctime_ns != ctime:
            return None
        return ctime, bad
    except OSError:
        return None
    finally:
        os.close(fd)


def revoke(path: str) -> None:
    """Move a data file's ctime (a chmod to the mode it has), so that no stamp handed
    over for it holds any longer: every reader checks its pages whole again."""
    try:
        os.chmod(path, stat.S_IMODE(os.stat(path).st_mode))
    except OSError:
        pass  # gone: nobody is handed it again


@dataclass(slots=True)
class _Checked:
    dev: int
    ino: int
    ctime: int
    at: float
    #: offset -> (length, checksum) of each page checked at that ctime
    pages: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(slots=True)
class _Todo:
    """Pages of one data file waiting for a check (see Verified._check_later)."""

    dev: int
    ino: int
    #: the latest ctime the file was seen with (its settling time counts from it)
    ctime: int
    #: offset -> (page, what to do if it fails: the answer's that handed it over)
    pages: dict[int, tuple[Page, OnBad]] = field(default_factory=dict)

    def on_bad(self, path: str, bad: list[Page]) -> None:
        """Hand each failed page to the callback of the answer that queued it."""
        groups: dict[int, tuple[OnBad, list[Page]]] = {}
        for p in bad:
            cb = self.pages[p[0]][1]
            groups.setdefault(id(cb), (cb, []))[1].append(p)
        for cb, mine in groups.values():
            cb(path, mine)


class Verified:
    """Data files whose handed-over pages this worker read back and checked, by file
    identity and ctime, so that a LOCATE answer can say so (a *stamp* per descriptor:
    the ctime its pages were checked at) and local readers skip the checksum while
    the descriptor's ctime is still that -- one check per node, not one per reader.

    Why a stamp can only make a reader check, never trust wrongly: every write to a
    file through the kernel (a new page, a byte flipped in place, a compaction) gives
    it a ctime later than any it had, and a chmod cannot set an old one back; a check
    counts only if the file's ctime was already older than the kernel's clock tick when
    it began (so a write right after it cannot share its ctime) and did not move while
    it ran. What no write reports -- bytes changed below the kernel -- is caught by
    the next check: checks are kept in memory only (a restarted worker checks each
    file again when it first hands it over) and stand VERIFY_EVERY seconds; a check
    that fails drops the bad pages (``on_bad``) and revokes every stamp of the file.
    The pages an answer had to hand over without a stamp are queued and checked in
    threads, in the background (VERIFY_AT_ONCE files at a time, each once it has
    settled): no answer waits for one, and none is dropped because others are busy.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._files: dict[str, _Checked] = {}
        self._busy: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: pages waiting for a check, per data file, and the timers of files that
        #: have not settled yet
        self._todo: dict[str, _Todo] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        #: bytes read back and pages found bad, for the curious
        self.checked_bytes = 0
        self.bad_pages = 0

    def stamps(self, h: Handover, pages: list[list[Page]], on_bad: OnBad) -> list[int]:
        """For each of ``h``'s descriptors, the ctime at which every page this answer
        hands over in it was checked (0: some were not, or not lately); the pages not
        checked yet are checked in the background, for later answers."""
        out: list[int] = []
        now = self._clock()
        for slot, mine in enumerate(pages):
            path, (dev, ino), ctime = h.paths[slot], h.ids[slot], h.ctimes[slot]
            rec = self._files.get(path)
            if (
                rec is not None
                and (rec.dev, rec.ino, rec.ctime) == (dev, ino, ctime)
                and now - rec.at < VERIFY_EVERY
            ):
                have = rec.pages
                todo = [p for p in mine if have.get(p[0]) != (p[1], p[2])]
            else:
                todo = mine
            out.append(0 if todo else ctime)
            if todo:
                self._check_later(path, dev, ino, ctime, todo, on_bad)
        return out

    def forget(self, path: str) -> None:
        self._files.pop(path, None)
        self._drop_todo(path)

    def _drop_todo(self, path: str) -> None:
        self._todo.pop(path, None)
        timer = self._timers.pop(path, None)
        if timer is not None:
            timer.cancel()

    def _check_later(
        self,
        path: str,
        dev: int,
        ino: int,
        ctime: int,
        pages: list[Page],
        on_bad: OnBad,
    ) -> None:
        """Queue ``pages`` of a data file for a check in the background: at once when
        a slot is free and the file has settled, else once it has settled or a check
        under way ends. Never dropped because one is busy: a sequential reader locates
        a large file's windows moments apart, and each must be checked for the next
        reader of the file to be handed stamps for all of them."""
        t = self._todo.get(path)
        if t is None or (t.dev, t.ino) != (dev, ino):
            self._drop_todo(path)  # another file at that path now: its wait is void
            if len(self._todo) >= VERIFY_QUEUE:
                self._drop_todo(next(iter(self._todo)))
            t = self._todo[path] = _Todo(dev, ino, ctime)
        t.ctime = max(t.ctime, ctime)
        for p in pages:
            t.pages[p[0]] = (p, on_bad)
        self._start(path)

    def _start(self, path: str) -> None:
        """Start the queued check of ``path`` if it may run now (else leave it queued,
        with a timer for when the file settles)."""
        t = self._todo.get(path)
        if t is None or path in self._busy:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        wait = SETTLE_NS - (_coarse_now() - t.ctime)
        if wait > 0:
            if path not in self._timers:  # one that fires early waits again (_settle)
                self._timers[path] = loop.call_later(wait / 1e9, self._settle, path)
            return
        timer = self._timers.pop(path, None)
        if timer is not None:
            timer.cancel()
        if len(self._busy) >= VERIFY_AT_ONCE:
            return  # started when a check under way ends
        del self._todo[path]
        self._busy.add(path)
        pages = sorted(p for p, _ in t.pages.values())
        task = loop.create_task(self._check(path, t.dev, t.ino, pages, t.on_bad))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _settle(self, path: str) -> None:
        """A queued file's settling time is up: start its check, or wait again if it
        was written to meanwhile (a cold reader's pages still being appended)."""
        self._timers.pop(path, None)
        t = self._todo.get(path)
        if t is None:
            return
        try:
            st: os.stat_result | None = os.stat(path)
        except OSError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != (t.dev, t.ino):
            del self._todo[path]  # gone, or another file: nobody is handed these pages
            return
        t.ctime = max(t.ctime, st.st_ctime_ns)
        self._start(path)

    def _next(self) -> None:
        """A check ended: start queued ones while slots are free."""
        for path in list(self._todo):
            if len(self._busy) >= VERIFY_AT_ONCE:
                return
            self._start(path)  # one still settling keeps waiting for its timer

    async def _check(
        self,
        path: str,
        dev: int,
        ino: int,
        pages: list[Page],
        on_bad: OnBad,
    ) -> None:
        began = self._clock()
        try:
            res = await asyncio.to_thread(check_pages, path, dev, ino, pages)
        finally:
            self._busy.discard(path)
            self._next()
        if res is None:
            return
        ctime, bad = res
        self.checked_bytes += sum(p[1] for p in pages)
        if bad:
            self.bad_pages += len(bad)
            self._files.pop(path, None)
            log.warning("%s: %d handed-over pages failed their check: dropped", path, len(bad))
            on_bad(path, bad)
            revoke(path)
            return
        rec = self._files.get(path)
        if (
            rec is None
            or (rec.dev, rec.ino, rec.ctime) != (dev, ino, ctime)
            or began - rec.at >= VERIFY_EVERY
        ):
            self._files.pop(path, None)
            if len(self._files) >= VERIFY_FILES:
                self._files.pop(next(iter(self._files)))
            rec = self._files[path] = _Checked(dev, ino, ctime, began)
        for off, n, ck in pages:
            rec.pages[off] = (n, ck)

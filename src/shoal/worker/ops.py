"""What each data-path op does on the worker: typed requests (shoal.proto.messages) in,
:class:`Answer` out. Connection handling is :mod:`shoal.worker.conn`'s, routing and
catching up with a reader's definitions :mod:`shoal.worker.server`'s.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import xxhash

from shoal.core.paging import page_count
from shoal.core.types import NEVER, Dataset, FileInfo, FileKey, PageKey
from shoal.errors import InvalidArgument, ShoalError
from shoal.proto import wire
from shoal.proto.messages import (
    DONE,
    AnyReply,
    BatchItem,
    BatchReply,
    DirItem,
    DirRun,
    ItemStatus,
    LocateDirReply,
    LocateReply,
    ReadReply,
    TouchItem,
    pack_sums,
    with_stamps,
)
from shoal.store.base import Location
from shoal.worker.handover import (
    DIR_STAMPS_FOR,
    DirAnswer,
    DirAnswers,
    Handover,
    OnBad,
    Page,
    Verified,
    revoke,
)
from shoal.worker.loader import Loader, Pages, Piece, fits
from shoal.worker.stats import Stats

#: a whole dataset's locations are handed over in one answer up to this many files
DATASET_LOCATE_MAX = 100_000
#: a file of up to this many pages kept whole goes to a local reader as one run (its
#: checksums are 8 bytes a page on the wire); a larger one goes in windows of pages
MAX_RUN_PAGES = 16384
#: files of several pages one LOCATE_DIR answer hands over as runs, at most: as many
#: as its descriptors allow (each run is one; the small files' segments take theirs
#: first), and their pages in all (8 bytes of checksum each). A cap of 32 left most of
#: an image-like mix's large files (242 in 1,000) out of the whole dataset's answer, and
#: each reader process then asked for every directory it read as well
DIR_RUNS = wire.MAX_FDS
DIR_RUN_PAGES = 16384
#: pages one TOUCH item may bump (bounds the work of one frame)
_TOUCH_PAGES_MAX = wire.MAX_TOUCH_PAGES
_NO_DIR = LocateDirReply([], [], False)


@dataclass(slots=True)
class Answer:
    """A reply and what travels with it."""

    reply: AnyReply | wire.Packed
    pieces: list[Piece] = field(default_factory=list)
    #: descriptors to hand over (Unix socket only); closed after sending if owned
    fds: list[int] = field(default_factory=list)
    own_fds: bool = True
    #: some of the bytes came from under storage just now (the latency's source)
    ufs: bool = False


def piece_len(p: Piece) -> int:
    return p.length if isinstance(p, Location) else len(p)


def _piece_ck(p: Piece) -> int:
    return p.checksum if isinstance(p, Location) else xxhash.xxh3_64_intdigest(p)


def _verify(loc: Location) -> bool:
    """Whether the page's bytes on disk still match their checksum (False if unreadable);
    run in a thread: it reads a whole page."""
    try:
        fd = os.open(loc.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        data = os.pread(fd, loc.length, loc.offset)
    except OSError:
        return False
    finally:
        os.close(fd)
    return len(data) == loc.length and xxhash.xxh3_64_intdigest(data) == loc.checksum


def run_pages(base: int, size: int, ps: int, sums: list[int]) -> list[Page]:
    """The pages of a file of ``size`` bytes kept whole from ``base`` in a data file."""
    return [(base + i * ps, min(ps, size - i * ps), ck) for i, ck in enumerate(sums)]


class Ops:
    """The per-op work of the data path, over one loader and its statistics."""

    def __init__(
        self,
        loader: Loader,
        stats: Stats,
        dirs: DirAnswers,
        note: Callable[[str, str], None],
    ) -> None:
        self.loader = loader
        self.stats = stats
        self.dirs = dirs
        self.note = note
        #: data files whose handed-over pages were checked (stamps in LOCATE answers)
        self.verified = Verified()

    async def drop(self, dataset: str, path: str, version: str, index: int) -> Answer:
        """A reader says this page failed its checksum: drop (and count) it only if the
        worker's own check of the bytes on disk fails too. Anyone can send a DROP, so a
        good page stays (counted as a refused drop) and nothing is refetched for it."""
        key = FileKey(dataset, path, version).page(index)
        store = self.loader.store
        loc = store.peek(key)
        if loc is None:
            return Answer(DONE)
        if await asyncio.to_thread(_verify, loc):
            self.stats.refused_drops += 1
            self.note("drops of a good page refused", f"/{dataset}/{path} page {index}")
            return Answer(DONE)
        if store.peek(key) == loc:  # still the bytes just checked
            store.drop_corrupt(key)  # counted by the store
            # the data file stays (other pages live in it): move its ctime, so that no
            # reader holding a stamp of it trusts the bad bytes (shoal.worker.handover)
            self.verified.forget(loc.path)
            revoke(loc.path)
        return Answer(DONE)

    def _drop_bad(self, key_of: Callable[[str, int], PageKey | None]) -> OnBad:
        """What to do with pages a background check found bad: drop them (if the store
        still holds those bytes), as a reader's DROP would. ``key_of(path, offset)``:
        the page the answer handed over there."""
        store = self.loader.store

        def drop(path: str, bad: list[Page]) -> None:
            for off, n, ck in bad:
                key = key_of(path, off)
                if key is None:
                    continue
                loc = store.peek(key)
                if loc is not None and Location(path, off, n, ck, loc.tier) == loc:
                    store.drop_corrupt(key)  # still the bytes checked: counted by the store

        return drop

    def read_answer(self, dataset: str, pages: Pages, local: bool) -> Answer:
        total = sum(piece_len(p) for p in pages.pieces)
        self.stats.served(dataset, total - min(total, pages.ufs_bytes), pages.ufs_bytes, local)
        info = pages.info
        reply = ReadReply(
            info.version,
            info.size,
            info.mtime,
            pages.first,
            [[piece_len(p), _piece_ck(p)] for p in pages.pieces],
        )
        return Answer(reply, pages.pieces, ufs=pages.ufs_bytes > 0)

    def locate_answer(
        self, dataset: str, pages: Pages, ahead: int = 0, runs: bool = False
    ) -> Answer:
        """Where the requested pages are; plus, up to ``ahead`` bytes, the already cached
        pages that follow (never fetched for this), so a sequential reader of a large
        file needs one round trip per window instead of one per page; what is left of
        that budget goes to the cached pages right before them, so that a random
        reader of a file that fits the window needs one round trip, not one per
        record-low offset it reads. ``runs``: a file kept whole goes as one run, all
        of it (:meth:`_run_answer`)."""
        if runs:
            whole = self._run_answer(dataset, pages)
            if whole is not None:
                return whole
        h = Handover()
        out: list[list[int]] = []
        pieces: list[Piece] = list(pages.pieces)
        first = pages.first
        if ahead > 0 and pieces:
            ds = self.loader.table.get(dataset)
            ps = ds.policy.page_size
            more = min(ahead // ps, wire.MAX_AHEAD_PAGES)
            last = min(page_count(pages.info.size, ps), pages.first + len(pieces) + more)
            for i in range(pages.first + len(pieces), last):
                # peek: the client reports what it reads
                loc = self.loader.located(ds, pages.info, i, peek=True)
                if loc is None:
                    break
                pieces.append(loc)
            behind: list[Piece] = []
            stop = max(-1, first - 1 - (more - (len(pieces) - len(pages.pieces))))
            for i in range(first - 1, stop, -1):
                loc = self.loader.located(ds, pages.info, i, peek=True)
                if loc is None:
                    break
                behind.append(loc)
            if behind:
                behind.reverse()
                pieces = behind + pieces
                first -= len(behind)
        per_slot: list[list[Page]] = []
        keys: dict[tuple[str, int], int] = {}
        try:
            for i, p in enumerate(pieces, first):
                slot = h.slot(p.path) if isinstance(p, Location) else None
                if slot is None:
                    out.append([-1, 0, piece_len(p), 0])  # read it with READ instead
                else:
                    assert isinstance(p, Location)
                    out.append([slot, p.offset, p.length, p.checksum])
                    if slot == len(per_slot):
                        per_slot.append([])
                    per_slot[slot].append((p.offset, p.length, p.checksum))
                    keys[(p.path, p.offset)] = i
        except OSError:
            h.abort()
            raise
        fk = FileKey(dataset, pages.info.path, pages.info.version)

        def key_of(path: str, off: int) -> PageKey | None:
            i = keys.get((path, off))
            return None if i is None else fk.page(i)

        drop = self._drop_bad(key_of)
        stamps = self.verified.stamps(h, per_slot, drop)
        self._served_locally(dataset, pages)
        info = pages.info
        reply = LocateReply(info.version, info.size, info.mtime, first, out, h.ids, False, stamps)
        return Answer(reply, fds=h.fds, ufs=pages.ufs_bytes > 0)

    def _served_locally(self, dataset: str, pages: Pages) -> None:
        # the client reads these bytes itself, right away: they count as served locally
        total = sum(piece_len(p) for p in pages.pieces)
        self.stats.served(dataset, total - min(total, pages.ufs_bytes), pages.ufs_bytes, True)

    def _run_answer(self, dataset: str, pages: Pages) -> Answer | None:
        """The whole file as one run (LocateReply.run) when it is kept whole in one data
        file that holds the pages asked for, else None (answer page by page): the
        worker's work is a checksum per page, the reader's one record per file."""
        info = pages.info
        ps = self.loader.table.get(dataset).policy.page_size
        n = page_count(info.size, ps)
        if info.size <= ps or n > MAX_RUN_PAGES:
            return None
        got = self.loader.store.locate_run(FileKey(dataset, info.path, info.version))
        if got is None:
            return None
        loc, sums = got
        if loc.length != info.size or len(sums) != n:
            return None
        # the pages just read must be that file's (not a copy in another tier)
        if not all(isinstance(p, Location) and p.path == loc.path for p in pages.pieces):
            return None
        answer = self._run_reply(dataset, info, loc, sums, pages.ufs_bytes > 0)
        self._served_locally(dataset, pages)
        return answer

    def whole_run(self, dataset: str, path: str, version: str | None) -> Answer | None:
        """A LOCATE of a whole file (asked for as a run) that is cached and kept whole in
        one data file, answered without locating it page by page; else None (the usual
        path). A mount's first open of a large file, or a gateway's first GET of an
        object, asks for it so: locating a 1 GiB file's 1,024 pages one by one (each
        looked up and touched) cost the worker ~7.5 ms per ask. Here every page is
        counted as read, as before, in one pass over the file's statistics."""
        loader = self.loader
        ds = loader.table.get(dataset)
        info = loader.cached_info(ds, path) or loader.manifest_info(ds, path)
        if info is None or (version is not None and info.version != version):
            return None
        ps = ds.policy.page_size
        n = page_count(info.size, ps)
        if info.size <= ps or n > MAX_RUN_PAGES:
            return None
        fk = FileKey(dataset, path, info.version)
        got = loader.store.locate_run(fk)
        if got is None:
            return None
        loc, sums = got
        if loc.length != info.size or len(sums) != n:
            return None
        # its first and last pages in this layout (the last one's offset is the page
        # size's multiple: a copy kept under another page size never fits) and in that
        # data file, not a copy in another tier
        last = loader.located(ds, info, n - 1, peek=True)
        first = loader.located(ds, info, 0, peek=True) if last is not None else None
        if first is None or first.path != loc.path or last is None or last.path != loc.path:
            return None
        if loader.store.touch_pages(fk, 0, n) != n:
            return None  # expired meanwhile: the usual path answers
        answer = self._run_reply(dataset, info, loc, sums, False)
        self.stats.served(dataset, info.size, 0, True)
        return answer

    def _run_reply(
        self, dataset: str, info: FileInfo, loc: Location, sums: list[int], ufs: bool
    ) -> Answer:
        """The answer that hands over file ``info``, kept whole in ``loc``, as one run."""
        ps = self.loader.table.get(dataset).policy.page_size
        n = len(sums)
        h = Handover()
        try:
            slot = h.slot(loc.path)
        except OSError:
            h.abort()
            raise
        assert slot == 0  # the first descriptor of an empty handover
        base, size = loc.offset, info.size
        fk = FileKey(dataset, info.path, info.version)

        def key_of(path: str, off: int) -> PageKey | None:
            return fk.page((off - base) // ps) if path == loc.path else None

        mine = run_pages(base, size, ps, sums)
        stamps = self.verified.stamps(h, [mine], self._drop_bad(key_of))
        run = [slot, base, 0, n]
        reply = LocateReply(
            info.version, size, info.mtime, 0, [], h.ids, False, stamps, run, pack_sums(sums)
        )
        return Answer(reply, fds=h.fds, ufs=ufs)

    def locate_dir(self, dataset: str, directory: str | None, runs: bool = False) -> Answer:
        """Locations of every small file of a directory (None: of the whole dataset, up to
        DATASET_LOCATE_MAX files) that is cached at the version this worker would serve,
        so a new reader process needs one round trip per directory or dataset, not one
        per file. Only under "never revalidate": otherwise each open revalidates.
        ``full`` is False when descriptors ran out and some cached files were left out.
        ``runs``: up to DIR_RUNS files of several pages kept whole go too, as runs."""
        ds = self.loader.table.get(dataset)
        store = self.loader.store
        if ds.policy.staleness != NEVER:
            return Answer(_NO_DIR)
        if directory is None and (store.file_count(dataset) or 0) > DATASET_LOCATE_MAX:
            return Answer(_NO_DIR)
        kept = self.dirs.get(ds, directory, runs)
        if kept is not None:
            return Answer(self._dir_meta(kept[0]), fds=kept[1], own_fds=False)
        ans = self._dir_answer(ds, directory, runs)
        fds = self.dirs.put(ds, directory, ans)
        if fds is None:
            return Answer(self._dir_meta(ans), fds=ans.handover.fds)
        return Answer(self._dir_meta(ans), fds=fds, own_fds=False)

    def _dir_answer(self, ds: Dataset, directory: str | None, runs: bool) -> DirAnswer:
        """Work a LOCATE_DIR answer out: small files first, then runs with the
        descriptors left (a directory of large files must not crowd out the small)."""
        store, ps = self.loader.store, ds.policy.page_size
        h = Handover()
        items: list[DirItem] = []
        large: list[tuple[FileKey, FileInfo, Location, list[int]]] = []
        budget = DIR_RUN_PAGES
        full = runs_full = True
        dataset = ds.name
        files = (
            store.files(dataset) if directory is None else store.files_in_dir(dataset, directory)
        )
        try:
            for fk in files:
                info = self.loader.current(ds, fk.path)
                if info is None or info.version != fk.version:
                    continue
                if info.size > ps:
                    n = page_count(info.size, ps)
                    if not runs or n > MAX_RUN_PAGES:
                        continue
                    if len(large) >= DIR_RUNS or n > budget:
                        runs_full = False  # maybe cached: past the limits, not looked at
                        continue
                    got = store.locate_run(fk)
                    if got is not None and got[0].length == info.size and len(got[1]) == n:
                        large.append((fk, info, got[0], got[1]))
                        budget -= n
                    continue
                loc = store.peek(fk.page(0))  # the client reports its reads later
                if loc is None or not fits(loc, info.size, ps, 0):
                    continue
                slot = h.slot(loc.path)
                if slot is None:
                    full = False
                    continue
                items.append(
                    (fk.path, fk.version, info.size, slot, loc.offset, loc.length, loc.checksum)
                )
            out: list[DirRun] = []
            sums: list[int] = []
            pages: list[list[Page]] = []
            where: dict[str, tuple[FileKey, int]] = {}  # data file -> its run
            for fk, info, loc, ck in large:
                slot = h.slot(loc.path)
                if slot is None:
                    runs_full = False  # no descriptors left: located one by one
                    break
                out.append((fk.path, fk.version, info.size, info.mtime, slot, loc.offset))
                sums += ck
                pages += [[] for _ in range(slot + 1 - len(pages))]
                pages[slot] += run_pages(loc.offset, info.size, ps, ck)
                where[loc.path] = (fk, loc.offset)
        except OSError:
            h.abort()
            raise
        reply = LocateDirReply(items, h.ids, full)
        if not runs:
            return DirAnswer(wire.pack(reply.encode()), h)
        pages += [[] for _ in range(len(h.ids) - len(pages))]

        def key_of(path: str, off: int) -> PageKey | None:
            got = where.get(path)
            return None if got is None else got[0].page((off - got[1]) // ps)

        reply = LocateDirReply(items, h.ids, full, out, pack_sums(sums), runs_full)
        return DirAnswer(reply.encode_unstamped(), h, True, pages, self._drop_bad(key_of))

    def _dir_meta(self, ans: DirAnswer) -> wire.Packed:
        """A kept answer as sent: with stamps worked out now, or lately if all were set
        (while one is not, each answer asks again: checks finish in the background)."""
        if not ans.runs:
            return wire.Packed(ans.meta)
        now = time.monotonic()
        stamps = ans.stamps
        if stamps is None or not all(stamps) or now - ans.stamped_at > DIR_STAMPS_FOR:
            assert ans.on_bad is not None
            if stamps is not None:
                ans.handover.refresh()  # checks stand at the files' ctimes of now
            stamps = ans.stamps = self.verified.stamps(ans.handover, ans.run_pages, ans.on_bad)
            ans.stamped_at = now
        return with_stamps(ans.meta, stamps)

    def touch(self, dataset: str, items: tuple[TouchItem, ...]) -> Answer:
        files = nbytes = 0
        budget = _TOUCH_PAGES_MAX * 4
        touch = self.loader.store.touch_pages
        for path, version, npages, size in items:
            fk = FileKey(dataset, path, version)  # type: ignore[arg-type]  # None: as sent
            n = min(int(npages), _TOUCH_PAGES_MAX, budget)
            budget -= n
            touch(fk, 0, n)  # bumps recency, up to the first page not held
            files += 1
            nbytes += max(0, int(size))
        self.stats.touched(dataset, files, nbytes)
        return Answer(DONE)

    def batch_cached(self, dataset: str, paths: tuple[str, ...], local: bool) -> Answer | None:
        """A BATCH answered on the spot (no task) when every file in it is cached or
        answers an error, else None: :meth:`batch`."""
        results = self._cached(dataset, paths, True)
        if results is None:
            return None
        return self._batch_answer(dataset, paths, results, local)

    async def batch(self, dataset: str, paths: tuple[str, ...], local: bool) -> Answer:
        async def one(path: str) -> Pages | ShoalError:
            try:
                fast = self.loader.try_cached(dataset, path, None, 0, -1)
                return (
                    fast if fast is not None else await self.loader.read(dataset, path, None, 0, -1)
                )
            except ShoalError as exc:
                return exc

        # the cached ones on the spot; a task each only for what must be fetched
        results = self._cached(dataset, paths, False)
        assert results is not None
        slow = [i for i, r in enumerate(results) if r is None]
        if slow:
            got = await asyncio.gather(*(one(paths[i]) for i in slow))
            for i, r in zip(slow, got, strict=True):
                results[i] = r
        return self._batch_answer(dataset, paths, results, local)

    def _cached(
        self, dataset: str, paths: tuple[str, ...], whole: bool
    ) -> list[Pages | ShoalError | None] | None:
        """Each path's cached pages, error, or None (not cached); with ``whole``, None
        at the first file not cached."""
        if len(paths) > wire.MAX_BATCH:
            raise InvalidArgument(f"batch of {len(paths)} files: at most {wire.MAX_BATCH}")
        try_cached = self.loader.try_cached
        results: list[Pages | ShoalError | None] = []
        for name in paths:
            try:
                r: Pages | ShoalError | None = try_cached(dataset, name, None, 0, -1)
            except ShoalError as exc:
                r = exc
            if r is None and whole:
                return None
            results.append(r)
        return results

    def _batch_answer(
        self,
        dataset: str,
        paths: tuple[str, ...],
        results: list[Pages | ShoalError | None],
        local: bool,
    ) -> Answer:
        ds = self.loader.table.get(dataset)
        items: list[BatchItem] = []
        pieces: list[Piece] = []
        fetched = False
        for path, res in zip(paths, results, strict=True):
            assert res is not None
            if isinstance(res, ShoalError):
                items.append(BatchItem.failed(path, res))
                continue
            info = res.info
            if info.size > ds.policy.page_size:
                items.append(BatchItem(path, ItemStatus.NOT_SMALL, info.version, info.size))
                continue
            p = res.pieces[0]
            items.append(BatchItem(path, ItemStatus.OK, info.version, info.size, _piece_ck(p)))
            pieces.append(p)
            n = piece_len(p)
            self.stats.served(dataset, n - min(n, res.ufs_bytes), res.ufs_bytes, local)
            fetched = fetched or res.ufs_bytes > 0
        return Answer(BatchReply(tuple(items)), pieces, ufs=fetched)

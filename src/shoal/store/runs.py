"""The disk tier's batched put: a run of new small files written with one write.

A mixin of :class:`~shoal.store.disk.DiskTier` (it shares the tier's state). A load of
many small files stores them one after the other; written one by one, each costs a
``pwrite`` and the room check of a put. :meth:`RunWriter.put_many` writes the pages it
can take as a run (new small files, the tier up, room made once for all of them) with
one vectored write per segment, then records each exactly as a put does. Anything else
-- a page already stored, a large file's page, a file cached with another geometry, a
write or room failure -- goes through :meth:`put` one page at a time, which has every
rule and error path of a single put (ENOSPC retried after making room, a failing disk
counted, a refusal remembered).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shoal.core.types import FileKey, PageKey
from shoal.store.base import PutMeta
from shoal.store.catalog import Catalog, FileState
from shoal.store.eviction import EvictionPolicy, PerDataset
from shoal.store.index import TierIndex
from shoal.store.segments import SegmentSet

Page = tuple[PageKey, bytes | memoryview, PutMeta]


class RunWriter:
    """``put_many`` for a tier; the attributes below are the tier's."""

    _cat: Catalog
    _segments: SegmentSet
    _index: TierIndex
    _policy: EvictionPolicy[FileKey]
    _per_dataset: PerDataset
    _clock: Callable[[], float]
    _is_down: bool
    _unwell: bool

    def put(self, key: PageKey, data: bytes | memoryview, meta: PutMeta) -> bool:
        raise NotImplementedError  # the tier's single put

    def _make_room(self, need: int, putting: FileKey) -> bool:
        raise NotImplementedError

    def _io_ok(self) -> None:
        raise NotImplementedError

    def _record(
        self,
        key: PageKey,
        st: FileState,
        seg: int,
        offset: int,
        data: bytes | memoryview,
        meta: PutMeta,
        now: float,
    ) -> None:
        raise NotImplementedError  # the tier's bookkeeping of one written page

    def put_many(self, pages: Sequence[Page]) -> list[bool]:
        """Store several pages as :meth:`put` would one by one; whether each was stored."""
        out = [False] * len(pages)
        run: list[int] = []
        alone: list[int] = []
        if self._is_down:
            alone = list(range(len(pages)))  # put refuses them (or finds the tier back)
        else:
            seen: set[FileKey] = set()
            files = self._cat.files
            for j, (key, data, meta) in enumerate(pages):
                fk = key.file
                size = meta.file_size
                if (
                    0 <= size <= meta.page_size
                    and key.index == 0
                    and len(data) == size
                    and fk not in files
                    and fk not in seen
                ):
                    seen.add(fk)
                    run.append(j)
                else:
                    alone.append(j)
        if run:
            alone.extend(self._put_run(pages, run, out))
        for j in sorted(alone):
            out[j] = self.put(*pages[j])
        return out

    def _put_run(self, pages: Sequence[Page], run: list[int], out: list[bool]) -> list[int]:
        """Write the run's pages as new small files; the indexes left for ``put``."""
        for j in run:
            meta = pages[j][2]
            if meta.eviction:
                self._per_dataset.set_kind(pages[j][0].file.dataset, meta.eviction)
        need = sum(len(pages[j][1]) for j in run)
        if not self._make_room(need, pages[run[0]][0].file):
            return run  # one by one: as many as fit, the others refused as put refuses
        left = run
        while left:
            try:
                offsets = self._segments.append_run(
                    [pages[j][0] for j in left], [pages[j][1] for j in left]
                )
            except OSError:
                return left  # put has the error paths (room, a failing disk)
            seg = self._segments.active
            assert seg is not None
            now = self._clock()
            for j, offset in zip(left, offsets, strict=False):
                key, data, meta = pages[j]
                fk = key.file
                st = FileState(meta.file_size, meta.page_size)
                self._cat.add_file(fk, st)
                self._policy.add(fk)
                self._record(key, st, seg, offset, data, meta, now)
                out[j] = True
            left = left[len(offsets) :]
        if self._unwell:
            self._io_ok()
        self._index.maybe_flush()
        return []

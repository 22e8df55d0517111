"""The passes each contender runs over small files, the image-like mix and a large
file: cold then warm, with the time caps that keep slow peers inside the budget.

Every pass may be capped (``Config.cold_cap_s``, ``Config.cap_s``) and is then rated on
what it read in that time. A capped cold pass fills a slow peer's cache with only part
of the data, so that peer's warm passes read exactly that part: warm always means
cached. A capped warm pass is not repeated (another minute of a peer at a few hundred
files/s moves no median).

With ``--quick`` a contender's caches are reset (``cold()``: for shoal a fresh
cluster, seconds each) once, before its first cold pass; the later cold passes read
files no pass has read since (the mix, then the large file) after a page-cache drop
only, so they are as cold for the data as after a reset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from shoal.bench import runner
from shoal.bench.contenders import Contender
from shoal.bench.stats import Sample

if TYPE_CHECKING:
    from shoal.bench.suite import Config

#: runs one pass and records it: (workload, contender, pass, cold) -> the sample or None
Measure = Callable[[str, Contender, Callable[[], Sample], bool], Sample | None]

CHUNK = 1 << 20


@dataclass
class Passes:
    cfg: Config
    measure: Measure
    want: Callable[[str], bool]
    #: a reset was made for this contender and only other files were read since
    _reset: bool = False

    def _cold(self, wl: str, c: Contender, fn: Callable[[], Sample], unread: bool) -> Sample | None:
        """A cold pass; ``unread``: its files were not read since this contender's last
        reset, which --quick then skips (the page cache is dropped all the same)."""
        if unread and self._reset and self.cfg.quick:
            runner.drop_caches()
            return self.measure(wl, c, fn, False)
        self._reset = True
        return self.measure(wl, c, fn, True)

    def run(self, c: Contender, small: list[str], mix: list[str], large_size: int) -> None:
        if self.want("small"):
            self.files(c, "small-100KB", small, seed=100, p1=True)
        if self.want("mix") and mix:
            self.files(c, "mix-10KB-5MB", mix, seed=500, p1=False)
        if self.want("large") and not c.batch and large_size:
            self.large(c, "large/blob.bin", large_size)

    # -- files ------------------------------------------------------------------------

    def files(self, c: Contender, name: str, keys: list[str], seed: int, p1: bool) -> None:
        cfg, n = self.cfg, self.cfg.procs
        # no cache: a "warm" epoch is one more remote pass, so once, at cold concurrency
        remote = c.kind == "remote"
        warm_threads = cfg.cold_threads if remote else cfg.warm_threads
        cached = keys
        for r in range(cfg.cold_reps):
            s = self._cold(
                f"{name} cold p{n}",
                c,
                partial(runner.epoch, c, keys, n, cfg.cold_threads, seed + r, cap_s=cfg.cold_cap_s),
                r == 0,
            )
            if s is not None and s.read is not None:
                # what the capped pass left in the cache: every cold pass starts from an
                # empty one, so a later capped rep leaves less than the first pass read
                cached = _keys(s.read)
            if s is None or s.read is not None:
                break  # failed, or a slow peer: one capped cold pass says enough
        reps = 1 if remote else cfg.warm_reps
        more_p1 = p1 and not remote  # without a cache p1 teaches nothing new
        more_pn = True
        for i in range(reps):
            if more_p1:
                s = self._warm(f"{name} warm p1", c, cached, 1, warm_threads, seed + 100 + i)
                more_p1 = s is not None and s.read is None
            if more_pn:
                s = self._warm(f"{name} warm p{n}", c, cached, n, warm_threads, seed + 200 + i)
                more_pn = s is not None and s.read is None
            if not (more_p1 or more_pn):
                break
        if p1 and not cfg.quick:
            self.measure(
                f"{name} cold p1",
                c,
                partial(
                    runner.epoch, c, keys, 1, cfg.cold_threads, seed + 300, cap_s=cfg.cold_cap_s
                ),
                True,
            )

    def _warm(
        self, wl: str, c: Contender, keys: list[str], procs: int, threads: int, seed: int
    ) -> Sample | None:
        fn = partial(runner.epoch, c, keys, procs, threads, seed, cap_s=self.cfg.cap_s)
        return self.measure(wl, c, fn, False)

    # -- one large file -----------------------------------------------------------------

    def large(self, c: Contender, key: str, size: int) -> None:
        cfg = self.cfg
        remote = c.kind == "remote"
        s = self._cold(
            "large seq cold",
            c,
            partial(runner.ranges, c, key, size, CHUNK, True, 0, cap_s=cfg.cold_cap_s),
            True,
        )
        if s is None:
            return
        cached = size if s.read is None else min(size, len(s.read) * CHUNK)
        seq = rand = True
        for i in range(1 if remote else cfg.warm_reps):
            if seq:
                s = self.measure(
                    "large seq warm",
                    c,
                    partial(runner.ranges, c, key, cached, CHUNK, True, 0, cap_s=cfg.cap_s),
                    False,
                )
                seq = s is not None and s.read is None
            if rand and not remote:  # remote: the same ranged GETs as cold
                s = self.measure(
                    "large rand warm",
                    c,
                    partial(runner.ranges, c, key, cached, CHUNK, False, 700 + i, cap_s=cfg.cap_s),
                    False,
                )
                rand = s is not None and s.read is None
            if not (seq or rand):
                break
        if not cfg.quick:
            self.measure(
                "large rand cold",
                c,
                partial(runner.ranges, c, key, size, CHUNK, False, 800, cap_s=cfg.cold_cap_s),
                True,
            )


def _keys(read: list[Any]) -> list[str]:
    """Keys read by a capped pass (batches are lists of keys)."""
    out: list[str] = []
    for x in read:
        out.extend(x if isinstance(x, list) else [x])
    return out

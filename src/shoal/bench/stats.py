"""Pure arithmetic for the benchmark report: medians, rates, ratios, CPU per GB."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    """One timed run: what was read, how long it took, how much CPU it cost."""

    seconds: float
    files: int
    nbytes: int
    cpu_s: float = 0.0
    #: the items a pass stopped by its time cap got through (None: it read them all)
    read: list[Any] | None = field(default=None, repr=False, compare=False)


@dataclass
class Result:
    workload: str
    contender: str
    samples: list[Sample] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.samples)

    @property
    def files_per_s(self) -> float:
        return median_rate(self.samples, "files")

    @property
    def mb_per_s(self) -> float:
        return median_rate(self.samples, "bytes") / 1e6

    @property
    def cpu_s_per_gb(self) -> float:
        return cpu_per_gb(self.samples)

    def to_dict(self) -> dict[str, object]:
        return {
            "workload": self.workload,
            "contender": self.contender,
            "files_per_s": round(self.files_per_s, 1) if self.ok else None,
            "mb_per_s": round(self.mb_per_s, 1) if self.ok else None,
            "cpu_s_per_gb": round(self.cpu_s_per_gb, 2) if self.ok else None,
            "runs": len(self.samples),
            "seconds": [round(s.seconds, 3) for s in self.samples],
            "note": self.note,
        }


def median(xs: Iterable[float]) -> float:
    vals = list(xs)
    if not vals:
        raise ValueError("median of no values")
    return float(statistics.median(vals))


def median_rate(samples: Sequence[Sample], what: str = "files") -> float:
    """Median over runs of the per-run rate (not total/total: one slow run must not
    dominate, and an odd count gives a rate that was really measured)."""
    if not samples:
        return 0.0
    rates = [
        (s.files if what == "files" else s.nbytes) / s.seconds for s in samples if s.seconds > 0
    ]
    return median(rates) if rates else 0.0


def cpu_per_gb(samples: Sequence[Sample]) -> float:
    """Median over runs of CPU seconds (readers + the cache's daemons) per GB served."""
    vals = [s.cpu_s / (s.nbytes / 1e9) for s in samples if s.nbytes > 0]
    return median(vals) if vals else 0.0


def ratio(a: float, b: float) -> float | None:
    """a / b, or None when b is not a usable denominator."""
    if b <= 0 or a < 0:
        return None
    return a / b


def ratio_table(
    rates: Mapping[str, float], reference: str | None = None
) -> dict[str, dict[str, float | None]]:
    """Every contender against every other: ``out[a][b] = rate(a) / rate(b)``. With
    ``reference``, only that column."""
    names = list(rates)
    cols = [reference] if reference is not None else names
    return {a: {b: ratio(rates[a], rates[b]) for b in cols if b in rates} for a in names}


@dataclass(frozen=True)
class Target:
    """``numerator >= factor x denominator`` on one workload's chosen metric."""

    label: str
    numerator: tuple[str, str]  # (workload, contender)
    denominator: tuple[str, str]
    factor: float
    metric: str = "files_per_s"

    def evaluate(
        self, results: Mapping[tuple[str, str], Result]
    ) -> tuple[float | None, bool | None]:
        num, den = results.get(self.numerator), results.get(self.denominator)
        if num is None or den is None or not num.ok or not den.ok:
            return None, None
        a = num.files_per_s if self.metric == "files_per_s" else num.mb_per_s
        b = den.files_per_s if self.metric == "files_per_s" else den.mb_per_s
        r = ratio(a, b)
        return r, (None if r is None else r >= self.factor)

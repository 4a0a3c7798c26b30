"""Timings across ranks: one ``BenchmarkResult`` or ``TrajectoryResult`` per rank, combined.

>>> result = benchmark_function(step, barrier=True)   # every rank
>>> summary = aggregate(result)                       # a collective; every rank gets it
>>> if summary.rank == 0:
...     print(summary)
"""

from __future__ import annotations

import json
import math
import socket
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union, cast

from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.text_table import text_table
from gpukeeper.distributed.fixed_rows import (
    HOSTNAME_BYTES,
    float_word,
    text_word_count,
    text_words,
    word_float,
    words_text,
)
from gpukeeper.distributed.rank_outliers import TWO_RANKS_NOTE, pick_outlier
from gpukeeper.frameworks import ranks
from gpukeeper.md.trajectory_result import TrajectoryResult
from gpukeeper.timing.benchmark_result import BenchmarkResult

__all__ = [
    "DEVICE_BYTES",
    "NAME_BYTES",
    "TIMING_VECTOR_LENGTH",
    "RankAggregate",
    "RankTiming",
    "aggregate",
]

Result = Union[BenchmarkResult, TrajectoryResult]

#: A rank's median must be this fraction above the median of the ranks' medians to be
#: named the outlier: ranks running the same code differ by a few percent from noise
#: alone, and naming one of them would send a reader after nothing.
OUTLIER_FRACTION = 0.05


def _finite(x: Optional[float]) -> Optional[float]:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


@dataclass(frozen=True)
class RankTiming:
    """One rank's result, in the figures that are compared across ranks (ms, per call
    or per step). A fixed payload: the per-call samples stay on their rank."""

    rank: int
    hostname: str
    kind: str  # "benchmark" or "trajectory"
    name: str
    device: str
    n: int
    median_ms: float
    mean_ms: float
    std_ms: Optional[float]
    min_ms: float
    max_ms: float
    p95_ms: float
    ns_per_day: Optional[float] = None
    steps_per_s: Optional[float] = None
    noisy: bool = False
    warnings: int = 0

    @classmethod
    def of(cls, result: Result, rank: int, hostname: Optional[str] = None) -> "RankTiming":
        host = hostname if hostname is not None else socket.gethostname()
        # What differs between the two kinds; the statistics are read alike.
        if isinstance(result, BenchmarkResult):
            kind, n, ns_day, per_s = "benchmark", result.n_calls, None, result.calls_per_s
            noisy = bool(result.noisy)
        elif isinstance(result, TrajectoryResult):
            kind, n, ns_day = "trajectory", len(result.times_ms), result.ns_per_day
            per_s, noisy = result.steps_per_s, False
        else:
            raise InvalidInputError(
                "aggregate: result must be a BenchmarkResult or a TrajectoryResult, "
                f"got {type(result).__name__}"
            )
        return cls(
            rank,
            host,
            kind,
            result.name,
            result.device,
            n,
            result.median_ms,
            result.mean_ms,
            _finite(result.std_ms),
            result.min_ms,
            result.max_ms,
            result.p95_ms,
            _finite(ns_day),
            _finite(per_s),
            noisy,
            len(result.warnings),
        )

    def to_vector(self) -> List[int]:
        """The figures as :data:`TIMING_VECTOR_LENGTH` int64s, the row ``aggregate`` gathers.

        Layout: a format mark, rank, kind (0 benchmark, 1 trajectory), n, noisy, warnings,
        the eight times and rates as IEEE-754 bits (None as NaN), then the host name, the
        name and the device as texts of :data:`HOSTNAME_BYTES`, :data:`NAME_BYTES` and
        :data:`DEVICE_BYTES` bytes (a longer one arrives cut there).
        """
        floats = (
            self.median_ms,
            self.mean_ms,
            self.std_ms,
            self.min_ms,
            self.max_ms,
            self.p95_ms,
            self.ns_per_day,
            self.steps_per_s,
        )
        return [
            _TIMING_MARK,
            self.rank,
            _KINDS.index(self.kind),
            self.n,
            int(self.noisy),
            self.warnings,
            *(float_word(v) for v in floats),
            *text_words(self.hostname, HOSTNAME_BYTES),
            *text_words(self.name, NAME_BYTES),
            *text_words(self.device, DEVICE_BYTES),
        ]

    @classmethod
    def from_vector(cls, row: Sequence[int]) -> "RankTiming":
        """Reads back :meth:`to_vector`. Raises ``InvalidInputError`` for a row of another
        length or without the format mark."""
        if len(row) != TIMING_VECTOR_LENGTH or row[0] != _TIMING_MARK:
            raise InvalidInputError(
                f"RankTiming.from_vector: not a timing row (want {TIMING_VECTOR_LENGTH} "
                f"int64s starting with {_TIMING_MARK}, got {len(row)} starting with "
                f"{row[0] if len(row) else None})"
            )
        _, rank, kind, n, noisy, warnings = (int(v) for v in row[:6])
        median, mean, std, low, high, p95, ns_day, steps = (word_float(w) for w in row[6:14])
        host_end = 14 + text_word_count(HOSTNAME_BYTES)
        name_end = host_end + text_word_count(NAME_BYTES)
        return cls(
            rank=rank,
            hostname=words_text(row[14:host_end], HOSTNAME_BYTES),
            kind=_KINDS[kind],
            name=words_text(row[host_end:name_end], NAME_BYTES),
            device=words_text(row[name_end:], DEVICE_BYTES),
            n=n,
            median_ms=median,
            mean_ms=mean,
            std_ms=_finite(std),
            min_ms=low,
            max_ms=high,
            p95_ms=p95,
            ns_per_day=_finite(ns_day),
            steps_per_s=_finite(steps),
            noisy=bool(noisy),
            warnings=warnings,
        )


_KINDS = ("benchmark", "trajectory")
#: Bytes of the timed function's name and of the device that a timing row carries (the
#: host name takes HOSTNAME_BYTES); a longer text arrives cut to this many bytes.
NAME_BYTES = 128
DEVICE_BYTES = 64
#: int64s in a timing row: 14 words of figures, then three texts.
TIMING_VECTOR_LENGTH = (
    14
    + text_word_count(HOSTNAME_BYTES)
    + text_word_count(NAME_BYTES)
    + text_word_count(DEVICE_BYTES)
)
# "gk", then 1 for timings (memory rows use 0) and the layout's version.
_TIMING_MARK = 0x676B_1001


@dataclass
class RankAggregate:
    """Every rank's timing of one function or trajectory, and the spread across ranks.

    ``per_rank``: one :class:`RankTiming` per rank, in rank order. ``median_ms``: the
    min, median and max across ranks of the ranks' median times; ``slowest_rank``: the
    rank with the largest median (the one the others wait for at every collective);
    ``imbalance``: slowest median / fastest median - 1. For trajectories,
    ``ns_per_day_per_replica`` (one replica per rank) and ``ns_per_day_total`` (their
    sum: the ensemble's throughput; None when a rank has no ns/day). ``rank``: the rank
    this object lives on (None when aggregated outside a process group).

    ``outlier_rank``: the slow rank that stands out, by the rule of
    :func:`gpukeeper.distributed.pick_outlier`: with three ranks or more the slowest when
    its median is at least ``OUTLIER_FRACTION`` (5 %) above the median of the ranks'
    medians, None when no rank is; with two ranks the slower one (5 % slower than the
    other), since their median cannot tell. ``outlier_how`` says which
    (``"above the median"`` or ``"max of 2 ranks"``; None without an outlier).
    """

    kind: str
    name: str
    per_rank: List[RankTiming]
    median_ms: Dict[str, float]
    slowest_rank: int
    fastest_rank: int
    imbalance: float
    ns_per_day_per_replica: Optional[List[Optional[float]]] = None
    ns_per_day_total: Optional[float] = None
    rank: Optional[int] = None
    warnings: List[str] = field(default_factory=list)
    outlier_rank: Optional[int] = None
    outlier_how: Optional[str] = None

    @property
    def world_size(self) -> int:
        return len(self.per_rank)

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["world_size"] = self.world_size
        return d

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def table(self) -> str:
        """A row per rank and the spread across ranks, as text."""
        trajectory = self.kind == "trajectory"
        header = [
            "rank",
            "host",
            "device",
            "n",
            "median ms",
            "mean ms",
            "min ms",
            "max ms",
            "p95 ms",
        ]
        if trajectory:
            header.append("ns/day")
        body = []
        for t in self.per_rank:
            row = [
                str(t.rank)
                + (" (slowest)" if t.rank == self.slowest_rank and self.world_size > 1 else ""),
                t.hostname,
                t.device,
                str(t.n),
                f"{t.median_ms:.4f}",
                f"{t.mean_ms:.4f}",
                f"{t.min_ms:.4f}",
                f"{t.max_ms:.4f}",
                f"{t.p95_ms:.4f}",
            ]
            if trajectory:
                row.append("?" if t.ns_per_day is None else f"{t.ns_per_day:.3f}")
            body.append(row)
        lines = [
            f"{self.kind} {self.name!r} across {self.world_size} ranks",
            text_table(header, body, left=3).rstrip("\n"),
            f"median across ranks: min {self.median_ms['min']:.4f} ms, median "
            f"{self.median_ms['median']:.4f} ms, max {self.median_ms['max']:.4f} ms; slowest rank "
            f"{self.slowest_rank} ({self.imbalance * 100:.1f} % slower than rank "
            f"{self.fastest_rank})",
            self._outlier_line(),
        ]
        if trajectory:
            total = "?" if self.ns_per_day_total is None else f"{self.ns_per_day_total:.3f}"
            lines.append(f"ensemble: {total} ns/day in total over {self.world_size} replicas")
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines) + "\n"

    def _outlier_line(self) -> str:
        if self.outlier_rank is None:
            return (
                f"outlier: none (no rank's median is {OUTLIER_FRACTION * 100:.0f} % above "
                "the median across ranks)"
            )
        if self.outlier_how == "max of 2 ranks":
            return f"outlier: rank {self.outlier_rank}* (* {TWO_RANKS_NOTE})"
        above = self.per_rank_median(self.outlier_rank) / self.median_ms["median"] - 1.0
        return (
            f"outlier: rank {self.outlier_rank} ({above * 100:.1f} % above the median across ranks)"
        )

    def per_rank_median(self, rank: int) -> float:
        """The median time (ms) of ``rank``; ``InvalidInputError`` for a rank not here."""
        for t in self.per_rank:
            if t.rank == rank:
                return t.median_ms
        raise InvalidInputError(
            f"RankAggregate: no rank {rank!r} (ranks: {[t.rank for t in self.per_rank]})"
        )

    def __str__(self) -> str:
        return self.table()


def _combine(timings: Sequence[RankTiming], rank: Optional[int]) -> RankAggregate:
    kinds = {t.kind for t in timings}
    if len(kinds) != 1:
        raise InvalidInputError(
            f"aggregate: the ranks' results are of different kinds: {sorted(kinds)}"
        )
    kind = kinds.pop()
    names = sorted({t.name for t in timings})
    warnings: List[str] = []
    if len(names) > 1:
        warnings.append(f"the ranks timed differently named functions: {names}")
    medians = [t.median_ms for t in timings]
    pick = pick_outlier(
        {t.rank: t.median_ms for t in timings}, direction="high", min_fraction=OUTLIER_FRACTION
    )
    slowest = max(timings, key=lambda t: t.median_ms)
    fastest = min(timings, key=lambda t: t.median_ms)
    imbalance = slowest.median_ms / fastest.median_ms - 1.0 if fastest.median_ms > 0 else math.inf
    noisy = [t.rank for t in timings if t.noisy]
    if noisy:
        warnings.append(
            f"noisy on rank(s) {noisy}: their medians are less certain than the spread suggests"
        )
    out = RankAggregate(
        kind=kind,
        name=names[0],
        per_rank=sorted(timings, key=lambda t: t.rank),
        median_ms={"min": min(medians), "median": statistics.median(medians), "max": max(medians)},
        slowest_rank=slowest.rank,
        fastest_rank=fastest.rank,
        imbalance=imbalance,
        rank=rank,
        warnings=warnings,
        outlier_rank=None if pick is None else pick.rank,
        outlier_how=None if pick is None else pick.how,
    )
    if kind == "trajectory":
        per = [t.ns_per_day for t in out.per_rank]
        out.ns_per_day_per_replica = per
        out.ns_per_day_total = None if any(v is None for v in per) else float(sum(per))  # type: ignore[arg-type]
    return out


def aggregate(result: Union[Result, Sequence[Result]], group: Any = None) -> RankAggregate:
    """Combines one timing result per rank: per-rank statistics, the min, median and max
    across ranks, the slowest rank, and for trajectories ns/day per replica and in total.

    ``result``: this rank's ``BenchmarkResult`` or ``TrajectoryResult``. Then
    ``aggregate`` is a collective over ``group`` (None: the default group): every rank
    of it calls, and every rank gets the same answer. Only a fixed handful of figures per
    rank travels (:class:`RankTiming`), never the samples.

    A list of results instead (one per rank, in rank order, e.g. loaded from per-rank
    JSON) is combined here, without a process group.

    Raises ``InvalidInputError`` for results of another type, a mix of benchmark and
    trajectory results, an empty list, or a collective call without a process group.
    """
    if isinstance(result, (list, tuple)):
        if not result:
            raise InvalidInputError("aggregate: no results")
        return _combine([RankTiming.of(r, i) for i, r in enumerate(result)], None)
    group = ranks.check_group(group, "aggregate")
    info = ranks.current_rank()
    me = info.rank if info is not None else 0
    # A bad result (another sequence type included) fails on its own rank, before the
    # collective.
    mine = RankTiming.of(cast(Result, result), me)
    rows = ranks.all_gather_int64(mine.to_vector(), group, None)
    assert rows is not None
    return _combine([RankTiming.from_vector(row) for row in rows], me)

"""Benchmark runs compared with the noise between processes: faster, slower, same or undecided.

Why between processes: two processes running the same code differ by more than the calls
of one process suggest (thread placement, clocks, the allocator's state, what else the
machine runs), and a run is always compared with a run of another process. So a run may
hold several **rounds**, each the :class:`BenchmarkResult` of one fresh process, and the
noise model is the spread of the statistic (``median`` by default) from round to round.

The model, on the logarithm of each round's statistic:

- ``change``: the geometric mean of the current rounds over that of the baseline rounds;
- ``s``: the standard deviation between rounds, pooled over both sides (baseline rounds
  about their mean, current rounds about theirs), with ``R_b + R_c - 2`` degrees of
  freedom;
- the **spread**: ``t * s * sqrt(1/R_b + 1/R_c)``, ``t`` the 99.5th percentile of
  Student's t at those degrees of freedom (further into the tail for the later looks of
  :func:`decide`, which share the 1% among them): how far a fresh process of unchanged code
  lands from the baseline, at 99% (two-sided), few rounds counting for their uncertainty.
  It is never narrower than what resampling the calls gives (a bootstrap of all rounds'
  calls, fixed seed), so identical rounds do not claim a precision their calls lack.
- rounds **set aside**: with 3 or more rounds on a side, a round whose statistic lies
  more than 2x from that side's median and far outside its robust spread (5 MADs) is left
  out, and the verdict names it: one process in a state no other reached does not widen
  the spread for all. States that recur stay in.

The interval is the change widened by the spread on both sides. Then:

- ``slower`` / ``faster``: the whole interval lies above / below 1: the change is clearly
  larger than the spread;
- ``same``: the interval lies within ``same_band`` of 1 (the fail threshold when one is
  given, else ±2%);
- ``undecided``: neither: the change is within the spread, and the spread is wider than
  the band. The description names the spread it measured.

With one round on each side the spread is **unmeasured**: the interval is then only what
the calls of the two processes say (the bootstrap), never "same", and a change is called
only beyond a factor of 2 (:data:`UNMEASURED_FACTOR`), which one process against another
rarely reaches by chance. Save several rounds to gate on smaller changes.

:func:`regression` says whether a comparison is a regression past a threshold: slower,
and by more than the threshold. A change within the spread fails nothing.

:func:`decide` is the gate's way from one current round to a verdict: while a comparison
is slower past the threshold, or undecided with a change past it
(:func:`needs_more_rounds`), it adds fresh rounds one at a time and compares again,
stopping as soon as the verdict is decided. The pytest gate and the gate's benchmark both
call it.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from gpukeeper.base.arg_checks import check_fraction, check_int
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.html_table import html_table
from gpukeeper.timing import stats as _stats
from gpukeeper.timing.benchmark_result import BenchmarkResult

__all__ = [
    "COMPARISON_HEADER",
    "STATISTICS",
    "ASIDE_FACTOR",
    "ASIDE_Z",
    "UNMEASURED_FACTOR",
    "Comparison",
    "FailThreshold",
    "Rounds",
    "compare_runs",
    "comparisons_html",
    "decide",
    "needs_more_rounds",
    "parse_fail_threshold",
    "regression",
]

#: The statistics a comparison can be made on, by the name used on the command line.
STATISTICS: Dict[str, Callable[[Sequence[float]], float]] = {
    "median": _stats.median,
    "mean": _stats.mean,
    "min": _stats.minimum,
    "max": _stats.maximum,
    "p95": lambda xs: _stats.percentile(xs, 95.0),
    "p99": lambda xs: _stats.percentile(xs, 99.0),
}

#: With one round on each side, a change is called only beyond this factor either way.
UNMEASURED_FACTOR = 2.0

#: A round is set aside only when its statistic is more than this factor from its side's
#: median (and :data:`ASIDE_Z` robust standard deviations from it).
ASIDE_FACTOR = 2.0
ASIDE_Z = 5.0

#: A run: one result (one round) or the results of several fresh processes.
Rounds = Union[BenchmarkResult, Sequence[BenchmarkResult]]

_RESAMPLES = 1000
_MAX_SAMPLE = 2000  # calls per side used by the bootstrap (an even subsample beyond)
# With rounds the bootstrap is only a floor under the spread: a coarse one will do.
_FLOOR_RESAMPLES = 200
_FLOOR_MAX_SAMPLE = 500
_DEFAULT_BAND = 0.02

#: The one-sided tail of each bound of the interval: 99% two-sided.
_TAIL = 0.005


def _t_quantile(df: int, tail: float) -> float:
    """Student's t at upper tail ``tail`` with ``df`` degrees of freedom: exact for 1 and 2,
    the Cornish-Fisher expansion in 1/df beyond (Abramowitz and Stegun 26.7.5; within 1% of
    the exact value at df 3 for the 99.5th percentile, closer as df grows)."""
    p = 1.0 - tail
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    v = float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


@dataclass(frozen=True)
class Comparison:
    """One benchmark against its baseline: ``ratio`` = current / baseline of ``stat``
    (above 1: slower), with its 99% interval ``ratio_low``..``ratio_high``.

    ``spread``: the spread between processes as a fraction (0.05: a fresh process of the
    same code lands within ±5%), None when unmeasured (one round on each side);
    ``rounds_baseline`` / ``rounds_current``: the rounds (fresh processes) on each side."""

    name: str
    stat: str
    baseline_ms: float
    current_ms: float
    ratio: float
    ratio_low: float
    ratio_high: float
    verdict: str  # "faster", "slower", "same" or "undecided"
    spread: Optional[float] = None
    rounds_baseline: int = 1
    rounds_current: int = 1
    set_aside: str = ""  # the rounds left out of the model, and why ("" when none)

    @property
    def change(self) -> float:
        """Relative change of the statistic: +0.05 is 5% slower."""
        return self.ratio - 1.0

    @property
    def detectable(self) -> float:
        """The smallest change this comparison could have called, as a fraction (0.08: a
        change of ±8% or more would have been slower or faster here): the spread between
        processes where it is measured, else the factor a change must pass without it."""
        if self.spread is None:
            return UNMEASURED_FACTOR - 1.0
        return self.spread

    def power_text(self) -> str:
        """``could detect ±8.0% or more here``: the run's power, in words."""
        return f"could detect ±{self.detectable:.1%} or more here"

    def spread_text(self) -> str:
        """``±3.1% over 5 rounds`` (``5+3 rounds`` with several current rounds), or
        ``unmeasured``."""
        if self.spread is None:
            return "unmeasured"
        rounds = (
            f"{self.rounds_baseline}"
            if self.rounds_current == 1
            else f"{self.rounds_baseline}+{self.rounds_current}"
        )
        # A saved run of one round measures no spread: it comes from this run's rounds.
        whose = ", measured on the current side" if self.rounds_baseline == 1 else ""
        return f"±{self.spread:.1%} over {rounds} rounds{whose}"

    def describe(self) -> str:
        """One line, e.g. ``slower: median 2.013 ms vs 1.001 ms, +101.1% (99% interval
        +95.0%..+107.4%), beyond the spread between processes (±3.1% over 5 rounds)``."""
        head = (
            f"{self.verdict}: {self.stat} {self.current_ms:.4g} ms vs {self.baseline_ms:.4g} ms, "
            f"{self.change:+.1%} "
            f"(99% interval {self.ratio_low - 1:+.1%}..{self.ratio_high - 1:+.1%})"
        )
        if self.spread is None:
            if self.verdict in ("slower", "faster"):
                return (
                    f"{head}, beyond {UNMEASURED_FACTOR:g}x; the spread between processes is "
                    f"unmeasured (one round each): {self.power_text()}"
                )
            return (
                f"{head}; the spread between processes is unmeasured (one round each: save "
                f"several rounds to measure it), and a change within {UNMEASURED_FACTOR:g}x "
                f"is not called without it: {self.power_text()}"
            )
        aside = f"; {self.set_aside}" if self.set_aside else ""
        where = "beyond" if self.verdict in ("slower", "faster") else "within"
        return (
            f"{head}, {where} the spread between processes ({self.spread_text()}); "
            f"{self.power_text()}{aside}"
        )

    def cells(self) -> Tuple[str, ...]:
        """The comparison as the cells of one table row, in the order of
        :data:`COMPARISON_HEADER`."""
        return (
            self.name,
            self.stat,
            f"{self.baseline_ms:.4g}",
            f"{self.current_ms:.4g}",
            f"{self.change:+.1%}",
            f"{self.ratio_low - 1:+.1%}..{self.ratio_high - 1:+.1%}",
            self.spread_text(),
            f"±{self.detectable:.1%}",
            self.verdict,
        )

    def _repr_html_(self) -> str:
        """The comparison as a one-row HTML table, for Jupyter."""
        return comparisons_html([self])


#: The header of a table of :class:`Comparison` rows (``Comparison.cells``).
COMPARISON_HEADER = (
    "benchmark",
    "stat",
    "saved ms",
    "now ms",
    "change",
    "99% interval",
    "spread between processes",
    "could detect",
    "verdict",
)


def comparisons_html(comparisons: Iterable[Comparison]) -> str:
    """Saved-versus-new comparisons as one compact HTML table, one row each; a slower
    verdict is repeated under the table as a warning."""
    items = list(comparisons)
    for c in items:
        if not isinstance(c, Comparison):
            raise InvalidInputError(
                f"comparisons_html takes Comparison objects, got {type(c).__name__}"
            )
    slower = [f"{c.name}: {c.describe()}" for c in items if c.verdict == "slower"]
    return html_table(
        "compared with the saved run",
        COMPARISON_HEADER,
        [c.cells() for c in items],
        warnings=slower,
    )


@dataclass(frozen=True)
class FailThreshold:
    """``stat`` slower by more than ``fraction`` (0.05: 5%) is a regression."""

    stat: str
    fraction: float


def parse_fail_threshold(text: str) -> FailThreshold:
    """``"median:5%"`` (or ``"mean:0.05"``) as a :class:`FailThreshold`;
    ``InvalidInputError`` for anything else."""
    match = re.fullmatch(r"\s*([a-z0-9]+)\s*:\s*([0-9]*\.?[0-9]+)\s*(%?)\s*", str(text))
    if not match or match.group(1) not in STATISTICS:
        raise InvalidInputError(
            f"a fail threshold is STAT:PERCENT with STAT one of {', '.join(STATISTICS)} "
            f"(e.g. median:5%), got {text!r}"
        )
    value = float(match.group(2))
    fraction = value / 100.0 if match.group(3) else value
    return FailThreshold(match.group(1), fraction)


def _as_rounds(run: Rounds, side: str) -> List[BenchmarkResult]:
    rounds = [run] if isinstance(run, BenchmarkResult) else run
    if isinstance(rounds, (str, bytes)) or not isinstance(rounds, Sequence) or not rounds:
        raise InvalidInputError(
            f"compare_runs: the {side} is a BenchmarkResult or a non-empty list of them "
            f"(one per round), got {type(run).__name__}"
        )
    for r in rounds:
        if not isinstance(r, BenchmarkResult):
            raise InvalidInputError(
                f"compare_runs: the {side}'s rounds are BenchmarkResult objects, "
                f"got {type(r).__name__}"
            )
    return list(rounds)


def _measure_of(rounds: List[BenchmarkResult], current: List[BenchmarkResult], name: str) -> None:
    # Loop samples and per-call device times are different quantities: a ratio of the two
    # would be a verdict on the measuring, not on the code.
    measures = {r.measure for r in rounds + current}
    if len(measures) > 1:
        shown = " vs ".join(sorted(repr(m) for m in measures))
        raise InvalidInputError(
            f"comparing {name!r}: the runs measure different things ({shown}); compare runs "
            "measured the same way"
        )


def _subsample(times: Sequence[float], limit: int = _MAX_SAMPLE) -> List[float]:
    if len(times) <= limit:
        return list(times)
    step = len(times) / limit
    return [times[int(i * step)] for i in range(limit)]


def _bootstrap(
    base: List[float],
    cur: List[float],
    fn: Callable[[Sequence[float]], float],
    resamples: int = _RESAMPLES,
) -> Tuple[float, float]:
    rng = random.Random(0x6B6565)  # fixed: the same two runs always give the same verdict
    ratios = []
    for _ in range(resamples):
        b = fn(rng.choices(base, k=len(base)))
        c = fn(rng.choices(cur, k=len(cur)))
        if b > 0:
            ratios.append(c / b)
    if not ratios:
        return float("nan"), float("nan")
    return _stats.percentile(ratios, 0.5), _stats.percentile(ratios, 99.5)


def _log_values(
    rounds: List[BenchmarkResult], fn: Callable[[Sequence[float]], float], stat: str, side: str
) -> List[float]:
    values = [fn(r.times_ms) for r in rounds]
    if any(not (v > 0 and math.isfinite(v)) for v in values):
        raise InvalidInputError(
            f"compare_runs: the {side}'s {stat} must be a positive time in every round, "
            f"got {values}"
        )
    return [math.log(v) for v in values]


def _set_aside(logs: List[float], side: str) -> Tuple[List[int], str]:
    """The rounds of one side to leave out of the model: those whose statistic lies more
    than :data:`ASIDE_FACTOR` from the side's median and more than :data:`ASIDE_Z` robust
    standard deviations (1.4826 MAD) from it, with at least 3 rounds on the side and at
    most a third of them left out. One process in a state no other reached (a cold cache, a
    neighbour's burst) would otherwise widen the spread to hundreds of percent, while states
    that recur (a machine that is bimodal from process to process) stay in: they are the
    spread. Returns the indices kept and the words that name those left out."""
    if len(logs) < 3:
        return list(range(len(logs))), ""
    center = _stats.median(logs)
    mad = _stats.median([abs(x - center) for x in logs]) * 1.4826
    far = [
        i
        for i, x in enumerate(logs)
        if abs(x - center) > math.log(ASIDE_FACTOR) and abs(x - center) > ASIDE_Z * mad
    ]
    if not far or len(far) > len(logs) // 3:
        return list(range(len(logs))), ""
    shown = ", ".join(f"round {i + 1} ({math.exp(logs[i] - center):.3g}x the median)" for i in far)
    return [i for i in range(len(logs)) if i not in far], f"{side} {shown} set aside"


def _pooled_std(groups: Sequence[List[float]]) -> Tuple[float, int]:
    ss, df = 0.0, 0
    for g in groups:
        m = math.fsum(g) / len(g)
        ss += math.fsum((x - m) ** 2 for x in g)
        df += len(g) - 1
    return (math.sqrt(ss / df) if df else math.nan), df


def compare_runs(
    baseline: Rounds,
    current: Rounds,
    stat: Optional[str] = None,
    same_band: Optional[float] = None,
    *,
    threshold: Optional[FailThreshold] = None,
    looks: int = 1,
) -> Comparison:
    """``current`` against ``baseline`` on ``stat`` (see :data:`STATISTICS`), with a
    verdict from the spread between processes (module docstring).

    Each side is a :class:`BenchmarkResult` (one round) or a list of them, one per fresh
    process. ``threshold``: the gate's :class:`FailThreshold`; it gives the default
    ``stat`` and ``same_band`` (its fraction). Without it: ``median`` and ±2%.
    ``looks``: the how-manieth look of a sequence this comparison is (``decide``); the
    interval widens so that all looks together keep the 1% false-alarm rate.
    ``InvalidInputError`` for an unknown statistic, a band outside [0, 1), fewer than 2
    times on a side, or rounds whose ``measure`` differs."""
    looks = check_int(looks, "looks", 1)
    if threshold is not None and not isinstance(threshold, FailThreshold):
        raise InvalidInputError(
            f"threshold must be a FailThreshold or None, got {type(threshold).__name__}"
        )
    stat = stat if stat is not None else (threshold.stat if threshold is not None else "median")
    fn = STATISTICS.get(stat)
    if fn is None:
        raise InvalidInputError(f"stat must be one of {', '.join(STATISTICS)}, got {stat!r}")
    if same_band is None:
        same_band = threshold.fraction if threshold is not None else _DEFAULT_BAND
    band = check_fraction(same_band, "same_band")
    base_rounds, cur_rounds = _as_rounds(baseline, "baseline"), _as_rounds(current, "current run")
    name = cur_rounds[0].name
    _measure_of(base_rounds, cur_rounds, name)
    base = _subsample([t for r in base_rounds for t in r.times_ms])
    cur = _subsample([t for r in cur_rounds for t in r.times_ms])
    if len(base) < 2 or len(cur) < 2:
        raise InvalidInputError(
            f"comparing {name!r} needs at least 2 times on each side, "
            f"got {len(base)} and {len(cur)}"
        )
    log_b = _log_values(base_rounds, fn, stat, "baseline")
    log_c = _log_values(cur_rounds, fn, stat, "current run")
    kept_b, aside_b = _set_aside(log_b, "baseline")
    kept_c, aside_c = _set_aside(log_c, "current")
    aside = "; ".join(t for t in (aside_b, aside_c) if t)
    if aside:
        base_rounds = [base_rounds[i] for i in kept_b]
        cur_rounds = [cur_rounds[i] for i in kept_c]
        log_b, log_c = [log_b[i] for i in kept_b], [log_c[i] for i in kept_c]
        base = _subsample([t for r in base_rounds for t in r.times_ms])
        cur = _subsample([t for r in cur_rounds for t in r.times_ms])
    mean_b, mean_c = math.fsum(log_b) / len(log_b), math.fsum(log_c) / len(log_c)
    d = mean_c - mean_b
    s, df = _pooled_std([log_b, log_c])
    if df == 0:
        spread: Optional[float] = None
        low, high, verdict = _unmeasured(base, cur, fn, d)
    else:
        half = _half_width(base, cur, fn, s, df, len(log_b), len(log_c), looks)
        low, high = math.exp(d - half), math.exp(d + half)
        spread = math.exp(half) - 1
        verdict = _measured_verdict(low, high, band)
    return Comparison(
        name,
        stat,
        math.exp(mean_b),
        math.exp(mean_c),
        math.exp(d),
        low,
        high,
        verdict,
        spread,
        len(base_rounds),
        len(cur_rounds),
        aside,
    )


def _unmeasured(
    base: List[float], cur: List[float], fn: Callable[[Sequence[float]], float], d: float
) -> Tuple[float, float, str]:
    """(low, high, verdict) with one process each: the calls say only how well each
    process knew itself, and only a change beyond :data:`UNMEASURED_FACTOR` is called."""
    boot_low, boot_high = _bootstrap(base, cur, fn)
    low, high = (boot_low, boot_high) if math.isfinite(boot_low) else (math.exp(d), math.exp(d))
    if low > UNMEASURED_FACTOR:
        return low, high, "slower"
    if high < 1 / UNMEASURED_FACTOR:
        return low, high, "faster"
    return low, high, "undecided"


def _half_width(
    base: List[float],
    cur: List[float],
    fn: Callable[[Sequence[float]], float],
    s: float,
    df: int,
    rounds_b: int,
    rounds_c: int,
    looks: int,
) -> float:
    """The interval's half width in log units: Student's t over the rounds, never
    narrower than what resampling the calls gives. Each look of a sequence (decide)
    spends its share of the 1% (Bonferroni), so that drawing rounds until decided does
    not raise the false-alarm rate."""
    half = _t_quantile(df, _TAIL / looks) * s * math.sqrt(1 / rounds_b + 1 / rounds_c)
    boot_low, boot_high = _bootstrap(
        _subsample(base, _FLOOR_MAX_SAMPLE),
        _subsample(cur, _FLOOR_MAX_SAMPLE),
        fn,
        _FLOOR_RESAMPLES,
    )
    if math.isfinite(boot_low) and boot_low > 0:
        half = max(half, math.log(boot_high / boot_low) / 2)
    return half


def _measured_verdict(low: float, high: float, band: float) -> str:
    if low > 1.0:
        return "slower"
    if high < 1.0:
        return "faster"
    if low >= 1.0 - band and high <= 1.0 + band:
        return "same"
    return "undecided"


def regression(comparison: Comparison, threshold: Optional[FailThreshold]) -> bool:
    """Whether ``comparison`` is a real regression past ``threshold``: slower beyond the
    spread between processes and by more than the threshold on its statistic. None:
    nothing fails."""
    if threshold is None or comparison.stat != threshold.stat:
        return False
    return comparison.verdict == "slower" and comparison.change > threshold.fraction


def needs_more_rounds(comparison: Comparison, threshold: Optional[FailThreshold]) -> bool:
    """Whether one round's ``comparison`` is left to fresh rounds before the gate decides:
    a regression past ``threshold`` (one process may have landed in a state the baseline
    never saw), or undecided with a change past it."""
    if threshold is None or comparison.stat != threshold.stat:
        return False
    if regression(comparison, threshold):
        return True
    return comparison.verdict == "undecided" and comparison.change > threshold.fraction


def decide(
    baseline: Rounds,
    first: BenchmarkResult,
    more: Iterable[BenchmarkResult],
    threshold: Optional[FailThreshold],
    limit: int,
) -> Comparison:
    """The gate's verdict on ``first`` (one current round) against ``baseline``: when
    :func:`needs_more_rounds` says so, takes up to ``limit`` further rounds from ``more``
    (fresh processes, drawn only when needed), comparing over all current rounds after
    each and stopping once the verdict is not undecided."""
    rounds = [first]
    comparison = compare_runs(baseline, rounds, threshold=threshold)
    if limit <= 0 or not needs_more_rounds(comparison, threshold):
        return comparison
    for taken, result in enumerate(more, start=1):
        rounds.append(result)
        comparison = compare_runs(baseline, rounds, threshold=threshold, looks=limit + 1)
        if comparison.verdict != "undecided" or taken >= limit:
            break
    return comparison

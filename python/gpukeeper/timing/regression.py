"""Two runs of one benchmark, compared with their noise: faster, slower, same or undecided.

A run is a :class:`BenchmarkResult`; the comparison is of one statistic (``median`` by
default) of its per-call times. The uncertainty is a bootstrap: both runs' calls are
resampled (with a fixed seed, so a comparison reads the same every time), the ratio
current / baseline is taken for each resample, and its 2.5th and 97.5th percentiles
bound the change. Then:

- ``same``: the whole interval lies within ``same_band`` of 1 (±2% by default): runs of
  the same code differ that much from one process to the next;
- ``slower`` / ``faster``: otherwise, the whole interval lies above / below 1;
- ``undecided``: the interval holds 1 and is wider than the band: the runs are too
  noisy, or too short, to tell.

:func:`regression` says whether a comparison is a real regression past a threshold:
slower, and by more than the threshold. A difference inside the noise fails nothing.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from gpukeeper.errors import InvalidInputError
from gpukeeper.htmltable import html_table
from gpukeeper.timing import stats as _stats
from gpukeeper.timing.result import BenchmarkResult

__all__ = [
    "COMPARISON_HEADER",
    "STATISTICS",
    "Comparison",
    "FailThreshold",
    "compare_runs",
    "comparisons_html",
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

_RESAMPLES = 1000
_MAX_SAMPLE = 2000  # calls per run used by the bootstrap (an even subsample beyond)


@dataclass(frozen=True)
class Comparison:
    """One benchmark against its baseline: ``ratio`` = current / baseline of ``stat``
    (above 1: slower), with its 95% bootstrap interval ``ratio_low``..``ratio_high``."""

    name: str
    stat: str
    baseline_ms: float
    current_ms: float
    ratio: float
    ratio_low: float
    ratio_high: float
    verdict: str  # "faster", "slower", "same" or "undecided"

    @property
    def change(self) -> float:
        """Relative change of the statistic: +0.05 is 5% slower."""
        return self.ratio - 1.0

    def describe(self) -> str:
        """One line: ``slower: median 2.013 ms vs 1.001 ms, +101.1% (95% CI +98.0..+104.2%)``."""
        return (f"{self.verdict}: {self.stat} {self.current_ms:.4g} ms vs {self.baseline_ms:.4g} ms, "
                f"{self.change:+.1%} (95% CI {self.ratio_low - 1:+.1%}..{self.ratio_high - 1:+.1%})")

    def cells(self) -> Tuple[str, str, str, str, str, str, str]:
        """The comparison as the cells of one table row, in the order of
        :data:`COMPARISON_HEADER`."""
        return (self.name, self.stat, f"{self.baseline_ms:.4g}", f"{self.current_ms:.4g}",
                f"{self.change:+.1%}", f"{self.ratio_low - 1:+.1%}..{self.ratio_high - 1:+.1%}",
                self.verdict)

    def _repr_html_(self) -> str:
        """The comparison as a one-row HTML table, for Jupyter."""
        return comparisons_html([self])


#: The header of a table of :class:`Comparison` rows (``Comparison.cells``).
COMPARISON_HEADER = ("benchmark", "stat", "saved ms", "now ms", "change", "95% CI", "verdict")


def comparisons_html(comparisons: Iterable[Comparison]) -> str:
    """Saved-versus-new comparisons as one compact HTML table, one row each; a slower
    verdict is repeated under the table as a warning."""
    items = list(comparisons)
    for c in items:
        if not isinstance(c, Comparison):
            raise InvalidInputError(f"comparisons_html takes Comparison objects, got {type(c).__name__}")
    slower = [f"{c.name}: {c.describe()}" for c in items if c.verdict == "slower"]
    return html_table("compared with the saved run", COMPARISON_HEADER, [c.cells() for c in items],
                      warnings=slower)


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
            f"(e.g. median:5%), got {text!r}")
    value = float(match.group(2))
    fraction = value / 100.0 if match.group(3) else value
    return FailThreshold(match.group(1), fraction)


def _subsample(times: Sequence[float]) -> List[float]:
    if len(times) <= _MAX_SAMPLE:
        return list(times)
    step = len(times) / _MAX_SAMPLE
    return [times[int(i * step)] for i in range(_MAX_SAMPLE)]


def _interval(base: List[float], cur: List[float], fn: Callable[[Sequence[float]], float]
              ) -> Tuple[float, float]:
    rng = random.Random(0x6B6565)  # fixed: the same two runs always give the same verdict
    ratios = []
    for _ in range(_RESAMPLES):
        b = fn(rng.choices(base, k=len(base)))
        c = fn(rng.choices(cur, k=len(cur)))
        if b > 0:
            ratios.append(c / b)
    if not ratios:
        return float("nan"), float("nan")
    return _stats.percentile(ratios, 2.5), _stats.percentile(ratios, 97.5)


def compare_runs(baseline: BenchmarkResult, current: BenchmarkResult, stat: str = "median",
                 same_band: float = 0.02) -> Comparison:
    """``current`` against ``baseline`` on ``stat`` (see :data:`STATISTICS`), with a
    verdict that accounts for both runs' noise (module docstring)."""
    fn = STATISTICS.get(stat)
    if fn is None:
        raise InvalidInputError(f"stat must be one of {', '.join(STATISTICS)}, got {stat!r}")
    if not 0 <= same_band < 1:
        raise InvalidInputError(f"same_band must be in [0, 1), got {same_band!r}")
    base, cur = _subsample(baseline.times_ms), _subsample(current.times_ms)
    if len(base) < 2 or len(cur) < 2:
        raise InvalidInputError(
            f"comparing {current.name!r} needs at least 2 calls in each run, "
            f"got {len(base)} and {len(cur)}")
    b_value, c_value = fn(base), fn(cur)
    ratio = c_value / b_value if b_value > 0 else float("inf")
    low, high = _interval(base, cur, fn)
    # "same" first: two runs of the same code differ by a percent or two from one process
    # to the next (clocks, placement), a drift no resampling of one run can see.
    if low >= 1.0 - same_band and high <= 1.0 + same_band:
        verdict = "same"
    elif low > 1.0:
        verdict = "slower"
    elif high < 1.0:
        verdict = "faster"
    else:
        verdict = "undecided"
    return Comparison(current.name, stat, b_value, c_value, ratio, low, high, verdict)


def regression(comparison: Comparison, threshold: Optional[FailThreshold]) -> bool:
    """Whether ``comparison`` is a real regression past ``threshold``: slower beyond the
    noise and by more than the threshold on its statistic. None: nothing fails."""
    if threshold is None or comparison.stat != threshold.stat:
        return False
    return comparison.verdict == "slower" and comparison.change > threshold.fraction

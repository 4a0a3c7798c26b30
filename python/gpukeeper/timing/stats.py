"""Statistics of timing samples: pure functions on a sequence of floats.

No numpy needed (the package has no dependencies); the results match numpy's defaults:
``percentile`` interpolates linearly between the two closest ranks (numpy's
``method="linear"``), ``std`` is the *sample* standard deviation (``ddof=1``).

Two measures of noise are provided, because they answer different questions:

- ``relative_std(x) = std(x) / mean(x)``: what nvbench calls "noise". Sensitive to
  outliers on purpose: one slow call in a hundred (a page fault, a clock change) shows up.
  It is the quantity the stopping criterion (``NoiseCriterion``) watches, as in nvbench.
- ``relative_iqr(x) = IQR(x) / median(x)``: robust; says how wide the bulk of the
  distribution is. Used to decide whether two implementations differ by more than the
  noise (``print_comparison_table``).

Both are fractions (0.01 = 1 %) and are ``nan`` where undefined (fewer than two samples
for the std, a zero mean or median); ``json_safe`` turns such a ``nan`` into None for JSON.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, Iterable, List, Sequence

from gpukeeper.base.arg_checks import check_int
from gpukeeper.base.errors import InvalidInputError

__all__ = [
    "mean",
    "median",
    "std",
    "minimum",
    "maximum",
    "percentile",
    "iqr",
    "relative_std",
    "relative_iqr",
    "summarize",
    "json_safe",
    "SampleStats",
    "NoiseCriterion",
    "PERCENTILES",
]

#: The percentiles every summary carries.
PERCENTILES = (5, 25, 75, 95, 99)


def _values(samples: Iterable[float]) -> List[float]:
    """The samples as a list of floats; an empty or non-finite input is a typed error."""
    try:
        values = [float(v) for v in samples]
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"timing samples must be numbers: {exc}") from None
    if not values:
        raise InvalidInputError("timing statistics need at least one sample, got none")
    for v in values:
        if math.isnan(v) or math.isinf(v):
            raise InvalidInputError(f"timing samples must be finite, got {v!r}")
    return values


def mean(samples: Iterable[float]) -> float:
    """Arithmetic mean (``math.fsum``, so long runs of tiny values do not lose digits)."""
    values = _values(samples)
    return math.fsum(values) / len(values)


def median(samples: Iterable[float]) -> float:
    """Median: the mean of the two middle values for an even count (as numpy)."""
    return percentile(samples, 50.0)


def std(samples: Iterable[float], ddof: int = 1) -> float:
    """Standard deviation with ``ddof`` degrees of freedom removed (default: sample std).

    ``nan`` when there are not more samples than ``ddof`` (numpy gives nan plus a warning).
    """
    values = _values(samples)
    n = len(values)
    if n - ddof <= 0:
        return math.nan
    m = math.fsum(values) / n
    # Two-pass formula: the one-pass sum-of-squares loses everything for tightly
    # clustered timings (1000.001, 1000.002, ...).
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - ddof))


def minimum(samples: Iterable[float]) -> float:
    """Smallest sample."""
    return min(_values(samples))


def maximum(samples: Iterable[float]) -> float:
    """Largest sample."""
    return max(_values(samples))


def _percentile_sorted(ordered: Sequence[float], q: float) -> float:
    # numpy "linear": the value at fractional rank (n - 1) * q / 100.
    rank = (len(ordered) - 1) * (q / 100.0)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    frac = rank - low
    return ordered[low] + (ordered[high] - ordered[low]) * frac


def percentile(samples: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0 <= q <= 100), linear interpolation as numpy's default."""
    if not isinstance(q, (int, float)) or not 0.0 <= float(q) <= 100.0:
        raise InvalidInputError(f"percentile q must be in [0, 100], got {q!r}")
    return _percentile_sorted(sorted(_values(samples)), float(q))


def iqr(samples: Iterable[float]) -> float:
    """Interquartile range: ``p75 - p25``."""
    ordered = sorted(_values(samples))
    return _percentile_sorted(ordered, 75.0) - _percentile_sorted(ordered, 25.0)


def relative_std(samples: Iterable[float]) -> float:
    """``std / mean`` (nvbench's "noise"); ``nan`` for one sample or a zero mean."""
    values = _values(samples)
    m = mean(values)
    return std(values) / m if m != 0 else math.nan


def relative_iqr(samples: Iterable[float]) -> float:
    """``IQR / median`` (robust noise); ``nan`` for a zero median."""
    values = _values(samples)
    med = median(values)
    return iqr(values) / med if med != 0 else math.nan


def json_safe(d: Dict[str, Any]) -> Dict[str, Any]:
    """``d`` with NaN floats as None (NaN is not JSON)."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


@dataclass(frozen=True)
class SampleStats:
    """Every summary statistic of one set of samples (same unit as the samples)."""

    count: int
    mean: float
    median: float
    std: float
    min: float
    max: float
    p5: float
    p25: float
    p75: float
    p95: float
    p99: float
    iqr: float
    relative_std: float
    relative_iqr: float

    def to_dict(self) -> Dict[str, float]:
        """The fields as a plain dict."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def summarize(samples: Iterable[float]) -> SampleStats:
    """All statistics in one pass over one sorted copy (cheaper than calling each)."""
    values = _values(samples)
    ordered = sorted(values)
    m = math.fsum(values) / len(values)
    s = std(values)
    p = {q: _percentile_sorted(ordered, q) for q in (5, 25, 50, 75, 95, 99)}
    spread = p[75] - p[25]
    return SampleStats(
        count=len(values),
        mean=m,
        median=p[50],
        std=s,
        min=ordered[0],
        max=ordered[-1],
        p5=p[5],
        p25=p[25],
        p75=p[75],
        p95=p[95],
        p99=p[99],
        iqr=spread,
        relative_std=s / m if m != 0 else math.nan,
        relative_iqr=spread / p[50] if p[50] != 0 else math.nan,
    )


class NoiseCriterion:
    """nvbench's "stdrel" stopping criterion: stop when the timings are quiet enough.

    Feed one sample at a time with ``add(x)``; ``is_finished()`` says whether measuring
    may stop. It is finished when, with at least ``min_samples`` samples and at least
    ``min_time`` of summed sample time:

    1. the relative std (``std / mean``) is at most ``max_noise`` — the run is quiet; or
    2. the relative std has *converged* above ``max_noise``: over the last ``window``
       values of the noise itself, its relative spread is below ``converge_tol`` and its
       slope per sample (relative to its mean) is below ``converge_tol / window``. More
       samples would not make the estimate quieter, only the run longer; ``converged``
       is then True so that a caller can report the run as noisy.

    Running mean and variance are kept with Welford's update, so each ``add`` is O(1).
    """

    def __init__(
        self,
        max_noise: float,
        min_samples: int = 10,
        min_time: float = 0.0,
        window: int = 64,
        converge_tol: float = 0.05,
    ) -> None:
        if not isinstance(max_noise, (int, float)) or not max_noise > 0 or math.isinf(max_noise):
            raise InvalidInputError(
                f"max_noise must be a positive fraction (0.005 = 0.5 %), got {max_noise!r}"
            )
        check_int(min_samples, "min_samples", 2)
        check_int(window, "window", 4)
        self.max_noise = float(max_noise)
        self.min_samples = min_samples
        self.min_time = float(min_time)
        self.window = window
        self.converge_tol = float(converge_tol)
        self.count = 0
        self.total = 0.0
        self._mean = 0.0
        self._m2 = 0.0
        self._history: Deque[float] = deque(maxlen=window)
        self.converged = False

    def add(self, sample: float) -> None:
        """Adds one sample (any unit, the same for all)."""
        self.count += 1
        self.total += sample
        delta = sample - self._mean
        self._mean += delta / self.count
        self._m2 += delta * (sample - self._mean)
        noise = self.noise
        if not math.isnan(noise):
            self._history.append(noise)

    @property
    def noise(self) -> float:
        """Current ``std / mean`` of all samples added; ``nan`` below two samples."""
        if self.count < 2 or self._mean == 0:
            return math.nan
        return math.sqrt(self._m2 / (self.count - 1)) / self._mean

    def is_finished(self) -> bool:
        """True when measuring may stop (see the class docstring)."""
        if self.count < self.min_samples or self.total < self.min_time:
            return False
        noise = self.noise
        if not math.isnan(noise) and noise <= self.max_noise:
            return True
        self.converged = self._noise_converged()
        return self.converged

    def _noise_converged(self) -> bool:
        history = list(self._history)
        if len(history) < self.window:
            return False
        m = math.fsum(history) / len(history)
        if m <= 0:
            return False
        spread = std(history) / m
        # Least-squares slope of the noise against the sample index.
        n = len(history)
        xm = (n - 1) / 2.0
        sxx = math.fsum((i - xm) ** 2 for i in range(n))
        slope = math.fsum((i - xm) * (h - m) for i, h in enumerate(history)) / sxx
        return spread < self.converge_tol and abs(slope) / m < self.converge_tol / n

"""Statistics of a per-step latency series: ``SampleStats`` with jitter, drift and outliers.

A series in step order says more than a set of samples: how unsteady successive steps
are (jitter), whether the run slows down (drift), and which steps stand out (outliers).
:class:`LatencyStats` holds :func:`gpukeeper.timing.stats.summarize`'s ``SampleStats``
of the series (so a mean, a percentile or a std means what it means in
``benchmark_function``) and those three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Sequence, Tuple

from gpukeeper.base.errors import InvalidInputError
from gpukeeper.timing import stats
from gpukeeper.timing.stats import SampleStats

__all__ = ["LatencyStats", "latency_stats"]


@dataclass(frozen=True)
class LatencyStats:
    """Statistics of one per-step series, in milliseconds.

    ``sample``: the series' :class:`~gpukeeper.timing.stats.SampleStats`, also read as
    ``n``, ``mean_ms``, ``median_ms``, ``std_ms`` (the sample standard deviation,
    ``ddof=1``; ``nan`` for one step), ``min_ms``, ``max_ms`` and ``p5_ms`` to ``p99_ms``
    (linear interpolation). ``jitter_ms``: the sample standard deviation of successive
    differences (``nan`` below three steps); ``drift_ms``: the median of the last decile
    minus that of the first; outliers lie above
    ``median + k * max(1.4826 * MAD, 1% of the median)``.
    """

    sample: SampleStats
    jitter_ms: float
    drift_ms: float
    drift_pct: float
    mad_ms: float
    outlier_threshold_ms: float
    outlier_steps: Tuple[int, ...]

    @property
    def n(self) -> int:
        """Steps in the series."""
        return self.sample.count

    @property
    def mean_ms(self) -> float:
        return self.sample.mean

    @property
    def median_ms(self) -> float:
        return self.sample.median

    @property
    def std_ms(self) -> float:
        return self.sample.std

    @property
    def min_ms(self) -> float:
        return self.sample.min

    @property
    def max_ms(self) -> float:
        return self.sample.max

    @property
    def p5_ms(self) -> float:
        return self.sample.p5

    @property
    def p95_ms(self) -> float:
        return self.sample.p95

    @property
    def p99_ms(self) -> float:
        return self.sample.p99

    def to_dict(self) -> Dict[str, Any]:
        """The figures as plain values (NaN as None), under the names they have always had."""
        d: Dict[str, Any] = {
            "n": self.n,
            "mean_ms": self.mean_ms,
            "median_ms": self.median_ms,
            "std_ms": self.std_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "p5_ms": self.p5_ms,
            "p95_ms": self.p95_ms,
            "p99_ms": self.p99_ms,
            "jitter_ms": self.jitter_ms,
            "drift_ms": self.drift_ms,
            "drift_pct": self.drift_pct,
            "mad_ms": self.mad_ms,
            "outlier_threshold_ms": self.outlier_threshold_ms,
            "outlier_steps": list(self.outlier_steps),
        }
        return stats.json_safe(d)


def latency_stats(x_ms: Sequence[float], outlier_k: float = 5.0) -> LatencyStats:
    """Statistics of a per-step series (see :class:`LatencyStats` for each definition).

    Raises ``InvalidInputError`` for an empty series.
    """
    n = len(x_ms)
    if n == 0:
        raise InvalidInputError("latency_stats: empty series")
    s = stats.summarize(x_ms)
    median = s.median
    jitter = stats.std([x_ms[i + 1] - x_ms[i] for i in range(n - 1)]) if n >= 2 else math.nan
    decile = max(1, n // 10)
    first = stats.median(x_ms[:decile])
    last = stats.median(x_ms[n - decile :])
    drift = last - first
    drift_pct = 100.0 * drift / first if first > 0 else math.nan
    mad = stats.median([abs(v - median) for v in x_ms])
    scale = max(1.4826 * mad, 0.01 * abs(median))
    threshold = median + outlier_k * scale
    outliers = tuple(i for i, v in enumerate(x_ms) if v > threshold)
    return LatencyStats(
        sample=s,
        jitter_ms=jitter,
        drift_ms=drift,
        drift_pct=drift_pct,
        mad_ms=mad,
        outlier_threshold_ms=threshold,
        outlier_steps=outliers,
    )

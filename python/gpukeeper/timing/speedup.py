"""A speedup against the baseline, as the comparison table and its picture write it."""

from __future__ import annotations

import math
from typing import Optional

from gpukeeper.timing.benchmark_result import BenchmarkResult

__all__ = ["speedup_label", "within_noise"]


def within_noise(a: BenchmarkResult, b: BenchmarkResult) -> bool:
    """True when the interquartile ranges [p25, p75] of ``a`` and ``b`` overlap."""
    return a.p25_ms <= b.p75_ms and b.p25_ms <= a.p75_ms


def speedup_label(result: BenchmarkResult, baseline: Optional[BenchmarkResult] = None) -> str:
    """``result``'s speedup against ``baseline`` as the comparison table writes it:
    ``"1.00x (baseline)"`` when ``baseline`` is None (``result`` is the baseline), else
    ``"2.31x"`` (``result.speedup`` when set, else baseline median / its median), with
    ``~`` in front when ``within_noise``."""
    if baseline is None:
        return "1.00x (baseline)"
    speedup = (
        result.speedup
        if result.speedup is not None
        else (baseline.median_ms / result.median_ms if result.median_ms > 0 else math.inf)
    )
    mark = "~" if within_noise(baseline, result) else ""
    return f"{mark}{speedup:.2f}x"

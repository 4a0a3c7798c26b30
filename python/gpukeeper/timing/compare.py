"""Implementations side by side: ``compare_implementations`` and the comparison table.

``compare_implementations`` benchmarks each one (speedups against the first);
``format_comparison_table`` / ``print_comparison_table`` show them, marking with ``~`` a
speedup that ``within_noise`` finds inside the noise.
"""

from __future__ import annotations

import io
import math
import sys
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, TextIO, Union

from gpukeeper.errors import InvalidInputError
from gpukeeper.timing.benchmark import benchmark_function
from gpukeeper.timing.result import BenchmarkResult

__all__ = [
    "compare_implementations",
    "format_comparison_table",
    "print_comparison_table",
    "within_noise",
]


def compare_implementations(
    impls: Mapping[str, Callable[..., Any]], *args: Any, **kwargs: Any
) -> Dict[str, BenchmarkResult]:
    """Benchmarks each implementation with the same arguments, in order.

    ``kwargs`` are those of ``benchmark_function`` (``n_calls``, ``warmup``, ``device``,
    ``l2_flush``, ``min_time_s``, ``max_noise``) plus keyword arguments for the
    implementations. Returns ``{name: BenchmarkResult}`` in the order given, each with
    ``speedup`` = baseline median / its median (the first implementation is the
    baseline; medians, because one slow outlier call should not decide a speedup).
    """
    if not isinstance(impls, Mapping) or not impls:
        raise InvalidInputError("impls must be a non-empty dict of name -> callable")
    if "name" in kwargs:
        raise InvalidInputError("compare_implementations names results by the keys of impls; do not pass name=")
    for key, fn in impls.items():
        if not isinstance(key, str):
            raise InvalidInputError(f"implementation names must be strings, got {key!r}")
        if not callable(fn):
            raise InvalidInputError(f"implementation {key!r} is not callable ({type(fn).__name__})")
    results: Dict[str, BenchmarkResult] = {}
    for key, fn in impls.items():
        results[key] = benchmark_function(fn, *args, name=key, **kwargs)
    baseline = next(iter(results.values())).median_ms
    for result in results.values():
        result.speedup = baseline / result.median_ms if result.median_ms > 0 else math.inf
    return results


def within_noise(a: BenchmarkResult, b: BenchmarkResult) -> bool:
    """True when the interquartile ranges [p25, p75] of ``a`` and ``b`` overlap."""
    return a.p25_ms <= b.p75_ms and b.p25_ms <= a.p75_ms


def format_comparison_table(
    results: Union[Mapping[str, BenchmarkResult], Sequence[BenchmarkResult]]
) -> str:
    """The table ``print_comparison_table`` prints, as a string."""
    if isinstance(results, Mapping):
        rows = list(results.items())
    elif isinstance(results, (list, tuple)):
        rows = [(r.name, r) for r in results]
    else:
        raise InvalidInputError(f"results must be a dict or list of BenchmarkResult, got {type(results).__name__}")
    if not rows:
        raise InvalidInputError("no results to compare")
    for key, r in rows:
        if not isinstance(r, BenchmarkResult):
            raise InvalidInputError(f"result {key!r} is not a BenchmarkResult ({type(r).__name__})")
    baseline = rows[0][1]
    header = ["Implementation", "Median ms", "Mean ms", "Std ms", "P95 ms", "P99 ms", "Calls/s", "Speedup"]
    body: List[List[str]] = []
    any_close = False
    for i, (key, r) in enumerate(rows):
        speedup = r.speedup if r.speedup is not None else (
            baseline.median_ms / r.median_ms if r.median_ms > 0 else math.inf
        )
        mark = ""
        if i > 0 and within_noise(baseline, r):
            mark = "~"
            any_close = True
        flags = "".join([" (noisy)" if r.noisy else "", " (throttled)" if r.throttled else ""])
        body.append([
            f"{key}{flags}",
            f"{r.median_ms:.4f}",
            f"{r.mean_ms:.4f}",
            f"{r.std_ms:.4f}" if not math.isnan(r.std_ms) else "n/a",
            f"{r.p95_ms:.4f}",
            f"{r.p99_ms:.4f}",
            f"{r.calls_per_s:,.1f}",
            f"{mark}{speedup:.2f}x" if i > 0 else "1.00x (baseline)",
        ])
    widths = [max(len(h), *(len(row[c]) for row in body)) for c, h in enumerate(header)]

    def line(cells: Iterable[str]) -> str:
        out = []
        for c, cell in enumerate(cells):
            out.append(cell.ljust(widths[c]) if c == 0 else cell.rjust(widths[c]))
        return "  ".join(out).rstrip()

    out = io.StringIO()
    out.write(line(header) + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for row in body:
        out.write(line(row) + "\n")
    if any_close:
        out.write("~ : within the noise (interquartile ranges overlap with the baseline's)\n")
    return out.getvalue()


def print_comparison_table(
    results: Union[Mapping[str, BenchmarkResult], Sequence[BenchmarkResult]],
    file: Optional[TextIO] = None,
) -> str:
    """Prints one row per result (median, mean, std, p95, p99, calls/s, speedup against
    the first) to ``file`` (stdout by default) and returns the text. A speedup marked
    ``~`` is within the noise: the IQRs of that result and the baseline overlap."""
    text = format_comparison_table(results)
    print(text, end="", file=file if file is not None else sys.stdout)
    return text

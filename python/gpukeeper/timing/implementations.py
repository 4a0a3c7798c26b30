"""Implementations side by side: ``compare_implementations`` and the comparison table.

``compare_implementations`` benchmarks each one (speedups against the first) and returns
an ``ImplementationComparison``: a dict of name -> ``BenchmarkResult`` that also shows
itself as a table (``table()``, ``_repr_html_`` in a notebook) and a figure (``plot()``).
``format_comparison_table`` / ``print_comparison_table`` show any such results, marking
with ``~`` a speedup that ``within_noise`` finds inside the noise.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TextIO, Tuple, Union

from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.html_table import html_table
from gpukeeper.base.plotting import PathLike
from gpukeeper.base.text_table import text_table
from gpukeeper.timing.benchmark import benchmark_function
from gpukeeper.timing.benchmark_result import BenchmarkResult
from gpukeeper.timing.comparison_plot import plot_comparison
from gpukeeper.timing.speedup import speedup_label, within_noise

__all__ = [
    "ImplementationComparison",
    "compare_implementations",
    "format_comparison_table",
    "print_comparison_table",
    "speedup_label",
    "within_noise",
]

_NOISE_NOTE = "~ : within the noise (interquartile ranges overlap with the baseline's)"


class ImplementationComparison(Dict[str, BenchmarkResult]):
    """What ``compare_implementations`` returns: a plain dict of name ->
    ``BenchmarkResult`` in the order given (the first is the baseline), which also
    shows itself: ``table()`` as text, ``_repr_html_()`` in a notebook, ``plot()`` as a
    matplotlib Figure."""

    def table(self) -> str:
        """The comparison table as text (``format_comparison_table``)."""
        return format_comparison_table(self)

    def _repr_html_(self) -> str:
        header, body, any_close = _table_rows(self)
        return html_table(
            f"{len(body)} implementations compared",
            header,
            body,
            notes=[_NOISE_NOTE] if any_close else [],
        )

    def plot(self, path: Optional[PathLike] = None) -> Any:
        """One bar per implementation (median, whiskers p25 to p75) with its speedup
        against the first, as a matplotlib Figure; saved to ``path`` when given.

        Raises ``ImportError`` naming the fix when matplotlib is not installed.
        """
        return plot_comparison(self, path)


def compare_implementations(
    impls: Mapping[str, Callable[..., Any]], *args: Any, **kwargs: Any
) -> ImplementationComparison:
    """Benchmarks each implementation with the same arguments, in order.

    ``kwargs`` are those of ``benchmark_function`` (``n_calls``, ``warmup``, ``device``,
    ``l2_flush``, ``min_time_s``, ``max_noise``) plus keyword arguments for the
    implementations, and ``measure``. Returns ``{name: BenchmarkResult}`` in the order
    given (an :class:`ImplementationComparison`, a dict), each with ``speedup`` =
    baseline median / its median (the first implementation is the baseline; medians,
    because one slow outlier call should not decide a speedup). The medians are of the
    loop time, the time per call a loop of calls sees, so an eager step and its CUDA
    graph compare as a training or MD loop will find them; ``measure="device"`` compares
    the device time instead (the GPU work alone, as if launches were free).
    """
    if not isinstance(impls, Mapping) or not impls:
        raise InvalidInputError("impls must be a non-empty dict of name -> callable")
    if "name" in kwargs:
        raise InvalidInputError(
            "compare_implementations names results by the keys of impls; do not pass name="
        )
    for key, fn in impls.items():
        if not isinstance(key, str):
            raise InvalidInputError(f"implementation names must be strings, got {key!r}")
        if not callable(fn):
            raise InvalidInputError(f"implementation {key!r} is not callable ({type(fn).__name__})")
    results = ImplementationComparison()
    for key, fn in impls.items():
        results[key] = benchmark_function(fn, *args, name=key, **kwargs)
    baseline = next(iter(results.values())).median_ms
    for result in results.values():
        result.speedup = baseline / result.median_ms if result.median_ms > 0 else math.inf
    return results


def _result_pairs(
    results: Union[Mapping[str, BenchmarkResult], Sequence[BenchmarkResult]],
) -> List[Tuple[str, BenchmarkResult]]:
    if isinstance(results, Mapping):
        rows = list(results.items())
    elif isinstance(results, (list, tuple)):
        rows = [(r.name, r) for r in results]
    else:
        raise InvalidInputError(
            f"results must be a dict or list of BenchmarkResult, got {type(results).__name__}"
        )
    if not rows:
        raise InvalidInputError("no results to compare")
    for key, r in rows:
        if not isinstance(r, BenchmarkResult):
            raise InvalidInputError(f"result {key!r} is not a BenchmarkResult ({type(r).__name__})")
    measures = {r.measure for _, r in rows}
    if len(measures) > 1:
        raise InvalidInputError(
            "these results time different things ("
            + ", ".join(f"{k}: {r.measure} time" for k, r in rows)
            + "); benchmark them with the same measure= to compare them"
        )
    return rows


def _other_median(r: BenchmarkResult) -> str:
    """The median of the time the headline is not of (n/a where there is none)."""
    value = r.device_median_ms if r.measure == "loop" else r.loop_median_ms
    return "n/a" if value is None else f"{value:.4f}"


def _table_rows(
    results: Union[Mapping[str, BenchmarkResult], Sequence[BenchmarkResult]],
) -> Tuple[List[str], List[List[str]], bool]:
    """The comparison's header, one row of cells per result, and whether any speedup
    is within the noise: the text table and the HTML one show the same cells."""
    rows = _result_pairs(results)
    baseline = rows[0][1]
    headline, other = ("Loop", "Device") if baseline.measure == "loop" else ("Device", "Loop")
    header = [
        "Implementation",
        f"{headline} median ms",
        "Mean ms",
        "Std ms",
        "P95 ms",
        "P99 ms",
        f"{other} median ms",
        "Bound",
        "Calls/s",
        "Speedup",
    ]
    body: List[List[str]] = []
    for i, (key, r) in enumerate(rows):
        flags = "".join([" (noisy)" if r.noisy else "", " (throttled)" if r.throttled else ""])
        body.append(
            [
                f"{key}{flags}",
                f"{r.median_ms:.4f}",
                f"{r.mean_ms:.4f}",
                f"{r.std_ms:.4f}" if not math.isnan(r.std_ms) else "n/a",
                f"{r.p95_ms:.4f}",
                f"{r.p99_ms:.4f}",
                _other_median(r),
                r.bound or "n/a",
                f"{r.calls_per_s:,.1f}",
                speedup_label(r, baseline if i > 0 else None),
            ]
        )
    any_close = any(row[-1].startswith("~") for row in body)
    return header, body, any_close


def format_comparison_table(
    results: Union[Mapping[str, BenchmarkResult], Sequence[BenchmarkResult]],
) -> str:
    """The table ``print_comparison_table`` prints, as a string."""
    header, body, any_close = _table_rows(results)
    text = text_table(header, body)
    return text + _NOISE_NOTE + "\n" if any_close else text


def print_comparison_table(
    results: Union[Mapping[str, BenchmarkResult], Sequence[BenchmarkResult]],
    file: Optional[TextIO] = None,
) -> str:
    """Prints one row per result (the headline median, mean, std, p95, p99, the median of
    the other time, what bounds the call, calls/s, speedup against the first) to
    ``file`` (stdout by default) and returns the text. A speedup marked ``~`` is within
    the noise: the IQRs of that result and the baseline overlap. Results that time
    different things (loop and device time) raise ``InvalidInputError``."""
    text = format_comparison_table(results)
    print(text, end="", file=file if file is not None else sys.stdout)
    return PrintedText(text)


class PrintedText(str):
    """Text that was printed already: a ``str`` in every way, which a notebook does not
    show again as the cell's value."""

    def _ipython_display_(self) -> None:
        pass

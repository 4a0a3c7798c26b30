"""The picture of implementations side by side, one bar each with its speedup: ``plot_comparison``.

matplotlib is imported only when a picture is drawn (:mod:`gpukeeper.base.plotting`).
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Tuple

from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.plotting import PathLike, finish, pyplot
from gpukeeper.timing.benchmark_result import BenchmarkResult
from gpukeeper.timing.speedup import speedup_label

__all__ = ["plot_comparison"]


def _bars(results: Mapping[str, BenchmarkResult]) -> List[Tuple[str, BenchmarkResult, str]]:
    """Each implementation with its speedup label against the first, as the comparison
    table writes it (``~``: within the noise)."""
    if not isinstance(results, Mapping):
        raise InvalidInputError(
            f"results must be a dict of name -> BenchmarkResult, got {type(results).__name__}"
        )
    items = list(results.items())
    if not items:
        raise InvalidInputError("no results to plot")
    for key, r in items:
        if not isinstance(r, BenchmarkResult):
            raise InvalidInputError(f"result {key!r} is not a BenchmarkResult ({type(r).__name__})")
    base = items[0][1]
    return [(key, r, speedup_label(r, base if i > 0 else None)) for i, (key, r) in enumerate(items)]


def plot_comparison(results: Mapping[str, BenchmarkResult], path: Optional[PathLike] = None) -> Any:
    """Implementations side by side: one horizontal bar per implementation (its median),
    whiskers from p25 to p75, and its speedup against the first written at the bar's end
    (``~``: within the noise). Returns a matplotlib Figure, saved to ``path`` when given.

    Raises ``InvalidInputError`` for no results or a value that is not a
    ``BenchmarkResult``, ``ImportError`` naming the fix when matplotlib is missing.
    """
    bars = _bars(results)
    plt = pyplot(path, "ImplementationComparison.plot()")
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * len(bars)), constrained_layout=True)
    ys = list(range(len(bars)))
    medians = [r.median_ms for _, r, _ in bars]
    low = [r.median_ms - r.p25_ms for _, r, _ in bars]
    high = [r.p75_ms - r.median_ms for _, r, _ in bars]
    colours = ["tab:gray"] + ["tab:blue"] * (len(bars) - 1)
    ax.barh(ys, medians, xerr=[low, high], color=colours, alpha=0.8, capsize=4)
    top = max(r.p75_ms for _, r, _ in bars)
    for y, (_, r, label) in zip(ys, bars):
        ax.text(
            r.p75_ms + 0.01 * top, y, f" {r.median_ms:.4g} ms, {label}", va="center", fontsize=8
        )
    ax.set_yticks(ys)
    ax.set_yticklabels([key for key, _, _ in bars])
    ax.invert_yaxis()  # the baseline on top, in the order given
    ax.set_xlim(0, top * 1.35 if top > 0 else 1.0)
    ax.set_xlabel("median time per call (ms); whiskers: p25 to p75")
    ax.set_title("implementations compared (speedup against the first)")
    return finish(fig, path)

"""The pictures of timing results: one benchmark's latency histogram with its percentiles
(``plot_benchmark``) and implementations side by side (``plot_comparison``).

matplotlib is imported only when a picture is drawn (:mod:`gpukeeper.plotting`).
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Tuple

from gpukeeper.checks import check_int
from gpukeeper.errors import InvalidInputError
from gpukeeper.plotting import PathLike, finish, pyplot
from gpukeeper.timing.compare import speedup_label
from gpukeeper.timing.result import BenchmarkResult

__all__ = ["plot_benchmark", "plot_comparison"]


def plot_benchmark(result: BenchmarkResult, path: Optional[PathLike] = None, *,
                   bins: int = 50) -> Any:
    """The histogram of ``result``'s per-call times with vertical lines (and a legend)
    for the mean, median, p5, p95 and p99, as a matplotlib Figure saved to ``path`` when
    given. For a GPU result led by the loop time, the histogram is of the per-call device
    times, and the loop time per call is a line of its own.

    Raises ``InvalidInputError`` when ``bins`` is not an int >= 1, ``ImportError``
    naming the fix when matplotlib is not installed.
    """
    check_int(bins, "bins", 1)
    plt = pyplot(path, "BenchmarkResult.plot()")
    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    # The loop time has a value per batch, too few for a histogram: a GPU result shows
    # the per-call device times, with the loop time per call as a line of its own.
    per_call = result.device_stats if result.measure == "loop" and result.gpu_times_ms else None
    times = result.gpu_times_ms if per_call is not None else result.times_ms
    s = per_call if per_call is not None else result.stats
    ax.hist(times, bins=bins, color="tab:blue", alpha=0.75)
    marks = [
        ("mean", s.mean, "tab:purple", "-"),
        ("median", s.median, "k", "--"),
        ("p5", s.p5, "tab:green", ":"),
        ("p95", s.p95, "tab:orange", ":"),
        ("p99", s.p99, "tab:red", "-."),
    ]
    if per_call is not None and result.loop_median_ms is not None:
        marks.append(("loop time per call", result.loop_median_ms, "tab:brown", "-"))
    for name, value, colour, ls in marks:
        ax.axvline(value, color=colour, lw=1.0, ls=ls, label=f"{name} {value:.4f} ms")
    ax.legend(loc="upper right", fontsize=8)
    what = "device" if per_call is not None or result.measure == "device" else (
        "loop" if result.work == "gpu" else result.timing)
    ax.set_xlabel(f"{what} time per call (ms)")
    ax.set_ylabel("calls" if what != "loop" else "batches")
    ax.locator_params(axis="y", integer=True)  # counts of calls: no half calls on the axis
    ax.set_title(f"{result.name}: {len(times)} {'batches' if what == 'loop' else 'calls'} on {result.device} "
                 f"({(result.work or 'cpu').upper()} work)")
    return finish(fig, path)


def _bars(results: Mapping[str, BenchmarkResult]) -> List[Tuple[str, BenchmarkResult, str]]:
    """Each implementation with its speedup label against the first, as the comparison
    table writes it (``~``: within the noise)."""
    if not isinstance(results, Mapping):
        raise InvalidInputError(f"results must be a dict of name -> BenchmarkResult, got {type(results).__name__}")
    items = list(results.items())
    if not items:
        raise InvalidInputError("no results to plot")
    for key, r in items:
        if not isinstance(r, BenchmarkResult):
            raise InvalidInputError(f"result {key!r} is not a BenchmarkResult ({type(r).__name__})")
    base = items[0][1]
    return [(key, r, speedup_label(r, base if i > 0 else None)) for i, (key, r) in enumerate(items)]


def plot_comparison(results: Mapping[str, BenchmarkResult], path: Optional[PathLike] = None
                    ) -> Any:
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
        ax.text(r.p75_ms + 0.01 * top, y, f" {r.median_ms:.4g} ms, {label}", va="center", fontsize=8)
    ax.set_yticks(ys)
    ax.set_yticklabels([key for key, _, _ in bars])
    ax.invert_yaxis()  # the baseline on top, in the order given
    ax.set_xlim(0, top * 1.35 if top > 0 else 1.0)
    ax.set_xlabel("median time per call (ms); whiskers: p25 to p75")
    ax.set_title("implementations compared (speedup against the first)")
    return finish(fig, path)

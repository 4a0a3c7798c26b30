"""The picture of one benchmark: its latency histogram with its percentiles (``plot_benchmark``).

It reads a ``BenchmarkResult``'s fields without importing the class, so that
``BenchmarkResult.plot()`` can draw through it. matplotlib is imported only when a picture
is drawn (:mod:`gpukeeper.base.plotting`).
"""

from __future__ import annotations

from typing import Any, Optional

from gpukeeper.base.arg_checks import check_int
from gpukeeper.base.plotting import PathLike, finish, pyplot

__all__ = ["plot_benchmark"]


def plot_benchmark(result: Any, path: Optional[PathLike] = None, *, bins: int = 50) -> Any:
    """The histogram of ``result``'s per-call times (a ``BenchmarkResult``) with vertical
    lines (and a legend) for the mean, median, p5, p95 and p99, as a matplotlib Figure
    saved to ``path`` when given. For a GPU result led by the loop time, the histogram is
    of the per-call device times, and the loop time per call is a line of its own.

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
    what = (
        "device"
        if per_call is not None or result.measure == "device"
        else ("loop" if result.work == "gpu" else result.timing)
    )
    ax.set_xlabel(f"{what} time per call (ms)")
    ax.set_ylabel("calls" if what != "loop" else "batches")
    ax.locator_params(axis="y", integer=True)  # counts of calls: no half calls on the axis
    ax.set_title(
        f"{result.name}: {len(times)} {'batches' if what == 'loop' else 'calls'} "
        f"on {result.device} ({(result.work or 'cpu').upper()} work)"
    )
    return finish(fig, path)

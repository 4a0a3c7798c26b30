"""The picture of an MD trajectory: a per-step timeline (latency, with memory on a second
axis, outliers and a leak marked) above the latency histogram."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from gpukeeper.base.arg_checks import check_int
from gpukeeper.base.plotting import PathLike, finish, pyplot

__all__ = ["plot_trajectory"]

MiB = float(1 << 20)

# Memory colours by leak verdict (True, False, None): a leak must stand out at a glance.
_LEAK_COLOURS = {True: "tab:red", False: "tab:green", None: "tab:gray"}


def _latency_lines(ax: Any, r: Any) -> None:
    steps = range(r.n_steps)
    ax.plot(steps, r.host_times_ms, lw=0.6, color="tab:blue", label="host latency")
    if r.gpu_times_ms is not None:
        every = f", interval means of {r.event_every} steps" if (r.event_every or 1) > 1 else ""
        ax.plot(
            steps, r.gpu_times_ms, lw=0.6, color="tab:orange", label=f"GPU time (events{every})"
        )
    s = r.stats
    if s.outlier_steps:
        ys = r.times_ms
        ax.scatter(
            list(s.outlier_steps),
            [ys[i] for i in s.outlier_steps],
            s=18,
            c="tab:purple",
            marker="x",
            label=f"outliers ({len(s.outlier_steps)})",
            zorder=3,
        )
    ax.axhline(s.median_ms, color="k", lw=0.8, ls="--", label=f"median {s.median_ms:.4f} ms")
    ax.set_xlabel("step")
    ax.set_ylabel("latency (ms)")


def _fitted_line(r: Any) -> Optional[Tuple[List[float], List[float]]]:
    """The slope fitted over the second half of the run, as two points in MiB (None
    when there is no slope or no sample in that half)."""
    slope = r.memory_slope_bytes_per_step
    half = [(x, y) for x, y in zip(r.memory_steps, r.memory_bytes) if x >= r.n_steps // 2]
    if slope is None or not half:
        return None
    x0 = half[0][0]
    # The line goes through the centre of the half's samples, as a least-squares fit does.
    y0 = sum(y for _, y in half) / len(half) - slope * (sum(x for x, _ in half) / len(half) - x0)
    xs = [float(x0), float(r.n_steps - 1)]
    return xs, [(y0 + slope * (x - x0)) / MiB for x in xs]


def _memory_lines(ax: Any, r: Any) -> None:
    """Memory on ``ax`` (the timeline's second y axis), coloured by the leak verdict."""
    colour = _LEAK_COLOURS.get(r.memory_leak, "tab:gray")
    if not r.memory_steps:
        ax.set_yticks([])
        ax.text(
            0.99,
            0.02,
            "memory not sampled",
            ha="right",
            va="bottom",
            fontsize=8,
            transform=ax.transAxes,
        )
        return
    ax.plot(
        r.memory_steps,
        [b / MiB for b in r.memory_bytes],
        ".-",
        ms=3,
        lw=0.8,
        color=colour,
        alpha=0.8,
        label=f"memory ({r.memory_source})",
    )
    line = _fitted_line(r)
    if line is not None:
        slope = r.memory_slope_bytes_per_step
        ax.plot(
            line[0],
            line[1],
            "--",
            color=colour,
            lw=1.2,
            label=f"slope {slope:+.1f} B/step" + (" (LEAK)" if r.memory_leak else ""),
        )
    if r.memory_leak:
        ax.text(
            0.01,
            0.97,
            "LEAK",
            color="tab:red",
            fontweight="bold",
            ha="left",
            va="top",
            transform=ax.transAxes,
        )
    ax.set_ylabel("memory (MiB)", color=colour)
    ax.tick_params(axis="y", colors=colour)


def _timeline(ax: Any, r: Any) -> None:
    _latency_lines(ax, r)
    mem = ax.twinx()
    _memory_lines(mem, r)
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = mem.get_legend_handles_labels()
    # Beside the axes, not over them: inside, the legend hid outlier markers and the peaks
    # of the latency line, which are what the plot is for.
    ax.legend(
        handles + more,
        labels + more_labels,
        loc="upper left",
        bbox_to_anchor=(1.08, 1.0),
        fontsize=8,
        borderaxespad=0.0,
    )
    ax.set_title(f"{r.name}: per-step latency and memory ({r.device})")


def plot_trajectory(r: Any, path: Optional[PathLike] = None, *, bins: int = 50) -> Any:
    """A :class:`~gpukeeper.md.TrajectoryResult` drawn, as a matplotlib Figure saved to
    ``path`` when given. Top: latency per step with the outlier steps marked, and memory
    on a second y axis with the slope fitted for the leak verdict (red and labelled
    LEAK for a leak). Bottom: the latency histogram with its median, p95 and p99.

    Raises ``InvalidInputError`` when ``bins`` is not an int >= 1, ``ImportError``
    naming the fix when matplotlib is not installed.
    """
    check_int(bins, "bins", 1)
    plt = pyplot(path, "TrajectoryResult.plot()")
    fig, axes = plt.subplots(
        2, 1, figsize=(10, 7.5), constrained_layout=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    _timeline(axes[0], r)
    ax = axes[1]
    s = r.stats
    ax.hist(r.times_ms, bins=bins, color="tab:blue", alpha=0.8)
    for name, q, ls in (
        ("median", s.median_ms, "--"),
        ("p95", s.p95_ms, ":"),
        ("p99", s.p99_ms, "-."),
    ):
        ax.axvline(q, color="k", lw=0.8, ls=ls, label=f"{name} {q:.4f} ms")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_xlabel(f"{r.timing_source} latency per step (ms)")
    ax.set_ylabel("steps")
    ax.locator_params(axis="y", integer=True)  # counts of steps: no half steps on the axis
    return finish(fig, path)

"""The picture of an MD trajectory: per-step latency, memory with its fitted slope, and a histogram."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Union


__all__ = ["plot_trajectory"]

MB = float(1 << 20)


def _pyplot(path: Optional[Union[str, "os.PathLike[str]"]]) -> Any:
    try:
        import matplotlib

        if path is not None and "matplotlib.pyplot" not in sys.modules:
            matplotlib.use("Agg")  # writing a file needs no display
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("TrajectoryResult.plot() needs matplotlib: pip install matplotlib") from exc
    return plt


def _latency_axes(ax: Any, r: Any) -> None:
    steps = range(r.n_steps)
    ax.plot(steps, r.host_times_ms, lw=0.6, label="host latency")
    if r.gpu_times_ms is not None:
        every = f", interval means of {r.event_every} steps" if (r.event_every or 1) > 1 else ""
        ax.plot(steps, r.gpu_times_ms, lw=0.6, label=f"GPU time (events{every})")
    s = r.stats
    if s.outlier_steps:
        ys = r.times_ms
        ax.scatter(list(s.outlier_steps), [ys[i] for i in s.outlier_steps], s=10, c="red",
                   label="outliers", zorder=3)
    ax.axhline(s.median_ms, color="k", lw=0.8, ls="--", label=f"median {s.median_ms:.4f} ms")
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.set_title(f"{r.name}: per-step latency ({r.device})")
    ax.legend(loc="upper right", fontsize=8)


def _memory_axes(ax: Any, r: Any) -> None:
    if r.memory_steps:
        ax.plot(r.memory_steps, [b / MB for b in r.memory_bytes], ".-", ms=3, lw=0.8,
                label=r.memory_source)
        slope = r.memory_slope_bytes_per_step
        half = [(x, y) for x, y in zip(r.memory_steps, r.memory_bytes) if x >= r.n_steps // 2]
        if slope is not None and half:
            x0 = half[0][0]
            y0 = sum(y for _, y in half) / len(half) - slope * (sum(x for x, _ in half) / len(half) - x0)
            xs = [x0, r.n_steps - 1]
            ax.plot(xs, [(y0 + slope * (x - x0)) / MB for x in xs], "r--", lw=1,
                    label=f"slope {slope:+.1f} B/step" + (" (LEAK)" if r.memory_leak else ""))
        ax.legend(loc="upper left", fontsize=8)
    else:
        ax.text(0.5, 0.5, "memory not sampled", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("MB")
    ax.set_title("memory")


def plot_trajectory(r: Any, path: Optional[Union[str, "os.PathLike[str]"]] = None, *,
                    bins: int = 50) -> Any:
    """A :class:`~gpukeeper.md.TrajectoryResult` drawn: latency over the steps, memory
    over the steps (with the fitted slope) and the latency histogram, as a matplotlib
    Figure; saved to ``path`` when given.

    Raises ``ImportError`` naming the fix when matplotlib is not installed.
    """
    plt = _pyplot(path)
    fig, axes = plt.subplots(3, 1, figsize=(10, 10), constrained_layout=True)
    _latency_axes(axes[0], r)
    _memory_axes(axes[1], r)
    ax = axes[2]
    s = r.stats
    ax.hist(r.times_ms, bins=bins)
    for q, ls in ((s.median_ms, "--"), (s.p95_ms, ":"), (s.p99_ms, "-.")):
        ax.axvline(q, color="k", lw=0.8, ls=ls)
    ax.set_xlabel(f"{r.timing_source} latency (ms); lines: median, p95, p99")
    ax.set_ylabel("steps")
    if path is not None:
        fig.savefig(os.fspath(path), dpi=100)
    return fig

"""Per-step profiling of molecular-dynamics loops: ``benchmark_md_trajectory``.

An MD run calls a force-field model millions of times; what matters is the latency of
each step, its tail and its stability over the run, and memory that must not creep.

>>> result = benchmark_md_trajectory(
...     model_func=lambda atoms: model(atoms),
...     inputs=trajectory,
...     check_memory_leak=True,
...     timestep_fs=0.5, n_atoms=64,
... )
>>> print(f"Mean latency: {result.mean_ms:.4f} ms")
>>> print(f"Memory delta: {result.memory_delta_gb * 1024:.2f} MB")
>>> print(result.summary())

How it measures (and why):

- **Host latency** of a step is ``perf_counter_ns`` around the model call. Without
  synchronization the GPU runs behind the host, so on CUDA this is the launch cost.
- **GPU time** of a step is the time between two CUDA events on the current stream: one
  recorded after the previous step (or before the first) and one after this step
  (gpukeeper's pooled events; PyTorch's or CuPy's with a core built without CUDA). One
  record per step, because a record costs the host and the device 1-2 us each; after
  host work between steps (a memory sample, the progress bar) a fresh origin is
  recorded, so that work is not counted. In a GPU-bound loop a step's time is the
  device's time for its work; in a launch-bound loop it is the time the device waited
  for the launches too: what the step really costs. Nothing is synchronized per step:
  events live in a ring of ``event_ring`` marks and are resolved
  after the loop (or, on longer runs, when the ring is full, outside every measured
  window). The statistics (``mean_ms`` ...) use GPU time when it was measured, else host
  latency (``timing_source`` says which; ``timing="host"`` forces host).
- ``sync_every=k`` synchronizes the device inside the measured window of every k-th step,
  so those steps' host latency is the true end-to-end latency (1: every step).
- **Memory** is sampled between steps, never inside the measured window. On CUDA it is
  the bytes allocated by the loaded frameworks (gpukeeper's own counters when PyTorch
  allocates through ``use_torch_allocator()``: about a microsecond; PyTorch's counters
  otherwise: 45-70 us a read, hence sampling), cross-checked at the start and the end
  against NVML's figure for this process: device memory that grows and that no counter
  explains (an engine allocating in its own context) is a warning. Where the work is
  not a framework's (an engine's own CUDA context, or a ``synchronize`` callable was
  given) it is NVML's figure for this process (``"nvml_process"``); for JAX steps,
  JAX's ``bytes_in_use``. In CPU mode three series are sampled: the process's resident
  set size (``memory_source`` ``"process_rss"``, what ``memory_delta_gb`` reports), and
  the in-use counts that exist: glibc's ``mallinfo2()`` (``"malloc_in_use"``) and
  ``tracemalloc`` when it is tracing (``memory_series`` holds them all).
  ``memory_sample_every="auto"`` keeps the reading's cost under 0.4 us per step (a read
  every ``ceil(cost / 0.4 us)`` steps), with at least 16 samples over the run.
- **Leak verdict** (:func:`leak_verdict`): the least-squares slope (bytes per step) of
  the samples taken in the *second half* of the measured steps, projected over the run
  and compared with ``leak_tolerance_mb``. A slope, not two end points: one late
  allocation or a cache that fills in the first steps (a caching allocator warming up)
  is growth, not a leak. Under noise: the series' noise is the largest move between two
  samples that the steady per-step move does not explain; when it exceeds the tolerance
  the verdict is ``None`` ("inconclusive: process_rss noise 12 MB > tolerance 1 MB"),
  unless the growth is also over 4 times the noise. In CPU mode the in-use counts
  decide (RSS also moves when the C allocator keeps or returns pages: tens of MB in a
  loop that makes and drops big arrays); RSS decides only a leak they cannot see
  (memory taken outside malloc), when it grows steadily and quietly.
  ``memory_leak_source`` names the series that decided, ``memory_leak_reason`` says
  why, ``memory_noise_bytes`` is its noise; ``memory_slope_bytes_per_step`` is the
  slope of ``memory_source``, ``memory_slope_all_bytes_per_step`` over all its samples.
- **What ran where**: ``work`` is ``"gpu"`` or ``"cpu"``, ``timing_method`` says how the
  steps were timed. GPU work that no framework owns (OpenMM's CUDA platform makes its
  own context) is timed on the host clock; gpukeeper cannot wait for it, so pass
  ``synchronize`` (``lambda: context.getState()``), else ``synchronized`` is False and a
  warning says the engine's queued work may be missing from the wall clock. JAX steps
  are timed on the host around ``jax.block_until_ready`` on each step's result.
- **Jitter**: the standard deviation of successive differences ``x[i+1] - x[i]``; unlike
  ``std`` it ignores slow drift and measures step-to-step unsteadiness.
- **Drift**: median of the last decile of steps minus median of the first decile
  (``drift_ms``; ``drift_pct`` relative to the first).
- **Outliers**: steps above ``median + outlier_k * 1.4826 * MAD`` (MAD: median absolute
  deviation; 1.4826 makes it a standard deviation for normal data), the scale floored at
  1% of the median so a perfectly steady run does not flag nanosecond noise.
- **Throughput**: ``steps_per_s`` is measured steps over the loop's wall time (the final
  synchronization included): the sustained rate; unless the steps' GPU times add up to
  at least 99% of that wall time (the timed stream was busy between the marks, so the
  events hold the work), then over their sum, which leaves out the bookkeeping between
  steps. ``throughput_source`` says which decided, ``events_coverage`` is the ratio.
  With ``timestep_fs``: ``ns_per_day = steps_per_s * timestep_fs * 1e-6 * 86400``; with
  ``n_atoms``: ``us_per_atom_step = 1e6 / steps_per_s / n_atoms``.
- Standard deviations are population ones (ddof=0, as numpy's default); percentiles
  interpolate linearly (numpy's default method).

The bookkeeping per step is two ``perf_counter_ns`` calls, a subtraction, one store in a
preallocated ``array`` and one integer comparison (plus one event record with GPU
timing): well under a microsecond of host time without events
(``benchmarks/python/md_overhead_bench.py`` measures it).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import sys
import time
import tracemalloc
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from gpukeeper.devices import resolve_device
from gpukeeper import frameworks, host, nvml
from gpukeeper.errors import InvalidInputError

__all__ = [
    "TrajectoryResult",
    "benchmark_md_trajectory",
    "LatencyStats",
    "latency_stats",
    "LeakVerdict",
    "leak_verdict",
]

GB = float(1 << 30)
MB = float(1 << 20)
_PROGRESS_AUTO_MIN_STEPS = 5000


# --------------------------------------------------------------------- statistics


def _percentile(sorted_x: Sequence[float], q: float) -> float:
    """numpy.percentile(x, q) with the default 'linear' method, on sorted data."""
    n = len(sorted_x)
    if n == 0:
        return math.nan
    pos = (n - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_x[lo] + (sorted_x[hi] - sorted_x[lo]) * frac


def _mean_std(x: Sequence[float]) -> Tuple[float, float]:
    n = len(x)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(x) / n
    var = math.fsum((v - mean) ** 2 for v in x) / n
    return mean, math.sqrt(var)


def _median(x: Sequence[float]) -> float:
    return _percentile(sorted(x), 50.0)


@dataclass(frozen=True)
class LatencyStats:
    """Statistics of one per-step series, in milliseconds."""

    n: int
    mean_ms: float
    median_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    p5_ms: float
    p95_ms: float
    p99_ms: float
    jitter_ms: float
    drift_ms: float
    drift_pct: float
    mad_ms: float
    outlier_threshold_ms: float
    outlier_steps: Tuple[int, ...]

    def to_dict(self) -> Dict[str, Any]:
        d = dict(self.__dict__)
        d["outlier_steps"] = list(self.outlier_steps)
        return d


def latency_stats(x_ms: Sequence[float], outlier_k: float = 5.0) -> LatencyStats:
    """Statistics of a per-step series (see the module doc for each definition)."""
    n = len(x_ms)
    if n == 0:
        raise InvalidInputError("latency_stats: empty series")
    s = sorted(x_ms)
    mean, std = _mean_std(x_ms)
    median = _percentile(s, 50.0)
    if n >= 2:
        _, jitter = _mean_std([x_ms[i + 1] - x_ms[i] for i in range(n - 1)])
    else:
        jitter = 0.0
    decile = max(1, n // 10)
    first = _median(x_ms[:decile])
    last = _median(x_ms[n - decile:])
    drift = last - first
    drift_pct = 100.0 * drift / first if first > 0 else math.nan
    mad = _median([abs(v - median) for v in x_ms])
    scale = max(1.4826 * mad, 0.01 * abs(median))
    threshold = median + outlier_k * scale
    outliers = tuple(i for i, v in enumerate(x_ms) if v > threshold)
    return LatencyStats(
        n=n, mean_ms=mean, median_ms=median, std_ms=std, min_ms=s[0], max_ms=s[-1],
        p5_ms=_percentile(s, 5.0), p95_ms=_percentile(s, 95.0), p99_ms=_percentile(s, 99.0),
        jitter_ms=jitter, drift_ms=drift, drift_pct=drift_pct, mad_ms=mad,
        outlier_threshold_ms=threshold, outlier_steps=outliers,
    )


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than 2 distinct xs)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx = math.fsum(xs) / n
    my = math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


# --------------------------------------------------------------------- leak verdicts

# A series noisier than the tolerance still proves a leak when its projected growth is
# at least this many times its noise: a single jump of h inside the second half fits a
# line whose projection over the run is up to 3h, so growth above 4x the largest jump
# cannot be one jump of the allocator.
_ABOVE_NOISE = 4.0


@dataclass(frozen=True)
class LeakVerdict:
    """The verdict of one memory series (see :func:`leak_verdict`).

    ``leak``: True (grows), False (stable), None (inconclusive: the series moves by more
    than the tolerance for reasons a line does not explain). ``slope``: bytes per step
    over the second half; ``growth``: ``slope * n_steps``; ``noise``: the largest move
    between two samples that the steady slope does not explain (bytes); ``steady``: the
    fraction of sample intervals in the second half over which the series grew;
    ``reason``: one readable line.
    """

    source: str
    leak: Optional[bool]
    slope: float
    growth: float
    noise: float
    steady: float
    samples: int
    reason: str


def _late(xs: Sequence[float], ys: Sequence[float], n_steps: int) -> List[Tuple[float, float]]:
    late = [(x, float(y)) for x, y in zip(xs, ys) if x >= n_steps / 2.0]
    if len(late) < 3:
        late = [(x, float(y)) for x, y in zip(xs, ys)][-3:]
    return late


def leak_verdict(
    steps: Sequence[float],
    values: Sequence[float],
    n_steps: int,
    tolerance_mb: float,
    source: str = "memory",
) -> LeakVerdict:
    """Whether a memory series sampled over a run of ``n_steps`` grows.

    ``steps``: the number of calls made when each reading was taken; ``values``: the
    readings (bytes). The growth is the least-squares slope over the second half of the
    run, projected over the whole run (a slope, not two end points: a cache that fills
    early is not a leak). The noise is the largest move between two consecutive
    samples in the second half that the median per-step move does not explain: a steady
    leak moves the same way every interval (noise near 0), an allocator that keeps and
    hands back pages moves in jumps.

    - noise <= tolerance: a leak when the growth exceeds the tolerance;
    - noise > tolerance: a leak only when the growth exceeds the tolerance *and*
      4 times the noise (more than one jump could make); otherwise inconclusive (None).

    Raises ``InvalidInputError`` for mismatched or empty series.
    """
    if len(steps) != len(values) or len(values) < 2:
        raise InvalidInputError(
            f"leak_verdict needs two equally long series of at least 2 samples, got "
            f"{len(steps)} steps and {len(values)} values")
    if not isinstance(n_steps, int) or isinstance(n_steps, bool) or n_steps < 1:
        raise InvalidInputError(f"n_steps must be an int >= 1, got {n_steps!r}")
    if isinstance(tolerance_mb, bool) or not isinstance(tolerance_mb, (int, float)) or not tolerance_mb >= 0:
        raise InvalidInputError(f"tolerance_mb must be a number >= 0, got {tolerance_mb!r}")
    xs = [float(x) for x in steps]
    late = _late(xs, values, n_steps)
    lx = [x for x, _ in late]
    ly = [y for _, y in late]
    slope = _slope(lx, ly)
    growth = slope * n_steps
    spans = [lx[i + 1] - lx[i] for i in range(len(lx) - 1)]
    moves = [ly[i + 1] - ly[i] for i in range(len(ly) - 1)]
    rates = sorted(m / s for m, s in zip(moves, spans) if s > 0)
    typical = _percentile(rates, 50.0) if rates else 0.0
    noise = max((abs(m - typical * s) for m, s in zip(moves, spans)), default=0.0)
    steady = sum(1 for m in moves if m > 0) / len(moves) if moves else 0.0
    tol = tolerance_mb * MB
    over = f"{growth / MB:+.2f} MB over {n_steps} steps ({slope:+.1f} B/step)"
    if noise <= tol:
        leak: Optional[bool] = growth > tol
        reason = (f"{'leak' if leak else 'stable'}: {source} {over}, tolerance {tolerance_mb:g} MB "
                  f"(noise {noise / MB:.2f} MB)")
    elif growth > tol and growth > _ABOVE_NOISE * noise:
        leak = True
        reason = (f"leak: {source} {over}, above its noise {noise / MB:.2f} MB "
                  f"(tolerance {tolerance_mb:g} MB)")
    else:
        leak = None
        reason = (f"inconclusive: {source} noise {noise / MB:.2f} MB > tolerance {tolerance_mb:g} MB "
                  f"(growth {over})")
    return LeakVerdict(source, leak, slope, growth, noise, steady, len(late), reason)


def _combine(primary: LeakVerdict, in_use: Optional[LeakVerdict]) -> LeakVerdict:
    """One verdict from a held-bytes series (RSS) and an in-use series (malloc, tracemalloc).

    In-use counts decide: they move only when memory is allocated or freed, where RSS
    also moves when the allocator keeps or returns pages. RSS overrules them only for a
    leak they cannot see (memory taken outside malloc: mmap, a library's own allocator),
    and only when it grows steadily with noise under the tolerance; growth made of a few
    jumps is the allocator's, not proof of a leak.
    """
    if in_use is None:
        return primary
    if in_use.leak:
        return in_use
    if primary.leak and primary.noise <= primary.growth / _ABOVE_NOISE and primary.steady >= 0.5:
        return LeakVerdict(
            primary.source, True, primary.slope, primary.growth, primary.noise, primary.steady,
            primary.samples,
            primary.reason + f", steadily, while {in_use.source} does not grow: memory taken "
            "outside malloc (mmap, a library's own allocator)")
    note = primary.reason
    if primary.leak:
        note = (f"{primary.source} grows {primary.growth / MB:+.2f} MB in jumps, not steadily: "
                "the allocator keeping freed memory")
    return LeakVerdict(in_use.source, in_use.leak, in_use.slope, in_use.growth, in_use.noise,
                       in_use.steady, in_use.samples, f"{in_use.reason}; cross-check {note}")


# --------------------------------------------------------------------- the result


@dataclass
class TrajectoryResult:
    """What ``benchmark_md_trajectory`` measured. Times in ms, memory in GB unless the
    name says bytes. ``None`` where not measured (no GPU timing, memory not checked,
    no ``timestep_fs``/``n_atoms``)."""

    name: str
    device: str
    n_steps: int
    warmup_steps: int
    timing_source: str  # "gpu" (CUDA events) or "host" (perf_counter_ns)
    host_times_ms: List[float]
    gpu_times_ms: Optional[List[float]]
    host: LatencyStats
    gpu: Optional[LatencyStats]
    total_time_s: float
    warmup_time_s: float
    steps_per_s: float
    ns_per_day: Optional[float]
    us_per_atom_step: Optional[float]
    timestep_fs: Optional[float]
    n_atoms: Optional[int]
    sync_every: Optional[int]
    # memory
    memory_source: Optional[str]
    memory_sample_every: Optional[int]
    memory_steps: List[int]
    memory_bytes: List[int]
    memory_initial_bytes: Optional[int]
    memory_final_bytes: Optional[int]
    memory_peak_bytes: Optional[int]
    memory_slope_bytes_per_step: Optional[float]
    memory_slope_all_bytes_per_step: Optional[float]
    leak_tolerance_mb: float
    memory_leak: Optional[bool]
    warnings: List[str] = field(default_factory=list)
    # what ran where, and how it was timed
    work: str = "cpu"  # "gpu" or "cpu": where the steps' work runs
    timing_method: str = ""  # how the per-step times were taken, in words
    synchronized: Optional[bool] = True  # the wall clock ends at a wait for all the work
    throughput_source: str = "wall clock"  # what decided steps_per_s and ns_per_day
    events_coverage: Optional[float] = None  # sum of GPU step times / loop wall time
    # which series decided the leak verdict, and why
    memory_leak_source: Optional[str] = None
    memory_leak_reason: str = ""
    memory_noise_bytes: Optional[float] = None
    memory_series: Dict[str, List[int]] = field(default_factory=dict)

    # ---- the primary series (GPU time when measured, else host latency)
    @property
    def stats(self) -> LatencyStats:
        return self.gpu if (self.timing_source == "gpu" and self.gpu is not None) else self.host

    @property
    def times_ms(self) -> List[float]:
        return self.gpu_times_ms if (self.timing_source == "gpu" and self.gpu_times_ms is not None) else self.host_times_ms

    mean_ms = property(lambda self: self.stats.mean_ms, doc="Mean per-step latency (ms).")
    median_ms = property(lambda self: self.stats.median_ms, doc="Median per-step latency (ms).")
    std_ms = property(lambda self: self.stats.std_ms, doc="Standard deviation (ms, ddof=0).")
    min_ms = property(lambda self: self.stats.min_ms, doc="Fastest step (ms).")
    max_ms = property(lambda self: self.stats.max_ms, doc="Slowest step (ms).")
    p95_ms = property(lambda self: self.stats.p95_ms, doc="95th percentile (ms).")
    p99_ms = property(lambda self: self.stats.p99_ms, doc="99th percentile (ms).")
    jitter_ms = property(lambda self: self.stats.jitter_ms, doc="Std of successive differences (ms).")
    drift_ms = property(lambda self: self.stats.drift_ms, doc="Last-decile minus first-decile median (ms).")
    drift_pct = property(lambda self: self.stats.drift_pct, doc="Drift relative to the first decile (%).")
    outlier_steps = property(lambda self: list(self.stats.outlier_steps), doc="Indices of outlier steps.")

    @property
    def calls_per_second(self) -> float:
        return self.steps_per_s

    @property
    def memory_delta_gb(self) -> float:
        """Final minus initial memory (GB; 0.0 when memory was not checked)."""
        if self.memory_initial_bytes is None or self.memory_final_bytes is None:
            return 0.0
        return (self.memory_final_bytes - self.memory_initial_bytes) / GB

    @property
    def peak_memory_gb(self) -> Optional[float]:
        return None if self.memory_peak_bytes is None else self.memory_peak_bytes / GB

    @property
    def initial_memory_gb(self) -> Optional[float]:
        return None if self.memory_initial_bytes is None else self.memory_initial_bytes / GB

    @property
    def final_memory_gb(self) -> Optional[float]:
        return None if self.memory_final_bytes is None else self.memory_final_bytes / GB

    @property
    def memory_leak_detected(self) -> bool:
        return bool(self.memory_leak)

    # ---- output
    def summary(self) -> str:
        s = self.stats
        lines = [
            f"MD trajectory: {self.name} on {self.device} ({self.work.upper()} work)",
            f"  steps: {self.n_steps} (+{self.warmup_steps} warm-up), timing: {self.timing_source}"
            + (f", sync every {self.sync_every}" if self.sync_every else "")
            + (f" ({self.timing_method})" if self.timing_method else ""),
            f"  latency  mean {s.mean_ms:.4f} ms  median {s.median_ms:.4f}  std {s.std_ms:.4f}  "
            f"min {s.min_ms:.4f}  max {s.max_ms:.4f}",
            f"  tail     p95 {s.p95_ms:.4f} ms  p99 {s.p99_ms:.4f} ms  jitter {s.jitter_ms:.4f} ms  "
            f"drift {s.drift_ms:+.4f} ms ({s.drift_pct:+.1f}%)",
            f"  outliers {len(s.outlier_steps)} step(s) above {s.outlier_threshold_ms:.4f} ms"
            + (f": {list(s.outlier_steps[:10])}" + (" ..." if len(s.outlier_steps) > 10 else "")
               if s.outlier_steps else ""),
        ]
        if self.timing_source == "gpu":
            h = self.host
            lines.append(f"  host     mean {h.mean_ms:.4f} ms  p99 {h.p99_ms:.4f} ms (launch side)")
        thr = f"  throughput {self.steps_per_s:.1f} steps/s"
        if self.ns_per_day is not None:
            thr += f", {self.ns_per_day:.3f} ns/day (dt {self.timestep_fs} fs)"
        if self.us_per_atom_step is not None:
            thr += f", {self.us_per_atom_step:.4f} us/atom-step ({self.n_atoms} atoms)"
        lines.append(thr + f" [{self.throughput_source}]")
        if self.memory_source is not None:
            verdict = {True: "LEAK", False: "stable", None: "inconclusive"}[self.memory_leak]
            lines.append(
                f"  memory ({self.memory_source}, every {self.memory_sample_every} step(s), "
                f"{len(self.memory_steps)} samples): delta {self.memory_delta_gb * 1024:+.2f} MB, "
                f"peak {(self.memory_peak_bytes or 0) / MB:.2f} MB, slope "
                f"{self.memory_slope_bytes_per_step or 0.0:+.1f} B/step -> {verdict} "
                f"(tolerance {self.leak_tolerance_mb} MB over the run)"
            )
            if self.memory_leak_reason:
                lines.append(f"  leak verdict from {self.memory_leak_source}: {self.memory_leak_reason}")
        for w in self.warnings:
            lines.append(f"  WARNING: {w}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return (f"TrajectoryResult(name={self.name!r}, device={self.device!r}, n_steps={self.n_steps}, "
                f"mean_ms={self.mean_ms:.4f}, p99_ms={self.p99_ms:.4f}, timing={self.timing_source!r}, "
                f"memory_leak={self.memory_leak})")

    def to_dict(self, include_steps: bool = True) -> Dict[str, Any]:
        """Everything as plain JSON-able values (per-step series when ``include_steps``)."""
        d: Dict[str, Any] = {
            "name": self.name, "device": self.device, "n_steps": self.n_steps,
            "warmup_steps": self.warmup_steps, "timing_source": self.timing_source,
            "mean_ms": self.mean_ms, "median_ms": self.median_ms, "std_ms": self.std_ms,
            "min_ms": self.min_ms, "max_ms": self.max_ms, "p95_ms": self.p95_ms,
            "p99_ms": self.p99_ms, "jitter_ms": self.jitter_ms, "drift_ms": self.drift_ms,
            "drift_pct": self.drift_pct, "outlier_steps": self.outlier_steps,
            "host": self.host.to_dict(), "gpu": None if self.gpu is None else self.gpu.to_dict(),
            "total_time_s": self.total_time_s, "warmup_time_s": self.warmup_time_s,
            "steps_per_s": self.steps_per_s, "ns_per_day": self.ns_per_day,
            "us_per_atom_step": self.us_per_atom_step, "timestep_fs": self.timestep_fs,
            "n_atoms": self.n_atoms, "sync_every": self.sync_every,
            "memory_source": self.memory_source, "memory_sample_every": self.memory_sample_every,
            "memory_initial_bytes": self.memory_initial_bytes,
            "memory_final_bytes": self.memory_final_bytes,
            "memory_peak_bytes": self.memory_peak_bytes, "memory_delta_gb": self.memory_delta_gb,
            "memory_slope_bytes_per_step": self.memory_slope_bytes_per_step,
            "memory_slope_all_bytes_per_step": self.memory_slope_all_bytes_per_step,
            "leak_tolerance_mb": self.leak_tolerance_mb, "memory_leak": self.memory_leak,
            "warnings": list(self.warnings),
            "work": self.work, "timing_method": self.timing_method,
            "synchronized": self.synchronized, "throughput_source": self.throughput_source,
            "events_coverage": self.events_coverage,
            "memory_leak_source": self.memory_leak_source,
            "memory_leak_reason": self.memory_leak_reason,
            "memory_noise_bytes": self.memory_noise_bytes,
        }
        if include_steps:
            d["host_times_ms"] = list(self.host_times_ms)
            d["gpu_times_ms"] = None if self.gpu_times_ms is None else list(self.gpu_times_ms)
            d["memory_steps"] = list(self.memory_steps)
            d["memory_bytes"] = list(self.memory_bytes)
            d["memory_series"] = {k: list(v) for k, v in self.memory_series.items()}
        # NaN is not JSON: drift_pct of a zero first decile becomes None.
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}

    def to_json(self, indent: Optional[int] = 2, include_steps: bool = True) -> str:
        return json.dumps(self.to_dict(include_steps=include_steps), indent=indent)

    def plot(self, path: Optional[Union[str, "os.PathLike[str]"]] = None, *, bins: int = 50) -> Any:
        """Latency over the steps, memory over the steps (with the fitted slope) and the
        latency histogram, as a matplotlib Figure; saved to ``path`` when given.

        Raises ``ImportError`` naming the fix when matplotlib is not installed.
        """
        try:
            import matplotlib

            if path is not None and "matplotlib.pyplot" not in sys.modules:
                matplotlib.use("Agg")  # writing a file needs no display
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise ImportError(
                "TrajectoryResult.plot() needs matplotlib: pip install matplotlib"
            ) from exc
        fig, axes = plt.subplots(3, 1, figsize=(10, 10), constrained_layout=True)
        ax = axes[0]
        steps = range(self.n_steps)
        ax.plot(steps, self.host_times_ms, lw=0.6, label="host latency")
        if self.gpu_times_ms is not None:
            ax.plot(steps, self.gpu_times_ms, lw=0.6, label="GPU time (events)")
        s = self.stats
        if s.outlier_steps:
            ys = self.times_ms
            ax.scatter(list(s.outlier_steps), [ys[i] for i in s.outlier_steps], s=10, c="red",
                       label="outliers", zorder=3)
        ax.axhline(s.median_ms, color="k", lw=0.8, ls="--", label=f"median {s.median_ms:.4f} ms")
        ax.set_xlabel("step")
        ax.set_ylabel("ms")
        ax.set_title(f"{self.name}: per-step latency ({self.device})")
        ax.legend(loc="upper right", fontsize=8)
        ax = axes[1]
        if self.memory_steps:
            ax.plot(self.memory_steps, [b / MB for b in self.memory_bytes], ".-", ms=3, lw=0.8,
                    label=self.memory_source)
            if self.memory_slope_bytes_per_step is not None:
                half = [(x, y) for x, y in zip(self.memory_steps, self.memory_bytes) if x >= self.n_steps // 2]
                if half:
                    x0 = half[0][0]
                    y0 = sum(y for _, y in half) / len(half) - self.memory_slope_bytes_per_step * (
                        sum(x for x, _ in half) / len(half) - x0)
                    xs = [x0, self.n_steps - 1]
                    ax.plot(xs, [(y0 + self.memory_slope_bytes_per_step * (x - x0)) / MB for x in xs],
                            "r--", lw=1,
                            label=f"slope {self.memory_slope_bytes_per_step:+.1f} B/step"
                            + (" (LEAK)" if self.memory_leak else ""))
            ax.legend(loc="upper left", fontsize=8)
        else:
            ax.text(0.5, 0.5, "memory not sampled", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("step")
        ax.set_ylabel("MB")
        ax.set_title("memory")
        ax = axes[2]
        ax.hist(self.times_ms, bins=bins)
        for q, ls in ((s.median_ms, "--"), (s.p95_ms, ":"), (s.p99_ms, "-.")):
            ax.axvline(q, color="k", lw=0.8, ls=ls)
        ax.set_xlabel(f"{self.timing_source} latency (ms); lines: median, p95, p99")
        ax.set_ylabel("steps")
        if path is not None:
            fig.savefig(os.fspath(path), dpi=100)
        return fig


# --------------------------------------------------------------------- memory probes


class _Series:
    """One memory reading sampled between steps: a name (the ``memory_source`` it is
    reported under), the reader, and whether it counts bytes *in use* (an allocator's
    live bytes: a leak shows up at once) or bytes *held* (RSS, a process's device
    memory: caches and pages the allocator keeps move it too)."""

    def __init__(self, name: str, read: Callable[[], int], in_use: bool,
                 close: Optional[Callable[[], None]] = None) -> None:
        self.name = name
        self.read = read
        self.in_use = in_use
        self.close = close or (lambda: None)


def _host_series() -> List[_Series]:
    """RSS (what the process holds) first, then the in-use counts that exist here:
    tracemalloc when it is tracing, glibc's mallinfo2."""
    rss = host.RssReader()
    series = [_Series(rss.source, rss, False, rss.close)]
    if tracemalloc.is_tracing():
        series.append(_Series("tracemalloc", lambda: int(tracemalloc.get_traced_memory()[0]), True))
    in_use = host.malloc_in_use_reader()
    if in_use is not None:
        series.append(_Series("malloc_in_use", in_use, True))
    return series


def _cuda_probe(index: int) -> Tuple[Callable[[], int], str]:
    """The cheapest reader of allocated device bytes that sees every loaded framework."""
    loaded = frameworks.loaded_frameworks()
    torch = frameworks.torch_in_use()
    if loaded == ["torch"] or (not loaded and torch is not None):
        if frameworks.torch_uses_gpukeeper():
            from gpukeeper.integrations import torch_allocator

            stats = torch_allocator.stats

            def read_pool() -> int:
                s = stats(index)
                return 0 if s is None else s.allocated_bytes

            return read_pool, "gpukeeper_torch_allocator"
        raw = torch.cuda.memory.memory_stats_as_nested_dict

        def read_torch() -> int:
            try:
                return int(raw(index)["allocated_bytes"]["all"]["current"])
            except (KeyError, TypeError):
                return 0

        return read_torch, "torch"
    by_framework = frameworks.memory_by_framework

    def read_all() -> int:
        return sum(m.allocated or 0 for m in by_framework(index).values())

    return read_all, "frameworks"


# --------------------------------------------------------------------- GPU events

# Steps of a full ring left queued (unresolved) when it is resolved mid-run.
_RING_KEEP = 64


class _Events:
    """A ring of CUDA "lap" marks on the current stream (PyTorch's, else CuPy's).

    One event is recorded after each step; a step's GPU time is the time from the
    previous mark to its own: one record per step instead of a start/end pair, because
    each record costs the host ~1-2 us and the device about as much (measured by
    ``benchmarks/python/timing_accuracy_bench.py``). Where the loop did other host work
    between two steps (a memory sample, the progress bar, resolving a full ring),
    ``restart`` records a fresh origin for the next step, so that work is not counted.

    gpukeeper's own pooled events (``_core.Event``) when the core sees the device:
    recording one is a single C call on a stream handle read once. The framework's
    events otherwise (a core built without CUDA).
    """

    def __init__(self, index: int, size: int) -> None:
        torch = frameworks.torch_in_use()
        if torch is None and frameworks.loaded_torch() is not None:
            torch = frameworks.loaded_torch()  # CUDA not initialised yet: the events will do it
        self.size = size
        from gpukeeper import _core

        if torch is not None:
            stream: Any = torch.cuda.current_stream(index)
        else:
            cupy = sys.modules["cupy"]
            with cupy.cuda.Device(index):
                stream = cupy.cuda.get_current_stream()
        if int(_core.cuda_device_count()) > index:
            handle = int(stream.cuda_stream if torch is not None else stream.ptr)
            self._sync = lambda: _core.synchronize(index)
            self._new = lambda: _core.Event(index)
            self._recorder = lambda e: functools.partial(e.record, handle)
            self._elapsed = lambda a, b: a.elapsed_ms(b)
            self._wait = lambda e: e.synchronize()
            self._done = lambda e: e.query()
            self.source = "gpukeeper"
        elif torch is not None:
            self._sync = lambda: torch.cuda.synchronize(index)

            def new_torch_event() -> Any:
                with torch.cuda.device(index):
                    return torch.cuda.Event(enable_timing=True)

            self._new = new_torch_event
            self._recorder = lambda e: functools.partial(e.record, stream)
            self._elapsed = lambda a, b: a.elapsed_time(b)
            self._wait = lambda e: e.synchronize()
            self._done = lambda e: e.query()
            self.source = "torch"
        else:
            cupy = sys.modules["cupy"]
            self._sync = lambda: cupy.cuda.runtime.deviceSynchronize()

            def new_cupy_event() -> Any:
                with cupy.cuda.Device(index):
                    return cupy.cuda.Event()

            self._new = new_cupy_event
            self._recorder = lambda e: functools.partial(e.record, stream)
            self._elapsed = lambda a, b: cupy.cuda.get_elapsed_time(a, b)
            self._wait = lambda e: e.synchronize()
            self._done = lambda e: bool(e.done)
            self.source = "cupy"
        self.marks = [self._new() for _ in range(size)]
        self.rec = [self._recorder(e) for e in self.marks]
        self.origin = self._new()
        self._spares: List[Any] = []
        self._restarts: Dict[int, Any] = {}  # slot -> origin recorded after host work
        self.probes = 0  # marks queried right after their record ...
        self.busy = 0  # ... that were still waiting for queued work on the stream

    def probe(self, slot: int) -> None:
        """Asks whether the mark just recorded in ``slot`` is still waiting for work.

        A mark on a stream with nothing queued completes at once, and the laps between
        such marks are the host's time between records: they add up to the wall time
        whether or not the stream did the step's work (another engine's context,
        another stream). Marks still pending right after their record show the stream
        was busy: only then do the laps hold the work."""
        if slot >= self.size:
            return
        self.probes += 1
        try:
            if not self._done(self.marks[slot]):
                self.busy += 1
        except Exception:
            self.probes -= 1  # a failed query proves nothing either way

    def busy_fraction(self) -> Optional[float]:
        return self.busy / self.probes if self.probes else None

    def begin(self) -> None:
        """Records the origin of the first step."""
        self._recorder(self.origin)()

    def restart(self, slot: int) -> None:
        """Records now a fresh origin for the step in ``slot`` (host work came between)."""
        if slot >= self.size:
            return
        event = self._restarts.get(slot)
        if event is None:
            event = self._spares.pop() if self._spares else self._new()
            self._restarts[slot] = event
        self._recorder(event)()

    def synchronize(self) -> None:
        self._sync()

    def resolve(self, count: int, out: List[float], keep: int = 0) -> None:
        """Appends the laps (ms) of the first ``count - keep`` steps to ``out`` and
        moves the last ``keep`` slots to the front of the ring (their steps may still be
        queued). The last resolved mark becomes the origin of the next step.

        Waiting only for mark ``count - keep - 1`` leaves ``keep`` steps of work queued,
        so a GPU-bound loop never sees an idle device (whose next step would carry a
        launch latency) because the ring was full."""
        done = count - keep
        if done <= 0:
            return
        marks, rec = self.marks, self.rec
        self._wait(marks[done - 1])
        prev = self.origin
        for j in range(done):
            start = self._restarts.pop(j, None)
            out.append(float(self._elapsed(start if start is not None else prev, marks[j])))
            if start is not None:
                self._spares.append(start)
            prev = marks[j]
        spent = self.origin
        self.origin = marks[done - 1]
        marks[done - 1] = spent
        rec[done - 1] = self._recorder(spent)
        # In place: the measured loop holds ``rec``.
        marks[:] = marks[done:] + marks[:done]
        rec[:] = rec[done:] + rec[:done]
        self._restarts = {j - done: e for j, e in self._restarts.items()}


# --------------------------------------------------------------------- progress bar


class _Progress:
    def __init__(self, total: int, stream: Any) -> None:
        self.total = total
        self.stream = stream
        self.start = time.perf_counter()
        self.every = max(1, total // 100)

    def update(self, done: int) -> None:
        elapsed = time.perf_counter() - self.start
        frac = done / self.total
        width = 30
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        rate = done / elapsed if elapsed > 0 else 0.0
        self.stream.write(f"\r[{bar}] {frac * 100:5.1f}% {done}/{self.total} steps "
                          f"{rate:8.1f} steps/s ETA {eta:6.1f}s")
        self.stream.flush()

    def close(self) -> None:
        self.update(self.total)
        self.stream.write("\n")
        self.stream.flush()


# --------------------------------------------------------------------- the benchmark


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInputError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_pos(name: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise InvalidInputError(f"{name} must be a positive number, got {value!r}")
    return float(value)


# Events decide the throughput only when the steps' GPU times add up to at least this
# share of the loop's wall time: then the timed stream was busy between the marks and
# the events hold the work (and leave out the bookkeeping between steps). Below it, work
# ran where the events do not look (another context, an engine's own stream) or after
# the last mark, and the wall clock decides.
_EVENTS_COVER = 0.99
# A memory reader this slow (ns a read) is sampled by its share of the run, not by count.
_SLOW_READER_NS = 200_000


@dataclass
class _Plan:
    """Where the steps' work runs and how it is timed and synchronized."""

    # "cpu"; "events" (CUDA events on a framework's stream); "framework" (a framework's
    # work on the host clock); "jax"; "engine" (a CUDA context no framework owns)
    kind: str
    index: Optional[int]
    how: str


def _plan(index: Optional[int], detect: bool, use_events: bool, framework: bool, last: Any,
          synchronize: Optional[Callable[[], Any]]) -> _Plan:
    """Decides, after the warm-up, what the steps are (their last result is ``last``)."""
    user = "the caller's synchronize()" if synchronize is not None else "no synchronization"
    if (index is not None or detect) and frameworks.holds_jax_arrays(last):
        jax_index = frameworks.jax_device_index(last)
        return _Plan("jax", jax_index if jax_index is not None else (index or 0),
                     "JAX work: host clock around jax.block_until_ready on each step's result")
    if use_events:
        return _Plan("events", index, "CUDA events on the framework's current stream, one per step"
                     + (f"; the wall clock ends at {user}" if synchronize is not None else ""))
    if index is not None and framework:
        return _Plan("framework", index, "host clock (timing='host'), ended by a device synchronization"
                     + (f" and {user}" if synchronize is not None else ""))
    if index is not None and synchronize is not None:
        return _Plan("engine", index, "GPU work the caller synchronizes (synchronize=): host "
                     "clock, ended by it")
    if index is not None:
        return _Plan("engine", index, f"GPU work no framework owns: host clock, ended by {user}")
    if detect and not frameworks.gpu_frameworks_loaded():
        devices = frameworks.context_devices()
        if devices:
            return _Plan("engine", devices[0],
                         f"a CUDA context with no framework on cuda:{devices[0]}: host clock, "
                         f"ended by {user}")
    return _Plan("cpu", None, "host clock (CPU work)")


def _device_series(plan: _Plan, synchronize: Optional[Callable[[], Any]],
                   notes: List[str]) -> Tuple[List[_Series], Optional[_Series]]:
    """The memory series of a GPU run (the first decides) and an NVML cross-check.

    The frameworks' counters where the work is theirs; NVML's figure for this process
    where it is not (an engine's own context, or a ``synchronize`` that says the steps
    run somewhere gpukeeper cannot wait for); JAX's allocator statistics for JAX.
    """
    index = plan.index if plan.index is not None else 0
    nvml_read, why = nvml.process_memory_reader(index)
    nvml_series = _Series("nvml_process", nvml_read, False) if nvml_read is not None else None
    if plan.kind == "jax":
        stats = frameworks.jax_memory_stats(index)
        if stats is not None and "bytes_in_use" in stats:
            def read_jax() -> int:
                s = frameworks.jax_memory_stats(index) or {}
                return int(s.get("bytes_in_use", 0))

            return [_Series("jax", read_jax, True)], nvml_series
        notes.append("JAX gives no memory statistics on this device")
    elif plan.kind in ("events", "framework"):
        reserved = sum(m.reserved or 0 for m in frameworks.memory_by_framework(index).values())
        if nvml_series is None or (synchronize is None and reserved > 0):
            probe, source = _cuda_probe(index)
            return [_Series(source, probe, True)], nvml_series
    if nvml_series is not None:
        return [nvml_series], None
    notes.append(f"the device memory of this process cannot be read (NVML {why}): "
                 "host memory is watched instead")
    return _host_series(), None


def _cross_check_warning(cross_before: Optional[Tuple[int, int]], cross_after: Optional[Tuple[int, int]],
                         series: List["_Series"], leak_tolerance_mb: float, warnings: List[str]) -> None:
    """Says so when this process's device memory (NVML) grew by more than the frameworks'
    counters explain over the run."""
    if cross_before is None or cross_after is None:
        return
    grew = (cross_after[0] - cross_before[0]) - (cross_after[1] - cross_before[1])
    if grew > leak_tolerance_mb * MB:
        warnings.append(
            f"this process's device memory grew by {grew / MB:.2f} MB that no framework counter "
            f"explains (NVML {cross_before[0] / MB:.1f} -> {cross_after[0] / MB:.1f} MB; frameworks "
            f"reserved {cross_before[1] / MB:.1f} -> {cross_after[1] / MB:.1f} MB): another engine "
            f"or CUDA context in this process allocates it, and the leak verdict reads "
            f"{series[0].name if series else 'nothing'} (pass synchronize= to read NVML)")


def _step_statistics(host_ms: List[float], gpu_ms: Optional[List[float]], events: Optional[_Events],
                     sync_every: Optional[int], outlier_k: float, n: int, warnings: List[str],
                     ) -> Tuple[LatencyStats, Optional[LatencyStats], Optional[List[float]], Optional[float]]:
    """(host statistics, GPU statistics or None, the GPU times kept, the share of probed
    marks that found the timed stream busy); what is worth saying goes to ``warnings``."""
    host_stats = latency_stats(host_ms, outlier_k)
    busy = events.busy_fraction() if events is not None else None
    if gpu_ms and events is not None and busy == 0.0 and events.probes >= 3:
        # Every probed mark completed at once: the laps are the host's time between
        # records, not work on the device (which ran elsewhere, or was done already).
        warnings.append(
            f"the timed stream was idle at each of {events.probes} probed marks: the step's "
            "GPU work runs elsewhere (another engine's CUDA context, another stream), or the "
            "device finishes it before the host returns; per-step times are host latencies")
        gpu_ms = []
    gpu_stats = latency_stats(gpu_ms, outlier_k) if gpu_ms else None
    if gpu_stats is not None and sync_every is None and gpu_stats.median_ms < 0.05 * host_stats.median_ms:
        warnings.append(
            "GPU time is under 5% of host latency: the model may run on the CPU "
            "(pass device='cpu' or timing='host')")
    primary = gpu_stats if gpu_stats is not None else host_stats
    if primary.outlier_steps:
        warnings.append(f"{len(primary.outlier_steps)} outlier step(s) above "
                        f"{primary.outlier_threshold_ms:.4f} ms")
    if n >= 20 and not math.isnan(primary.drift_pct) and abs(primary.drift_pct) > 10.0:
        warnings.append(f"latency drifts by {primary.drift_pct:+.1f}% from the first to the last decile")
    return host_stats, gpu_stats, gpu_ms, busy


@dataclass
class _MemoryOutcome:
    """The memory part of a TrajectoryResult (see its fields of the same meaning)."""

    steps: List[int]
    bytes: List[int]
    all_series: Dict[str, List[int]]
    slope: Optional[float]
    slope_all: Optional[float]
    leak: Optional[bool]
    peak: Optional[int]
    verdict: Optional[LeakVerdict]


def _memory_outcome(series: List["_Series"], mem_step: "array[int]", mem_vals: List["array[int]"],
                    n_samples: int, final: Optional[List[int]], n: int, leak_tolerance_mb: float,
                    warnings: List[str]) -> _MemoryOutcome:
    """The samples of a run turned into series, slopes and the leak verdict; what is
    worth saying goes to ``warnings``."""
    steps_l: List[int] = []
    bytes_l: List[int] = []
    all_series: Dict[str, List[int]] = {}
    slope = slope_all = None
    leak: Optional[bool] = None
    peak: Optional[int] = None
    verdict: Optional[LeakVerdict] = None
    if series:
        # x = calls made when the reading was taken: the initial reading at 0, the one
        # after step i at i+1, the final one (after the synchronization) at n.
        xs = [0.0] + [float(s + 1) for s in mem_step[1:n_samples]] + [float(n)]
        steps_l = [int(v) for v in xs]
        for k, s in enumerate(series):
            all_series[s.name] = list(mem_vals[k][:n_samples]) + [final[k]]  # type: ignore[index]
        bytes_l = all_series[series[0].name]
        slope_all = _slope(xs, [float(b) for b in bytes_l])
        verdicts = [leak_verdict(xs, all_series[s.name], n, leak_tolerance_mb, s.name) for s in series]
        in_use = next((v for v, s in zip(verdicts, series) if s.in_use), None)
        verdict = verdicts[0] if series[0].in_use else _combine(verdicts[0], in_use)
        slope = verdicts[0].slope
        leak = verdict.leak
        peak = max(bytes_l)
        if leak:
            warnings.append(
                f"memory grows by {verdict.slope:.1f} bytes/step ({verdict.growth / MB:.2f} MB over "
                f"{n} steps, tolerance {leak_tolerance_mb} MB, {verdict.source}): leak")
        elif leak is None:
            warnings.append(f"leak verdict {verdict.reason}")
        if verdict.samples < 4:
            warnings.append(f"only {verdict.samples} memory samples in the second half: the leak "
                            "verdict is weak (lower memory_sample_every or run more steps)")
    return _MemoryOutcome(steps_l, bytes_l, all_series, slope, slope_all, leak, peak, verdict)


def _sample_period(series: List["_Series"], memory_sample_every: Union[int, str], n: int,
                   warm_ns: List[int]) -> int:
    """Steps between memory samples: as given, or "auto" (module doc) from the cost of a
    reading of every series, measured here."""
    if memory_sample_every != "auto":
        return int(memory_sample_every)
    costs = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for s in series:
            s.read()
        costs.append(time.perf_counter_ns() - t0)
    cost = sorted(costs)[2]
    # 0.4 us a step for memory keeps the whole bookkeeping (~0.2 us for the timing)
    # under the 1 us target whatever the step costs.
    budget = 400.0
    every = max(1, math.ceil(cost / budget))
    every = min(every, max(1, n // 16))
    # At least 16 samples, unless a slow reader (NVML's process list: ms a read) would
    # then cost more than 0.5% of the run: an OpenMM loop of 400 calls ran ~3% slower
    # with 16 NVML reads. Fewer samples then (at least 3: the verdict says when they are
    # few). Faster readers (PyTorch's counters: 45-80 us) keep 16.
    step_ns = sorted(warm_ns)[len(warm_ns) // 2] if warm_ns else 0
    if step_ns > 0 and cost > _SLOW_READER_NS and 16 * cost > 0.005 * n * step_ns:
        every = max(every, min(max(1, n // 3), math.ceil(cost / (0.005 * step_ns))))
    return every


def _checked_arguments(
    model_func: Any, inputs: Any, warmup_steps: Any, timestep_fs: Any, n_atoms: Any,
    name: Optional[str], memory_sample_every: Any, sync_every: Any, n_steps: Any, timing: Any,
    leak_tolerance_mb: Any, outlier_k: Any, event_ring: Any, synchronize: Any,
) -> Tuple[Sequence[Any], int, Optional[float], str]:
    """benchmark_md_trajectory's arguments checked (InvalidInputError otherwise):
    (the per-step inputs as a sequence, measured steps, timestep, label)."""
    if not callable(model_func):
        raise InvalidInputError(f"model_func must be callable, got {type(model_func).__name__}")
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
        raise InvalidInputError(f"inputs must be an iterable of per-step inputs, got {type(inputs).__name__}")
    data: Sequence[Any] = inputs if isinstance(inputs, Sequence) else list(inputs)
    if len(data) == 0:
        raise InvalidInputError("inputs is empty: a trajectory needs at least one step")
    _check_int("warmup_steps", warmup_steps, 0)
    n = len(data) if n_steps is None else _check_int("n_steps", n_steps, 1)
    timestep = _check_pos("timestep_fs", timestep_fs)
    if n_atoms is not None:
        _check_int("n_atoms", n_atoms, 1)
    if sync_every is not None:
        _check_int("sync_every", sync_every, 1)
    if memory_sample_every != "auto":
        _check_int("memory_sample_every", memory_sample_every, 1)
    if timing not in ("auto", "gpu", "host"):
        raise InvalidInputError(f"timing must be 'auto', 'gpu' or 'host', got {timing!r}")
    _check_pos("leak_tolerance_mb", leak_tolerance_mb) if leak_tolerance_mb != 0 else None
    _check_pos("outlier_k", outlier_k)
    _check_int("event_ring", event_ring, 1)
    if synchronize is not None and not callable(synchronize):
        raise InvalidInputError(f"synchronize must be callable or None, got {type(synchronize).__name__}")
    label = name or getattr(model_func, "__name__", None) or type(model_func).__name__
    return data, n, timestep, label


def benchmark_md_trajectory(
    model_func: Callable[[Any], Any],
    inputs: Iterable[Any],
    check_memory_leak: bool = True,
    warmup_steps: int = 10,
    timestep_fs: Optional[float] = None,
    n_atoms: Optional[int] = None,
    device: Any = None,
    name: Optional[str] = None,
    memory_sample_every: Union[int, str] = "auto",
    progress: Optional[bool] = None,
    sync_every: Optional[int] = None,
    *,
    n_steps: Optional[int] = None,
    timing: str = "auto",
    leak_tolerance_mb: float = 1.0,
    outlier_k: float = 5.0,
    event_ring: int = 4096,
    synchronize: Optional[Callable[[], Any]] = None,
) -> TrajectoryResult:
    """Runs ``model_func(x)`` once per step over ``inputs`` and profiles every step.

    Args:
        model_func: called with one input per step; its result is kept until the next
            step (as an MD integrator keeps the forces), then dropped.
        inputs: the per-step inputs (a sequence, or any iterable: materialized first).
        check_memory_leak: sample memory and give a leak verdict (``memory_leak``).
        warmup_steps: calls before measuring, cycling through ``inputs`` (not measured).
        timestep_fs, n_atoms: enable ``ns_per_day`` and ``us_per_atom_step``.
        device: where the model runs (as ``get_device``); None: CUDA when a framework
            that can run it is loaded (PyTorch, CuPy; JAX when the steps return JAX
            arrays), or when the process holds a CUDA context no framework owns (an
            engine such as OpenMM); else CPU. Pass ``"cpu"`` for a CPU model on a GPU
            machine.
        name: label (default: the function's name).
        memory_sample_every: read memory after every N-th step, or "auto" (module doc).
        progress: a text bar on stderr; None: on when stderr is a tty and the run has at
            least 5000 steps.
        sync_every: synchronize the device inside every k-th step's measured window.
        n_steps: measured steps (default ``len(inputs)``); inputs are cycled.
        timing: "auto" (GPU events on CUDA, else host), "gpu" or "host" (no events).
        leak_tolerance_mb: projected growth over the run above which it is a leak.
        outlier_k: outlier threshold in robust standard deviations.
        event_ring: CUDA events (one per step) kept before they are resolved.
        synchronize: waits for the steps' work where gpukeeper cannot: an engine's own
            CUDA context (e.g. ``lambda: simulation.context.getState()`` for OpenMM).
            Called after the warm-up, inside every ``sync_every``-th step and before the
            loop's wall clock stops. Without it, the work such an engine still has queued
            after the last step may be missing from the wall clock (the result says so).
            Passing it also says the steps' memory is the engine's: it is then read from
            NVML's figure for this process.

    Returns a :class:`TrajectoryResult`. Raises ``InvalidInputError`` for bad arguments
    (an uncallable model, no inputs, negative counts, an unknown ``timing`` ...);
    exceptions of ``model_func`` propagate unchanged.
    """
    data, n, timestep, label = _checked_arguments(
        model_func, inputs, warmup_steps, timestep_fs, n_atoms, name, memory_sample_every,
        sync_every, n_steps, timing, leak_tolerance_mb, outlier_k, event_ring, synchronize)

    # Without an explicit device, CUDA when a framework that could run the model is
    # loaded; otherwise the warm-up's result and the process's CUDA contexts decide
    # (a pure-Python/numpy model must not be "timed" on an idle GPU).
    torch_or_cupy = frameworks.loaded_torch() is not None or "cupy" in sys.modules
    index = resolve_device(device, auto_cuda=torch_or_cupy).index
    detect = device is None and index is None
    warnings: List[str] = []

    use_events = index is not None and timing != "host" and torch_or_cupy
    if timing == "gpu" and not use_events:
        raise InvalidInputError(
            f"timing='gpu' needs a CUDA device and PyTorch or CuPy loaded (device: "
            f"{'cpu' if index is None else f'cuda:{index}'}); an engine's own context or JAX "
            "is timed on the host clock")

    def sync() -> None:
        if index is not None:
            frameworks.synchronize_all(index)
        if synchronize is not None:
            synchronize()

    # ---- warm-up (also times a typical step, for the memory sampling period)
    cyc = itertools.cycle(data)
    t_w = time.perf_counter()
    warm_ns: List[int] = []
    out: Any = None
    for _ in range(warmup_steps):
        x = next(cyc)
        t0 = time.perf_counter_ns()
        out = model_func(x)
        warm_ns.append(time.perf_counter_ns() - t0)
    # A synchronize callable says the steps run where gpukeeper cannot wait (another
    # engine's context): events on the framework's stream would time that stream, and
    # on the legacy default stream they serialize the engine's streams at every mark
    # (an OpenMM loop beside torch ran 8% slower with them). Host clock, unless asked.
    events_wanted = use_events and (synchronize is None or timing == "gpu")
    plan = _plan(index, detect, events_wanted, torch_or_cupy and synchronize is None, out, synchronize)
    if plan.kind == "jax":
        frameworks.jax_block_until_ready(out)
    out = None
    index = plan.index
    sync()
    warmup_time = time.perf_counter() - t_w
    use_events = use_events and plan.kind == "events"
    dev_label = "cpu" if index is None else f"cuda:{index}"

    # ---- memory series and their period
    series: List[_Series] = []
    cross: Optional[_Series] = None
    every = 0
    if check_memory_leak:
        if plan.kind == "cpu":
            series = _host_series()
        else:
            series, cross = _device_series(plan, synchronize, warnings)
        every = _sample_period(series, memory_sample_every, n, warm_ns)
    readers = [s.read for s in series]
    n_series = len(series)

    # ---- preallocated books: array stores keep no Python objects alive per step, so
    # the bookkeeping itself neither allocates nor grows the memory it watches.
    host_ns = array("q", bytes(8 * n))
    max_samples = (n // every + 2) if every else 0
    mem_step = array("q", bytes(8 * max_samples))
    mem_vals = [array("q", bytes(8 * max_samples)) for _ in series]
    n_samples = 0
    gpu_ms: List[float] = [] if use_events else None  # type: ignore[assignment]
    ring = min(n, event_ring)
    events = _Events(index, ring) if use_events else None  # type: ignore[arg-type]

    if progress is None:
        try:
            progress = bool(sys.stderr.isatty()) and n >= _PROGRESS_AUTO_MIN_STEPS
        except (AttributeError, ValueError):
            progress = False
    bar = _Progress(n, sys.stderr) if progress else None

    # The slow path runs only at step indices in `checks` (memory samples, progress,
    # a full event ring); the hot loop compares one int per step.
    next_mem = every - 1 if every else n
    next_bar = bar.every - 1 if bar else n
    base = 0  # step index of event slot 0
    next_ring = ring - 1 if use_events else n

    def slow(i: int) -> Tuple[int, int]:
        nonlocal next_mem, next_bar, next_ring, base, n_samples
        if events is not None:
            events.probe(i - base)  # first: the mark of step i was recorded just now
        if i == next_mem:
            mem_step[n_samples] = i
            for k in range(n_series):
                mem_vals[k][n_samples] = readers[k]()
            n_samples += 1
            next_mem += every
        if i == next_bar:
            bar.update(i + 1)  # type: ignore[union-attr]
            next_bar += bar.every  # type: ignore[union-attr]
        if i == next_ring:
            keep = min(_RING_KEEP, ring // 2)
            events.resolve(ring, gpu_ms, keep)  # type: ignore[union-attr]
            base += ring - keep
            next_ring = base + ring - 1
        if events is not None:
            events.restart(i + 1 - base)  # the work above is not the next step's
        return min(next_mem, next_bar, next_ring), base

    # ---- the measured loop
    source_iter = data if n == len(data) else itertools.islice(itertools.cycle(data), n)
    cross_before = _cross_reading(cross, index)
    initial = [r() for r in readers] if readers else None
    if initial is not None:
        mem_step[0] = -1  # "before step 0"
        for k in range(n_series):
            mem_vals[k][0] = initial[k]
        n_samples = 1
    pc = time.perf_counter_ns
    model = model_func
    check = min(next_mem, next_bar, next_ring)
    t_start = time.perf_counter()
    if plan.kind == "jax":
        block = frameworks.jax_block_until_ready
        for i, x in enumerate(source_iter):
            t0 = pc()
            out = block(model(x))
            host_ns[i] = pc() - t0
            if i == check:
                check, base = slow(i)
    elif sync_every is not None:
        k = sync_every
        if events is not None:
            marks = events.rec
            events.begin()
            for i, x in enumerate(source_iter):
                t0 = pc()
                out = model(x)
                if (i + 1) % k == 0:
                    marks[i - base]()
                    sync()
                    host_ns[i] = pc() - t0
                else:
                    host_ns[i] = pc() - t0
                    marks[i - base]()
                if i == check:
                    check, base = slow(i)
        else:
            for i, x in enumerate(source_iter):
                t0 = pc()
                out = model(x)
                if (i + 1) % k == 0:
                    sync()
                host_ns[i] = pc() - t0
                if i == check:
                    check, base = slow(i)
    elif events is not None:
        marks = events.rec
        events.begin()
        for i, x in enumerate(source_iter):
            t0 = pc()
            out = model(x)
            host_ns[i] = pc() - t0
            marks[i - base]()
            if i == check:
                check, base = slow(i)
    else:
        for i, x in enumerate(source_iter):
            t0 = pc()
            out = model(x)
            host_ns[i] = pc() - t0
            if i == check:
                check, base = slow(i)
    out = None
    sync()
    total_time = time.perf_counter() - t_start
    if events is not None and n - base > 0:
        events.resolve(n - base, gpu_ms)
    if bar is not None:
        bar.close()

    # ---- memory verdict
    final = [r() for r in readers] if readers else None
    cross_after = _cross_reading(cross, index)
    for s in series:
        s.close()
    mem = _memory_outcome(series, mem_step, mem_vals, n_samples, final, n, leak_tolerance_mb,
                          warnings)
    steps_l, bytes_l, all_series = mem.steps, mem.bytes, mem.all_series
    slope, slope_all, leak, peak, verdict = mem.slope, mem.slope_all, mem.leak, mem.peak, mem.verdict
    _cross_check_warning(cross_before, cross_after, series, leak_tolerance_mb, warnings)

    host_ms = [v / 1e6 for v in host_ns]
    host_stats, gpu_stats, gpu_ms, busy = _step_statistics(host_ms, gpu_ms, events, sync_every,
                                                           outlier_k, n, warnings)
    src = "gpu" if gpu_stats is not None else "host"

    # ---- throughput: the wall clock, unless the events provably hold the work
    synchronized: Optional[bool] = True
    if plan.kind == "engine" and synchronize is None:
        synchronized = False
        warnings.append(
            "no synchronize callable: gpukeeper cannot wait for an engine's own CUDA context, "
            "so the work it still had queued after the last step may be missing from the wall "
            "clock (pass synchronize=, e.g. lambda: simulation.context.getState())")
    steps_per_s, throughput, coverage = _throughput(n, total_time, gpu_ms, synchronized, busy)
    ns_day = steps_per_s * timestep * 1e-6 * 86400.0 if timestep is not None else None
    per_atom = (1e6 / steps_per_s / n_atoms) if n_atoms is not None and steps_per_s > 0 else None

    return TrajectoryResult(
        name=label, device=dev_label, n_steps=n, warmup_steps=warmup_steps, timing_source=src,
        host_times_ms=host_ms, gpu_times_ms=gpu_ms if gpu_ms else None, host=host_stats,
        gpu=gpu_stats, total_time_s=total_time, warmup_time_s=warmup_time,
        steps_per_s=steps_per_s, ns_per_day=ns_day, us_per_atom_step=per_atom,
        timestep_fs=timestep, n_atoms=n_atoms, sync_every=sync_every,
        memory_source=series[0].name if series else None, memory_sample_every=every or None,
        memory_steps=steps_l, memory_bytes=bytes_l,
        memory_initial_bytes=initial[0] if initial else None,
        memory_final_bytes=final[0] if final else None,
        memory_peak_bytes=peak, memory_slope_bytes_per_step=slope,
        memory_slope_all_bytes_per_step=slope_all, leak_tolerance_mb=float(leak_tolerance_mb),
        memory_leak=leak, warnings=warnings,
        work="cpu" if plan.kind == "cpu" else "gpu", timing_method=plan.how,
        synchronized=synchronized, throughput_source=throughput, events_coverage=coverage,
        memory_leak_source=verdict.source if verdict else None,
        memory_leak_reason=verdict.reason if verdict else "",
        memory_noise_bytes=verdict.noise if verdict else None,
        memory_series=all_series,
    )


def _throughput(n: int, total_time: float, gpu_ms: Optional[List[float]],
                synchronized: Optional[bool],
                busy: Optional[float] = None) -> Tuple[float, str, Optional[float]]:
    """(steps per second, what decided it, events coverage): the wall clock of the whole
    loop, unless the events provably hold the work: the marks probed right after their
    record were mostly still pending (``busy``, the stream had work queued) and the
    steps' GPU times add up to nearly all of the loop (``_EVENTS_COVER``). Coverage
    alone proves nothing: laps between marks on an idle stream add up to the wall time
    too."""
    steps_per_s = n / total_time if total_time > 0 else math.inf
    throughput = "wall clock of the whole trajectory" + (
        "" if synchronized is not False else " (without a final synchronization)")
    if not gpu_ms:
        return steps_per_s, throughput, None
    gpu_total_s = math.fsum(gpu_ms) / 1e3
    coverage = gpu_total_s / total_time if total_time > 0 else None
    if (coverage is not None and coverage >= _EVENTS_COVER and gpu_total_s > 0
            and busy is not None and busy >= 0.5):
        return n / gpu_total_s, (
            f"events: the timed stream was busy at {busy:.0%} of the probed marks and the "
            f"steps' GPU times add up to {coverage:.1%} of the loop's wall time"), coverage
    if coverage is not None and (busy is None or busy < 0.5):
        throughput += (": the timed stream was not shown busy at the marks, so the events "
                       "need not hold the work")
    elif coverage is not None:
        throughput += (f": the steps' GPU times add up to only {coverage:.1%} of it, so the "
                       "events do not hold all of the work (it runs elsewhere, or after the "
                       "last mark)")
    return steps_per_s, throughput, coverage


def _cross_reading(cross: Optional[_Series], index: Optional[int]) -> Optional[Tuple[int, int]]:
    """(NVML bytes of this process, frameworks' reserved bytes) on the device, for the
    check that the frameworks' counters explain the process's device memory."""
    if cross is None or index is None:
        return None
    try:
        reserved = sum(m.reserved or 0 for m in frameworks.memory_by_framework(index).values())
        return cross.read(), reserved
    except Exception:
        return None

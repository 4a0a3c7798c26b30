"""What an MD trajectory measured: ``TrajectoryResult``.

Its statistics are timing's :class:`~gpukeeper.timing.latency.LatencyStats` (also
importable from here), so they mean what they mean in ``benchmark_function``: standard
deviations are *sample* ones (``ddof=1``, as ``timing.stats.std``; ``nan`` for a single
value), percentiles interpolate linearly (numpy's default method).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from gpukeeper.base.byte_figures import fmt_bytes
from gpukeeper.base.html_table import html_fields
from gpukeeper.base.plotting import PathLike
from gpukeeper.timing.latency import LatencyStats, latency_stats
from gpukeeper.timing.stats import json_safe

__all__ = ["LatencyStats", "latency_stats", "TrajectoryResult", "GB", "MiB", "json_safe"]

GB = float(1 << 30)
MiB = float(1 << 20)


@dataclass
class TrajectoryResult:
    """What ``benchmark_md_trajectory`` measured. Times in ms, memory in GB unless the
    name says bytes. ``None`` where not measured (no GPU timing, memory not checked,
    no ``timestep_fs``/``n_atoms``).

    ``host_times_ms[i]``: the host latency of step i (always per step).
    ``gpu_times_ms[i]``: with ``event_every == 1``, the GPU time of step i (from the mark
    after step i-1 to the mark after step i). With ``event_every = k > 1`` a mark is
    recorded after every k-th step only (and where host work comes between steps), so
    ``gpu_times_ms[i]`` is the GPU time of the interval that holds step i divided by its
    number of steps: the interval's mean step. Then ``gpu.mean_ms`` and the events'
    throughput are exact; median and percentiles are those of interval means (a single
    slow step shows diluted over its interval), and ``std_ms``/``jitter_ms``/outliers
    describe the intervals' means, not single steps. ``event_every``: the k used (None
    without GPU events).

    Standard deviations are sample ones (``ddof=1``), see :class:`LatencyStats`.
    """

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
    event_every: Optional[int] = None  # steps per GPU event interval (None: no events)
    # where the memory grows ("torch", "host_rss", "outside frameworks", ...; None when it
    # does not), and the cause named for a leak ("" when none is seen)
    memory_leak_where: Optional[str] = None
    memory_leak_cause: str = ""
    # the true peak from the allocator's peak counter, per sampling interval (where it
    # keeps one): how high, how often, in which intervals
    memory_peak_text: str = ""
    # the device's free bytes at the peak (what was free after the run, less what the peak
    # took beyond the memory still held then; None off the GPU or where NVML cannot tell)
    memory_headroom_bytes: Optional[int] = None

    # ---- the primary series (GPU time when measured, else host latency)
    @property
    def stats(self) -> LatencyStats:
        return self.gpu if (self.timing_source == "gpu" and self.gpu is not None) else self.host

    @property
    def times_ms(self) -> List[float]:
        if self.timing_source == "gpu" and self.gpu_times_ms is not None:
            return self.gpu_times_ms
        return self.host_times_ms

    mean_ms = property(lambda self: self.stats.mean_ms, doc="Mean per-step latency (ms).")
    median_ms = property(lambda self: self.stats.median_ms, doc="Median per-step latency (ms).")
    std_ms = property(lambda self: self.stats.std_ms, doc="Sample standard deviation (ms, ddof=1).")
    min_ms = property(lambda self: self.stats.min_ms, doc="Fastest step (ms).")
    max_ms = property(lambda self: self.stats.max_ms, doc="Slowest step (ms).")
    p95_ms = property(lambda self: self.stats.p95_ms, doc="95th percentile (ms).")
    p99_ms = property(lambda self: self.stats.p99_ms, doc="99th percentile (ms).")
    jitter_ms = property(
        lambda self: self.stats.jitter_ms, doc="Sample std (ddof=1) of successive differences (ms)."
    )
    drift_ms = property(
        lambda self: self.stats.drift_ms, doc="Last-decile minus first-decile median (ms)."
    )
    drift_pct = property(
        lambda self: self.stats.drift_pct, doc="Drift relative to the first decile (%)."
    )
    outlier_steps = property(
        lambda self: list(self.stats.outlier_steps), doc="Indices of outlier steps."
    )

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
        """A few readable lines: latency, tail, throughput, memory, warnings."""
        s = self.stats
        timing = self.timing_source
        if self.event_every is not None and self.event_every > 1:
            timing += f", events every {self.event_every} steps"
        lines = [
            f"MD trajectory: {self.name} on {self.device} ({self.work.upper()} work)",
            f"  steps: {self.n_steps} (+{self.warmup_steps} warm-up), timing: {timing}"
            + (f", sync every {self.sync_every}" if self.sync_every else "")
            + (f" ({self.timing_method})" if self.timing_method else ""),
            f"  latency  mean {s.mean_ms:.4f} ms  median {s.median_ms:.4f}  std {s.std_ms:.4f}  "
            f"min {s.min_ms:.4f}  max {s.max_ms:.4f}",
            f"  tail     p95 {s.p95_ms:.4f} ms  p99 {s.p99_ms:.4f} ms  "
            f"jitter {s.jitter_ms:.4f} ms  "
            f"drift {s.drift_ms:+.4f} ms ({s.drift_pct:+.1f}%)",
            f"  outliers {len(s.outlier_steps)} step(s) above {s.outlier_threshold_ms:.4f} ms"
            + (
                f": {list(s.outlier_steps[:10])}" + (" ..." if len(s.outlier_steps) > 10 else "")
                if s.outlier_steps
                else ""
            ),
        ]
        if self.timing_source == "gpu":
            h = self.host
            lines.append(f"  host     mean {h.mean_ms:.4f} ms  p99 {h.p99_ms:.4f} ms (launch side)")
        lines.append(self._throughput_line())
        lines.extend(self._memory_lines())
        lines.extend(f"  WARNING: {w}" for w in self.warnings)
        return "\n".join(lines)

    def _throughput_line(self) -> str:
        thr = f"  throughput {self.steps_per_s:.1f} steps/s"
        if self.ns_per_day is not None:
            thr += f", {self.ns_per_day:.3f} ns/day (dt {self.timestep_fs} fs)"
        if self.us_per_atom_step is not None:
            thr += f", {self.us_per_atom_step:.4f} us/atom-step ({self.n_atoms} atoms)"
        return thr + f" [{self.throughput_source}]"

    def _memory_lines(self) -> List[str]:
        if self.memory_source is None:
            return []
        verdict = {True: "LEAK", False: "stable", None: "inconclusive"}[self.memory_leak]
        lines = [
            f"  memory ({self.memory_source}, every {self.memory_sample_every} step(s), "
            f"{len(self.memory_steps)} samples): delta {self.memory_delta_gb * 1024:+.2f} MiB, "
            f"peak {(self.memory_peak_bytes or 0) / MiB:.2f} MiB, slope "
            f"{self.memory_slope_bytes_per_step or 0.0:+.1f} B/step -> {verdict} "
            f"(tolerance {self.leak_tolerance_mb} MiB over the run)"
        ]
        if self.memory_leak_reason:
            lines.append(
                f"  leak verdict from {self.memory_leak_source}: {self.memory_leak_reason}"
            )
        if self.memory_leak_cause:
            lines.append(f"  cause: {self.memory_leak_cause}")
        if self.memory_peak_text:
            lines.append(f"  {self.memory_peak_text}")
        return lines

    def __str__(self) -> str:
        return self.summary()

    def _html_fields(self) -> List[Tuple[str, str]]:
        s = self.stats
        rows = [
            ("device", f"{self.device} ({self.work.upper()} work, {self.timing_source} time)"),
            ("steps", f"{self.n_steps} (+{self.warmup_steps} warm-up)"),
            ("median / mean per step", f"{s.median_ms:.4f} / {s.mean_ms:.4f} ms"),
            ("p95 / p99", f"{s.p95_ms:.4f} / {s.p99_ms:.4f} ms"),
            ("std / jitter", f"{s.std_ms:.4f} / {s.jitter_ms:.4f} ms"),
            ("drift", f"{s.drift_ms:+.4f} ms ({s.drift_pct:+.1f}%)"),
            ("outliers", f"{len(s.outlier_steps)} step(s) above {s.outlier_threshold_ms:.4f} ms"),
            ("throughput", f"{self.steps_per_s:,.1f} steps/s [{self.throughput_source}]"),
        ]
        if self.ns_per_day is not None:
            rows.append(("ns/day", f"{self.ns_per_day:.3f} (dt {self.timestep_fs} fs)"))
        if self.memory_source is not None:
            rows += [
                (
                    f"memory ({self.memory_source})",
                    f"initial {fmt_bytes(self.memory_initial_bytes)}, "
                    f"final {fmt_bytes(self.memory_final_bytes)}, "
                    f"peak {fmt_bytes(self.memory_peak_bytes)}",
                ),
                ("memory slope", f"{self.memory_slope_bytes_per_step or 0.0:+.1f} B/step"),
                (
                    "leak verdict",
                    {True: "LEAK", False: "stable", None: "inconclusive"}[self.memory_leak]
                    + (f" (from {self.memory_leak_source})" if self.memory_leak_source else ""),
                ),
            ]
        return rows

    def _repr_html_(self) -> str:
        """The headline figures as a compact HTML table, for Jupyter; the warnings (a
        leak among them) and the leak verdict's reason under it."""
        notes = [f"leak verdict: {self.memory_leak_reason}"] if self.memory_leak_reason else []
        return html_fields(
            f"MD trajectory: {self.name}", self._html_fields(), notes=notes, warnings=self.warnings
        )

    def __repr__(self) -> str:
        return (
            f"TrajectoryResult(name={self.name!r}, device={self.device!r}, n_steps={self.n_steps}, "
            f"mean_ms={self.mean_ms:.4f}, p99_ms={self.p99_ms:.4f}, timing={self.timing_source!r}, "
            f"memory_leak={self.memory_leak})"
        )

    def to_dict(self, include_steps: bool = True) -> Dict[str, Any]:
        """Everything as plain JSON-able values (per-step series when ``include_steps``)."""
        d: Dict[str, Any] = {
            "name": self.name,
            "device": self.device,
            "n_steps": self.n_steps,
            "warmup_steps": self.warmup_steps,
            "timing_source": self.timing_source,
            "mean_ms": self.mean_ms,
            "median_ms": self.median_ms,
            "std_ms": self.std_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "p95_ms": self.p95_ms,
            "p99_ms": self.p99_ms,
            "jitter_ms": self.jitter_ms,
            "drift_ms": self.drift_ms,
            "drift_pct": self.drift_pct,
            "outlier_steps": self.outlier_steps,
            "host": self.host.to_dict(),
            "gpu": None if self.gpu is None else self.gpu.to_dict(),
            "total_time_s": self.total_time_s,
            "warmup_time_s": self.warmup_time_s,
            "steps_per_s": self.steps_per_s,
            "ns_per_day": self.ns_per_day,
            "us_per_atom_step": self.us_per_atom_step,
            "timestep_fs": self.timestep_fs,
            "n_atoms": self.n_atoms,
            "sync_every": self.sync_every,
            "event_every": self.event_every,
            "memory_source": self.memory_source,
            "memory_sample_every": self.memory_sample_every,
            "memory_initial_bytes": self.memory_initial_bytes,
            "memory_final_bytes": self.memory_final_bytes,
            "memory_peak_bytes": self.memory_peak_bytes,
            "memory_delta_gb": self.memory_delta_gb,
            "memory_slope_bytes_per_step": self.memory_slope_bytes_per_step,
            "memory_slope_all_bytes_per_step": self.memory_slope_all_bytes_per_step,
            "leak_tolerance_mb": self.leak_tolerance_mb,
            "memory_leak": self.memory_leak,
            "warnings": list(self.warnings),
            "work": self.work,
            "timing_method": self.timing_method,
            "synchronized": self.synchronized,
            "throughput_source": self.throughput_source,
            "events_coverage": self.events_coverage,
            "memory_leak_source": self.memory_leak_source,
            "memory_leak_reason": self.memory_leak_reason,
            "memory_noise_bytes": self.memory_noise_bytes,
            "memory_leak_where": self.memory_leak_where,
            "memory_leak_cause": self.memory_leak_cause,
            "memory_peak_text": self.memory_peak_text,
            "memory_headroom_bytes": self.memory_headroom_bytes,
        }
        if include_steps:
            d["host_times_ms"] = list(self.host_times_ms)
            d["gpu_times_ms"] = None if self.gpu_times_ms is None else list(self.gpu_times_ms)
            d["memory_steps"] = list(self.memory_steps)
            d["memory_bytes"] = list(self.memory_bytes)
            d["memory_series"] = {k: list(v) for k, v in self.memory_series.items()}
        # NaN is not JSON: drift_pct of a zero first decile, the std of one step: None.
        return json_safe(d)

    def to_json(self, indent: Optional[int] = 2, include_steps: bool = True) -> str:
        return json.dumps(self.to_dict(include_steps=include_steps), indent=indent)

    def plot(self, path: Optional[PathLike] = None, *, bins: int = 50) -> Any:
        """A per-step timeline (latency, outlier steps marked, memory on a second y axis
        with its fitted slope, red and labelled LEAK for a leak) above the latency
        histogram, as a matplotlib Figure; saved to ``path`` when given.

        Raises ``InvalidInputError`` when ``bins`` is not an int >= 1, ``ImportError``
        naming the fix when matplotlib is not installed.
        """
        from gpukeeper.md.trajectory_plot import plot_trajectory

        return plot_trajectory(self, path, bins=bins)

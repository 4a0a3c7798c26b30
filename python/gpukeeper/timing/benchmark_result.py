"""``BenchmarkResult``: the raw per-call times of one benchmark and what follows from them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple

from gpukeeper.base.byte_figures import fmt_bytes
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.html_table import html_fields
from gpukeeper.base.plotting import PathLike
from gpukeeper.timing import stats as _stats
from gpukeeper.timing.benchmark_plot import plot_benchmark
from gpukeeper.timing.loop_time import describe_bound
from gpukeeper.timing.units import duration_text

__all__ = ["BenchmarkResult"]

_GiB = float(1 << 30)

# Derived statistics: to_dict() writes them for readers of the JSON; from_dict()
# recomputes them from the raw times instead of trusting them.
_STAT_NAMES = (
    "n_calls",
    "mean_ms",
    "median_ms",
    "std_ms",
    "min_ms",
    "max_ms",
    "p5_ms",
    "p25_ms",
    "p75_ms",
    "p95_ms",
    "p99_ms",
    "iqr_ms",
    "relative_noise",
    "relative_iqr",
    "calls_per_s",
    "host_mean_ms",
    "host_median_ms",
    "loop_median_ms",
    "device_median_ms",
    "memory_delta_bytes",
    "memory_delta_gb",
)


@dataclass(repr=False)
class BenchmarkResult:
    """The per-call times of one benchmark and their statistics.

    Two times per call, and which one leads:

    - the **loop time** (``loop_times_ms``): the time per call when calls run back to
      back, as in a user's loop: one value per batch of ``loop_calls`` calls (the
      batch's wall clock from a synchronized start to the end of its work, divided by
      ``loop_calls``). On the CPU, each call's host time (``loop_calls`` 1);
    - the **device time** (``gpu_times_ms``): each call's own GPU work between events,
      with the launch hidden behind a gate where ``launch_latency`` is ``"hidden"``
      (None for work without events);
    - ``measure``: which of the two ``times_ms`` holds, and so the headline statistics,
      every speedup and every comparison: ``"loop"`` (the default) or ``"device"``;
    - ``device_busy``: the share of the loop time the device was busy (device median /
      loop median, at most 1); ``bound``: what sets the pace — ``"device"``,
      ``"launch"`` (the host's launches: the device waits between kernels), ``"sync"``
      (the call waits for the device inside) or ``"host"`` (CPU work); None where no
      device time was taken;
    - ``host_times_ms``: per-call host time, from before the call until its work was done
      (on a GPU: including the wait for its stop event); ``loop_issue_ms``: per batch,
      the host's time to issue one call (before the batch's final wait).

    Statistics of ``times_ms`` (milliseconds): ``mean_ms``, ``median_ms``, ``std_ms``
    (sample std), ``min_ms``, ``max_ms``, ``p5_ms``, ``p25_ms``, ``p75_ms``, ``p95_ms``,
    ``p99_ms``, ``iqr_ms``; ``relative_noise`` = std/mean (nvbench's "noise"),
    ``relative_iqr`` = IQR/median (robust); ``n_calls`` is the number of those samples
    (with ``measure="loop"`` on a GPU: batches). ``loop_median_ms`` and
    ``device_median_ms`` give both medians whatever the measure; ``calls_per_s`` is from
    the loop time.

    Memory (bytes; None where nothing could be read): ``memory_before_bytes``,
    ``memory_after_bytes``, ``memory_peak_bytes`` as read from ``memory_source``
    (``"torch"``: PyTorch's allocated bytes on the device; ``"cupy"``: CuPy's pool;
    ``"gpukeeper"``/``"gpukeeper_torch_allocator"``: gpukeeper's pools (PyTorch
    allocating through ``use_torch_allocator()``); ``"frameworks"``: the sum over several
    loaded frameworks; ``"host_rss"``: the process's resident set on the CPU; ``"jax"``:
    JAX's allocator statistics (``bytes_in_use``); ``"nvml_process"``: NVML's figure for
    this process, for work no framework's counters see: an engine's own CUDA context).
    ``memory_peak_bytes`` is there only where the source keeps a peak (PyTorch's
    resettable one, JAX's when the run raised it); the sum over several frameworks has
    none, so it is None then.
    ``memory_delta_gb`` is (after - before) in GiB, as the MD examples read it.
    ``memory_outside_bytes``: how much the memory outside every framework grew over the
    calls (NVML's figure for this process less the frameworks' reserved bytes: what an
    engine or an extension allocates past them; None where it is not read). Growth past
    32 MiB is also said in ``warnings``.

    ``launch_latency``: ``"hidden"`` when each call's GPU time was taken behind a gate
    (the device's work alone, see ``benchmark_function``), ``"included"`` when the
    launch latency of the call's first kernel is inside its GPU time, ``"n/a"`` for host
    timing. ``gpu_floor_ms``: with hidden launch latency, the device's own cost of the
    gated event bracket (the median of the empty-kernel brackets taken in place beside
    the last calls), as subtracted from the last GPU times; None otherwise.

    Conditions: ``noisy`` (relative noise above the limit), ``throttled`` (True/False
    from NVML, None when unknown), ``recompiles`` (torch.compile frames compiled while
    measuring), and ``warnings`` (one readable line each).

    What was timed: ``work`` is ``"gpu"`` or ``"cpu"`` (where ``fn``'s work runs: JAX
    work or an engine's own CUDA context is GPU work timed on the host clock);
    ``timing_method`` says how each call was timed, in words; ``synchronized`` is True
    when each call's time ends at a wait for its work, False when gpukeeper could not
    wait for it (an engine without a ``synchronize`` callable), None when it cannot tell.
    """

    name: str
    times_ms: List[float]
    host_times_ms: List[float] = field(default_factory=list)
    gpu_times_ms: Optional[List[float]] = None
    timing: str = "host"
    device: str = "cpu"
    backend: str = "cpu"
    warmup: int = 0
    l2_flush: bool = False
    launch_latency: str = "n/a"
    gpu_floor_ms: Optional[float] = None
    stop_reason: str = "n_calls"
    total_time_s: float = 0.0
    memory_before_bytes: Optional[int] = None
    memory_after_bytes: Optional[int] = None
    memory_peak_bytes: Optional[int] = None
    memory_source: Optional[str] = None
    memory_outside_bytes: Optional[int] = None
    noisy: bool = False
    throttled: Optional[bool] = None
    recompiles: int = 0
    warnings: List[str] = field(default_factory=list)
    clocks: Dict[str, Any] = field(default_factory=dict)
    speedup: Optional[float] = None
    work: Optional[str] = None
    timing_method: str = ""
    synchronized: Optional[bool] = None
    measure: Optional[str] = None
    loop_times_ms: Optional[List[float]] = None
    loop_calls: int = 1
    loop_issue_ms: Optional[List[float]] = None
    bound: Optional[str] = None
    device_busy: Optional[float] = None

    def __post_init__(self) -> None:
        if not self.times_ms:
            raise InvalidInputError(f"BenchmarkResult {self.name!r} needs at least one time")
        if self.work is None:
            # Results saved before the field existed: events meant GPU work.
            self.work = "gpu" if self.timing == "gpu" else "cpu"
        if self.work not in ("gpu", "cpu"):
            raise InvalidInputError(
                f"BenchmarkResult work must be 'gpu' or 'cpu', got {self.work!r}"
            )
        if self.measure is None:
            # Results saved before loop time existed: GPU results held device time.
            self.measure = "device" if self.timing == "gpu" else "loop"
        if self.measure not in ("loop", "device"):
            raise InvalidInputError(
                f"BenchmarkResult measure must be 'loop' or 'device', got {self.measure!r}"
            )
        self.times_ms = [float(t) for t in self.times_ms]
        self.host_times_ms = [float(t) for t in self.host_times_ms]
        if self.gpu_times_ms is not None:
            self.gpu_times_ms = [float(t) for t in self.gpu_times_ms]
        if self.loop_times_ms is not None:
            self.loop_times_ms = [float(t) for t in self.loop_times_ms]
        if self.loop_issue_ms is not None:
            self.loop_issue_ms = [float(t) for t in self.loop_issue_ms]
        self._summary = _stats.summarize(self.times_ms)
        self._host = _stats.summarize(self.host_times_ms) if self.host_times_ms else None
        self._loop = _stats.summarize(self.loop_times_ms) if self.loop_times_ms else None
        device = (
            self.gpu_times_ms
            if self.gpu_times_ms
            else (self.host_times_ms if self.work == "cpu" else None)
        )
        self._device = _stats.summarize(device) if device else None

    # ----------------------------------------------------------------- statistics

    @property
    def stats(self) -> _stats.SampleStats:
        """All statistics of ``times_ms`` in one object."""
        return self._summary

    @property
    def n_calls(self) -> int:
        return self._summary.count

    @property
    def mean_ms(self) -> float:
        return self._summary.mean

    @property
    def median_ms(self) -> float:
        return self._summary.median

    @property
    def std_ms(self) -> float:
        return self._summary.std

    @property
    def min_ms(self) -> float:
        return self._summary.min

    @property
    def max_ms(self) -> float:
        return self._summary.max

    @property
    def p5_ms(self) -> float:
        return self._summary.p5

    @property
    def p25_ms(self) -> float:
        return self._summary.p25

    @property
    def p75_ms(self) -> float:
        return self._summary.p75

    @property
    def p95_ms(self) -> float:
        return self._summary.p95

    @property
    def p99_ms(self) -> float:
        return self._summary.p99

    @property
    def iqr_ms(self) -> float:
        return self._summary.iqr

    @property
    def relative_noise(self) -> float:
        """std / mean of ``times_ms`` (fraction; nan for one call)."""
        return self._summary.relative_std

    @property
    def relative_iqr(self) -> float:
        """IQR / median of ``times_ms`` (fraction)."""
        return self._summary.relative_iqr

    @property
    def host_mean_ms(self) -> Optional[float]:
        return self._host.mean if self._host else None

    @property
    def host_median_ms(self) -> Optional[float]:
        return self._host.median if self._host else None

    @property
    def loop_stats(self) -> Optional[_stats.SampleStats]:
        """Statistics of the loop time per call (None for results saved without it)."""
        return self._loop

    @property
    def device_stats(self) -> Optional[_stats.SampleStats]:
        """Statistics of the device time per call (the host time for CPU work; None for
        GPU work without events)."""
        return self._device

    @property
    def loop_median_ms(self) -> Optional[float]:
        """Median loop time per call: what a loop of back-to-back calls sees."""
        return self._loop.median if self._loop else None

    @property
    def device_median_ms(self) -> Optional[float]:
        """Median device time per call: the call's own work, launch hidden."""
        return self._device.median if self._device else None

    @property
    def calls_per_s(self) -> float:
        """Calls per second a loop of calls achieves (from the loop time; the host times
        for results saved without one)."""
        if self._loop:
            mean = self._loop.mean
        else:
            mean = self._host.mean if self._host else self._summary.mean
        return 1e3 / mean if mean > 0 else math.inf

    # seconds, for readers of the older API
    @property
    def mean_s(self) -> float:
        return self.mean_ms / 1e3

    @property
    def memory_delta_bytes(self) -> Optional[int]:
        if self.memory_before_bytes is None or self.memory_after_bytes is None:
            return None
        return self.memory_after_bytes - self.memory_before_bytes

    @property
    def memory_delta_gb(self) -> Optional[float]:
        """(after - before) in GiB; None when memory was not read."""
        delta = self.memory_delta_bytes
        return None if delta is None else delta / _GiB

    @property
    def memory_peak_gb(self) -> Optional[float]:
        return None if self.memory_peak_bytes is None else self.memory_peak_bytes / _GiB

    # ----------------------------------------------------------------- text

    def _headline_words(self) -> str:
        if self.measure == "device":
            return "device time per call (the call's own GPU work" + (
                ", launch hidden)" if self.launch_latency == "hidden" else ")"
            )
        if self.work == "gpu" and self.loop_times_ms is not None:
            return "loop time per call (calls back to back, as a loop runs them)"
        return "time per call"

    def _other_rows(self) -> List[Tuple[str, str]]:
        """(label, text): the time the headline is not of, and what bounds the call."""
        rows: List[Tuple[str, str]] = []
        if self.measure == "loop" and self.gpu_times_ms and self._device is not None:
            d = self._device
            rows.append(
                (
                    "device time per call",
                    f"median {duration_text(d.median)}, p95 {duration_text(d.p95)} "
                    f"(the call's own GPU work, launch {self.launch_latency})",
                )
            )
        elif self.measure == "device" and self._loop is not None and self.work == "gpu":
            rows.append(
                (
                    "loop time per call",
                    f"median {duration_text(self._loop.median)} "
                    "(calls back to back, as a loop sees them)",
                )
            )
        if self.work == "gpu" and self.device_busy is not None:
            rows.append(("device busy", f"{self.device_busy * 100:.0f} % of the loop time"))
        if self.work == "gpu" and (self.bound is not None or self.loop_times_ms is not None):
            rows.append(("bound by", describe_bound(self.bound)))
        return rows

    def _how(self) -> str:
        """How the calls were timed, each word once: "GPU work, device time, torch"."""
        work = (self.work or "cpu").upper()
        parts = [f"{work} work", f"{self.timing} time"]
        if self.backend and self.backend.lower() not in (str(self.device).lower(), work.lower()):
            parts.append(self.backend)
        return ", ".join(parts)

    def summary(self) -> str:
        """A few readable lines: the headline statistics (saying which time they are of),
        the other time, what bounds the call, throughput, memory, warnings."""
        s = self._summary
        counted = (
            f"{s.count} batches of {self.loop_calls} calls"
            if self.measure == "loop" and self.loop_calls > 1
            else f"{s.count} calls"
        )
        d = duration_text
        lines = [
            f"{self.name}: {counted} on {self.device} ({self._how()})",
            f"  {self._headline_words()}:",
            f"  mean   {d(s.mean)} ± {d(s.std)} (noise {_pct(s.relative_std)})",
            f"  median {d(s.median)}  IQR {d(s.iqr)} ({_pct(s.relative_iqr)})",
            f"  min {d(s.min)}  p5 {d(s.p5)}  p25 {d(s.p25)}  p75 {d(s.p75)}  "
            f"p95 {d(s.p95)}  p99 {d(s.p99)}  max {d(s.max)}",
            f"  throughput {self.calls_per_s:,.1f} calls/s",
        ]
        lines += [f"  {label}: {text}" for label, text in self._other_rows()]
        if self.timing_method:
            lines.insert(1, f"  timed: {self.timing_method}")
        if self.gpu_times_ms is not None and self._host is not None:
            lines.append(
                f"  host latency median {duration_text(self._host.median)} "
                "(launch + wait of one call)"
            )
            lines.append(f"  launch latency {self.launch_latency} in the GPU times")
        if self.memory_source is not None:
            lines.append(
                f"  memory ({self.memory_source}) before "
                f"{_bytes_text(self.memory_before_bytes)}, after "
                f"{_bytes_text(self.memory_after_bytes)}, peak "
                f"{_bytes_text(self.memory_peak_bytes)}"
            )
        if self.speedup is not None:
            lines.append(f"  speedup {self.speedup:.2f}x")
        for warning in self.warnings:
            lines.append(f"  WARNING: {warning}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        s = self._summary
        extra = "".join(
            [
                ", noisy" if self.noisy else "",
                ", throttled" if self.throttled else "",
                f", recompiles={self.recompiles}" if self.recompiles else "",
                f", speedup={self.speedup:.2f}x" if self.speedup is not None else "",
            ]
        )
        if self.bound is not None and self.work == "gpu":
            extra += f", bound={self.bound}"
        return (
            f"BenchmarkResult({self.name!r}, {self.measure} median={s.median:.4f} ms, "
            f"mean={s.mean:.4f} ms, "
            f"std={s.std:.4f} ms, p99={s.p99:.4f} ms, n={s.count}, {self.timing} on "
            f"{self.device}{extra})"
        )

    __str__ = summary

    def _html_fields(self) -> List[Tuple[str, str]]:
        s = self._summary
        rows = [
            ("device", f"{self.device} ({self._how()})"),
            ("headline", self._headline_words()),
            ("samples", f"{s.count}"),
            ("median", f"{s.median:.4f} ms"),
            ("mean ± std", f"{s.mean:.4f} ± {s.std:.4f} ms"),
            ("p5 / p25 / p75", f"{s.p5:.4f} / {s.p25:.4f} / {s.p75:.4f} ms"),
            ("p95 / p99", f"{s.p95:.4f} / {s.p99:.4f} ms"),
            ("min / max", f"{s.min:.4f} / {s.max:.4f} ms"),
            ("noise (std/mean, IQR/median)", f"{_pct(s.relative_std)}, {_pct(s.relative_iqr)}"),
            ("throughput", f"{self.calls_per_s:,.1f} calls/s"),
        ]
        rows += self._other_rows()
        if self.timing_method:
            rows.insert(1, ("timed", self.timing_method))
        if self.memory_source is not None:
            rows.append(
                (f"memory delta ({self.memory_source})", _bytes_text(self.memory_delta_bytes))
            )
            rows.append(("memory peak", _bytes_text(self.memory_peak_bytes)))
        if self.speedup is not None:
            rows.append(("speedup", f"{self.speedup:.2f}x"))
        return rows

    def _repr_html_(self) -> str:
        """The summary as a compact HTML table, for Jupyter."""
        return html_fields(
            f"BenchmarkResult: {self.name}", self._html_fields(), warnings=self.warnings
        )

    def plot(self, path: Optional[PathLike] = None, *, bins: int = 50) -> Any:
        """The histogram of the per-call times with the mean, median, p5, p95 and p99
        marked, as a matplotlib Figure; saved to ``path`` when given.

        Raises ``InvalidInputError`` when ``bins`` is not an int >= 1, ``ImportError``
        naming the fix when matplotlib is not installed.
        """
        return plot_benchmark(self, path, bins=bins)

    # ----------------------------------------------------------------- serialisation

    def to_dict(self) -> Dict[str, Any]:
        """Raw fields plus the derived statistics, JSON-ready (nan/inf become None)."""
        data: Dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        data["warnings"] = list(self.warnings)
        data["clocks"] = dict(self.clocks)
        for name in _STAT_NAMES:
            data[name] = getattr(self, name)
        return _json_safe(data)

    def to_json(self, indent: Optional[int] = 2) -> str:
        """``to_dict()`` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "BenchmarkResult":
        """Rebuilds a result from ``to_dict()`` output (derived statistics are recomputed)."""
        if not isinstance(data, dict):
            raise InvalidInputError(f"from_dict needs a dict, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise InvalidInputError(f"not a BenchmarkResult dict: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> "BenchmarkResult":
        """Rebuilds a result from ``to_json()`` output."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"not BenchmarkResult JSON: {exc}") from None
        return cls.from_dict(data)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def _pct(fraction: float) -> str:
    return "n/a" if math.isnan(fraction) else f"{fraction * 100:.2f} %"


def _bytes_text(value: Optional[int]) -> str:
    return fmt_bytes(value, unknown="n/a")

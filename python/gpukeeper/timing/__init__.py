"""Timing that is right on an asynchronous GPU, and the same code on a CPU.

- ``CUDATimer`` (``timer``): events on the current stream (PyTorch's, else CuPy's, else
  gpukeeper's own events), a steady host clock without a GPU; ``hide_launch_latency``
  for timing kernels (the gate and the launch-floor subtraction live here only);
  ``time_call`` for one call, waited for; a small backend layer (``select_backend``,
  ``register_backend``).
- ``benchmark_function`` (``benchmark``): warm-up, per-call ``CUDATimer.time_call``
  behind a launch-latency gate (the device time), the loop time of back-to-back calls
  and the verdict on what bounds a call (``loop_time``), optional L2 flush (``l2``),
  nvbench-style noise-based stopping (``stopping``), throttle detection (``throttle``);
  returns a ``BenchmarkResult`` (``benchmark_result``).
- The measurement core that ``benchmark_function`` and ``benchmark_md_trajectory``
  share: ``plans`` (``Plan``: where the work runs and how it is waited for, with the one
  auto-device rule and the engine warning), ``memory_readers`` (the memory series and the one
  rule that picks the memory of the work measured: NVML's figure for an engine's work),
  ``sampling`` (memory before/after/peak of a run, and between an MD run's steps),
  ``latency`` (``LatencyStats``: ``SampleStats`` of a per-step series with jitter, drift
  and outliers).
- ``compare_implementations`` / ``print_comparison_table`` (``compare``): side by side,
  with the differences that are within the noise marked; the comparison is an
  ``ImplementationComparison`` (a dict) with ``table()``, rich display and ``plot()``.
- ``benchmark_plot`` and ``comparison_plot``: the figures of ``BenchmarkResult.plot()`` and
  ``ImplementationComparison.plot()`` (matplotlib imported only then); ``speedup``: a
  speedup against the baseline as both write it.
- ``compare_runs`` (``regression``): one benchmark against a saved run of it, with a
  noise-aware verdict (faster, slower, same, undecided); ``store``: saved runs per machine.
- ``ProfilerContext``: the PyTorch profiler with a chrome trace and a summary table.
- ``stats``: the statistics, pure functions matching numpy's defaults.
"""

from gpukeeper.base.device_names import DeviceSpec
from gpukeeper.timing import stats
from gpukeeper.timing.benchmark import NOISY_THRESHOLD, benchmark_function
from gpukeeper.timing.benchmark_result import BenchmarkResult
from gpukeeper.timing.implementations import (
    ImplementationComparison,
    compare_implementations,
    format_comparison_table,
    print_comparison_table,
)
from gpukeeper.timing.l2 import L2Flusher, l2_cache_size
from gpukeeper.timing.profiler import ProfilerContext
from gpukeeper.timing.regression import Comparison, compare_runs
from gpukeeper.timing.stats import NoiseCriterion, SampleStats, summarize
from gpukeeper.timing.timer import (
    CoreBackend,
    CpuBackend,
    CUDATimer,
    CupyBackend,
    TimerBackend,
    TorchBackend,
    available_backends,
    register_backend,
    select_backend,
    timing_device,
)

__all__ = [
    "BenchmarkResult",
    "CUDATimer",
    "Comparison",
    "CoreBackend",
    "CpuBackend",
    "CupyBackend",
    "DeviceSpec",
    "ImplementationComparison",
    "L2Flusher",
    "NOISY_THRESHOLD",
    "NoiseCriterion",
    "ProfilerContext",
    "SampleStats",
    "TimerBackend",
    "TorchBackend",
    "available_backends",
    "benchmark_function",
    "compare_implementations",
    "compare_runs",
    "format_comparison_table",
    "l2_cache_size",
    "print_comparison_table",
    "register_backend",
    "timing_device",
    "select_backend",
    "stats",
    "summarize",
]

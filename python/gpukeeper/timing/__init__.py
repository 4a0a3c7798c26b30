"""Timing that is right on an asynchronous GPU, and the same code on a CPU.

- ``CUDATimer``: events on the current stream (PyTorch's, else CuPy's, else gpukeeper's
  own events), a steady host clock without a GPU; ``hide_launch_latency`` for timing
  kernels; a small backend layer (``select_backend``, ``register_backend``).
- ``benchmark_function``: warm-up, per-call events behind a launch-latency gate,
  optional L2 flush, nvbench-style
  noise-based stopping, throttle detection; returns a ``BenchmarkResult``.
- ``compare_implementations`` / ``print_comparison_table``: side by side, with the
  differences that are within the noise marked.
- ``ProfilerContext``: the PyTorch profiler with a chrome trace and a summary table.
- ``stats``: the statistics, pure functions matching numpy's defaults.
"""

from gpukeeper.timing import stats
from gpukeeper.timing.benchmark import (
    NOISY_THRESHOLD,
    L2Flusher,
    benchmark_function,
    compare_implementations,
    format_comparison_table,
    l2_cache_size,
    print_comparison_table,
)
from gpukeeper.timing.profiler import ProfilerContext
from gpukeeper.timing.result import BenchmarkResult
from gpukeeper.timing.stats import NoiseCriterion, SampleStats, summarize
from gpukeeper.devices import DeviceSpec
from gpukeeper.timing.timer import (
    CoreBackend,
    CpuBackend,
    CUDATimer,
    CupyBackend,
    TimerBackend,
    TorchBackend,
    available_backends,
    register_backend,
    timing_device,
    select_backend,
)

__all__ = [
    "BenchmarkResult",
    "CUDATimer",
    "CoreBackend",
    "CpuBackend",
    "CupyBackend",
    "DeviceSpec",
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
    "format_comparison_table",
    "l2_cache_size",
    "print_comparison_table",
    "register_backend",
    "timing_device",
    "select_backend",
    "stats",
    "summarize",
]

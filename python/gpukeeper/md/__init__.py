"""Per-step profiling of molecular-dynamics loops: ``benchmark_md_trajectory`` and its result.

An MD run calls a force-field model millions of times; what matters is the latency of
each step, its tail and its stability over the run, and memory that must not creep.

>>> result = benchmark_md_trajectory(
...     model_func=lambda atoms: model(atoms),
...     inputs=trajectory,
...     check_memory_leak=True,
...     timestep_fs=0.5, n_atoms=64,
... )
>>> print(f"Mean latency: {result.mean_ms:.4f} ms")
>>> print(f"Memory delta: {result.memory_delta_gb * 1024:.2f} MiB")
>>> print(result.summary())

The package, one concern a module:

- :mod:`~gpukeeper.md.trajectory`: ``benchmark_md_trajectory`` (checks, warm-up, plan,
  loop, result), the step statistics and the throughput;
- :mod:`~gpukeeper.md.loop`: the measured loop (one loop for every option);
- :mod:`~gpukeeper.md.events`: GPU event marks every k-th step, the choice of k, and the
  timing method they make;
- :mod:`~gpukeeper.md.leak`: leak verdicts;
- :mod:`~gpukeeper.md.trajectory_result`: ``TrajectoryResult``;
  :mod:`~gpukeeper.md.trajectory_plot`: its figure.

What it shares with ``benchmark_function`` is timing's, so that both decide and read
alike: where the work runs (:mod:`gpukeeper.timing.plans`), the memory series and the
rule that picks them (:mod:`gpukeeper.timing.memory_readers`), their sampler
(:mod:`gpukeeper.timing.sampling`), and the statistics (``LatencyStats``,
:mod:`gpukeeper.timing.latency`, over :mod:`gpukeeper.timing.stats`).

How it measures (and why):

- **Host latency** of a step is ``perf_counter_ns`` around the model call. Without
  synchronization the GPU runs behind the host, so on CUDA this is the launch cost.
  It is measured for every step.
- **GPU time** comes from CUDA events on the current stream ("marks", gpukeeper's pooled
  events; PyTorch's or CuPy's with a core built without CUDA). A mark ends the interval
  since the previous one, so one record per interval, not a start/end pair. A record
  costs the host 1-2 us and the device ~1.9 us, so by default (``event_every="auto"``) a
  mark is recorded only after every k-th step, k chosen from the warm-up's step time
  (its second half timed between two device waits) so that the marks cost the device at
  most 0.5% of a step and the host at most 0.4 us a step (at most ``n_steps // 32``, so
  there are at least ~32 intervals; with no warm-up steps, the host's budget alone
  decides). A step's GPU time (``gpu_times_ms[i]``) is then its
  interval's GPU time divided over the interval's steps: the mean and the throughput are
  exact, while the median, percentiles, std, jitter and outliers of ``gpu`` describe
  interval means. ``event_every=1`` records a mark after every step and gives each step
  its own GPU time; ``result.event_every`` is the k used. Where the loop does host work
  between two steps (a memory sample, the progress bar), the step before ends an interval
  and a fresh origin is recorded after the work, so it is not counted. In a GPU-bound
  loop a step's time is the device's time for its work; in a launch-bound loop it is the
  time the device waited for the launches too: what the step really costs. Nothing is
  synchronized per step: marks live in a ring of ``event_ring`` and are resolved after
  the loop (or, on longer runs, when the ring is full, outside every measured window).
  The statistics (``mean_ms`` ...) use GPU time when it was measured, else host latency
  (``timing_source`` says which; ``timing="host"`` forces host).
- ``sync_every=k`` synchronizes the device inside the measured window of every k-th step,
  so those steps' host latency is the true end-to-end latency (1: every step).
- **Memory** is sampled between steps, never inside the measured window. On CUDA it is
  the bytes allocated by the loaded frameworks (gpukeeper's own counters when PyTorch
  allocates through ``use_torch_allocator()``: about a microsecond; PyTorch's counters
  otherwise: 45-70 us a read, hence sampling), cross-checked at the start and the end
  against NVML's figure for this process: device memory that grows and that no counter
  explains (an engine allocating in its own context) is a warning. Where the work is
  not a framework's (an engine's own CUDA context, a ``synchronize`` callable was
  given, or the frameworks' counters hold nothing on the device while NVML sees this
  process holding memory there) it is NVML's figure for this process
  (``"nvml_process"``), whatever else is imported; for JAX steps,
  JAX's ``bytes_in_use``. In CPU mode three series are sampled: the process's resident
  set size (``memory_source`` ``"process_rss"``, what ``memory_delta_gb`` reports), and
  the in-use counts that exist: glibc's ``mallinfo2()`` (``"malloc_in_use"``) and
  ``tracemalloc`` when it is tracing (``memory_series`` holds them all).
  ``memory_sample_every="auto"`` keeps the reading's cost under 0.4 us per step and
  under 0.25% of the warm-up's median step (a read every ``ceil(cost / budget)`` steps,
  a multiple of the event period with GPU events), with at least 16 samples over the
  run.
- **Leak verdict** (:func:`leak_verdict`): the least-squares slope (bytes per step) of
  the samples taken in the *second half* of the measured steps, projected over the run
  and compared with ``leak_tolerance_mb``. A slope, not two end points: one late
  allocation or a cache that fills in the first steps (a caching allocator warming up)
  is growth, not a leak. Under noise: the series' noise is the largest move between two
  samples that the steady per-step move does not explain; when it exceeds the tolerance
  the verdict is ``None`` ("inconclusive: process_rss noise 12 MiB > tolerance 1 MiB"),
  unless the growth is also over 4 times the noise. In CPU mode the in-use counts
  decide (RSS also moves when the C allocator keeps or returns pages: tens of MiB in a
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
- The statistics are :mod:`gpukeeper.timing.stats`': standard deviations are *sample*
  ones (``ddof=1``, ``nan`` for a single value), percentiles interpolate linearly
  (numpy's default method).

The bookkeeping per step is two ``perf_counter_ns`` calls, a subtraction, one store in a
preallocated ``array`` and one integer comparison (plus, every k-th step with GPU timing,
one event record): well under a microsecond of host time
(``benchmarks/python/md_overhead_bench.py`` measures it).
"""

from gpukeeper.md.leak import LeakVerdict, leak_verdict
from gpukeeper.md.trajectory import benchmark_md_trajectory
from gpukeeper.md.trajectory_result import LatencyStats, TrajectoryResult, latency_stats

__all__ = [
    "TrajectoryResult",
    "benchmark_md_trajectory",
    "LatencyStats",
    "latency_stats",
    "LeakVerdict",
    "leak_verdict",
]

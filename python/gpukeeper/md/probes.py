"""Memory probes of an MD run: the series read between steps, their sampler, the NVML cross-check.

- In CPU mode: the process's resident set size (what the process holds) first, then the
  in-use counts that exist here (``tracemalloc`` when it is tracing, glibc's
  ``mallinfo2``).
- On CUDA: the frameworks' allocated bytes (gpukeeper's own counters when PyTorch
  allocates through ``use_torch_allocator()``: about a microsecond a read; PyTorch's
  counters otherwise: 45-70 us), NVML's figure for this process where the work is not a
  framework's, JAX's ``bytes_in_use`` for JAX steps; NVML also cross-checks the
  frameworks' counters at the start and the end of the run.
"""

from __future__ import annotations

import math
import time
import tracemalloc
from array import array
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from gpukeeper import frameworks, host, nvml

__all__ = [
    "MemorySeries",
    "MemorySampler",
    "host_series",
    "cuda_probe",
    "device_series",
    "cross_reading",
    "cross_check_warning",
    "sample_period",
    "SAMPLE_BUDGET_NS",
    "SLOW_READER_NS",
]

MB = float(1 << 20)

#: "auto" keeps the memory reads under this many ns per step (with ~0.2 us for the
#: timing, the whole bookkeeping stays under 1 us whatever the step costs).
SAMPLE_BUDGET_NS = 400.0
#: A memory reader this slow (ns a read) is sampled by its share of the run, not by count.
SLOW_READER_NS = 200_000


class MemorySeries:
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


def host_series() -> List[MemorySeries]:
    """RSS (what the process holds) first, then the in-use counts that exist here:
    tracemalloc when it is tracing, glibc's mallinfo2."""
    rss = host.RssReader()
    series = [MemorySeries(rss.source, rss, False, rss.close)]
    if tracemalloc.is_tracing():
        series.append(MemorySeries("tracemalloc", lambda: int(tracemalloc.get_traced_memory()[0]), True))
    in_use = host.malloc_in_use_reader()
    if in_use is not None:
        series.append(MemorySeries("malloc_in_use", in_use, True))
    return series


def cuda_probe(index: int) -> Tuple[Callable[[], int], str]:
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


def _jax_series(index: int) -> Optional[MemorySeries]:
    stats = frameworks.jax_memory_stats(index)
    if stats is None or "bytes_in_use" not in stats:
        return None

    def read_jax() -> int:
        s = frameworks.jax_memory_stats(index) or {}
        return int(s.get("bytes_in_use", 0))

    return MemorySeries("jax", read_jax, True)


def device_series(kind: str, index: Optional[int], synchronize: Optional[Callable[[], Any]],
                  notes: List[str]) -> Tuple[List[MemorySeries], Optional[MemorySeries]]:
    """The memory series of a GPU run (the first decides) and an NVML cross-check.

    ``kind`` is the plan's (:class:`gpukeeper.md.plan.Plan`). The frameworks' counters
    where the work is theirs; NVML's figure for this process where it is not (an
    engine's own context, or a ``synchronize`` that says the steps run somewhere
    gpukeeper cannot wait for); JAX's allocator statistics for JAX.
    """
    index = index if index is not None else 0
    nvml_read, why = nvml.process_memory_reader(index)
    nvml_series = MemorySeries("nvml_process", nvml_read, False) if nvml_read is not None else None
    if kind == "jax":
        jax = _jax_series(index)
        if jax is not None:
            return [jax], nvml_series
        notes.append("JAX gives no memory statistics on this device")
    elif kind in ("events", "framework"):
        reserved = sum(m.reserved or 0 for m in frameworks.memory_by_framework(index).values())
        if nvml_series is None or (synchronize is None and reserved > 0):
            probe, source = cuda_probe(index)
            return [MemorySeries(source, probe, True)], nvml_series
    if nvml_series is not None:
        return [nvml_series], None
    notes.append(f"the device memory of this process cannot be read (NVML {why}): "
                 "host memory is watched instead")
    return host_series(), None


def cross_reading(cross: Optional[MemorySeries], index: Optional[int]) -> Optional[Tuple[int, int]]:
    """(NVML bytes of this process, frameworks' reserved bytes) on the device, for the
    check that the frameworks' counters explain the process's device memory."""
    if cross is None or index is None:
        return None
    try:
        reserved = sum(m.reserved or 0 for m in frameworks.memory_by_framework(index).values())
        return cross.read(), reserved
    except Exception:
        return None


def cross_check_warning(before: Optional[Tuple[int, int]], after: Optional[Tuple[int, int]],
                        series: Sequence[MemorySeries], leak_tolerance_mb: float,
                        warnings: List[str]) -> None:
    """Says so when this process's device memory (NVML) grew by more than the frameworks'
    counters explain over the run."""
    if before is None or after is None:
        return
    grew = (after[0] - before[0]) - (after[1] - before[1])
    if grew > leak_tolerance_mb * MB:
        warnings.append(
            f"this process's device memory grew by {grew / MB:.2f} MB that no framework counter "
            f"explains (NVML {before[0] / MB:.1f} -> {after[0] / MB:.1f} MB; frameworks "
            f"reserved {before[1] / MB:.1f} -> {after[1] / MB:.1f} MB): another engine "
            f"or CUDA context in this process allocates it, and the leak verdict reads "
            f"{series[0].name if series else 'nothing'} (pass synchronize= to read NVML)")


def sample_period(series: Sequence[MemorySeries], memory_sample_every: Union[int, str], n: int,
                  warm_ns: Sequence[int], align: int = 1) -> int:
    """Steps between memory samples: as given, or "auto" from the cost of a reading of
    every series, measured here: a read every ``ceil(cost / 0.4 us)`` steps, with at
    least 16 samples over the run (fewer, at least 3, when a slow reader such as NVML's
    process list would cost more than 0.5% of the run). ``align``: under "auto", the
    period is made a multiple of it (the GPU event interval, so that a sample falls on a
    step that ends an interval anyway) while that keeps 16 samples."""
    if memory_sample_every != "auto":
        return int(memory_sample_every)
    costs = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for s in series:
            s.read()
        costs.append(time.perf_counter_ns() - t0)
    cost = sorted(costs)[2]
    every = max(1, math.ceil(cost / SAMPLE_BUDGET_NS))
    every = min(every, max(1, n // 16))
    # An OpenMM loop of 400 calls ran ~3% slower with 16 NVML reads (ms each): a slow
    # reader gets fewer samples. Faster readers (PyTorch's counters: 45-80 us) keep 16.
    step_ns = sorted(warm_ns)[len(warm_ns) // 2] if warm_ns else 0
    if step_ns > 0 and cost > SLOW_READER_NS and 16 * cost > 0.005 * n * step_ns:
        every = max(every, min(max(1, n // 3), math.ceil(cost / (0.005 * step_ns))))
    if align > 1:
        up = -(-every // align) * align
        every = up if up <= max(1, n // 16) else max(align, (every // align) * align)
    return every


class MemorySampler:
    """The readings of a run, in preallocated arrays: slot 0 holds the reading before
    step 0 (step -1), then one after every ``every``-th step. Array stores keep no Python
    objects alive per sample, so the bookkeeping neither allocates nor grows the memory
    it watches."""

    def __init__(self, series: List[MemorySeries], every: int, n: int) -> None:
        self.series = series
        self.readers = [s.read for s in series]
        self.every = every
        size = n // every + 2
        self.steps = array("q", bytes(8 * size))
        self.values = [array("q", bytes(8 * size)) for _ in series]
        self.count = 0
        self._pairs = list(zip(self.values, self.readers))

    def start(self) -> List[int]:
        """Takes the reading before the first step (recorded as step -1); returns it."""
        first = [r() for r in self.readers]
        self.steps[0] = -1
        for k, v in enumerate(first):
            self.values[k][0] = v
        self.count = 1
        return first

    def sample(self, i: int) -> None:
        """Takes the reading after step ``i``."""
        c = self.count
        self.steps[c] = i
        for values, read in self._pairs:
            values[c] = read()
        self.count = c + 1

    def finish(self) -> List[int]:
        """Takes the reading after the loop (and its synchronization), closes the series."""
        last = [r() for r in self.readers]
        for s in self.series:
            s.close()
        return last

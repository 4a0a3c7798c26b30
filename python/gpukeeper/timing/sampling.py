"""Memory sampled over a measured run: between its steps and around it.

``StepSampler`` samples between steps, ``MemorySampler`` around the run.
Both read the series that :func:`gpukeeper.timing.memory_readers.memory_series` picks, so a
benchmark's ``memory_source`` and an MD run's leak verdict come from the same memory.
"""

from __future__ import annotations

import math
import time
from array import array
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from gpukeeper.timing.memory_readers import (
    MemorySeries,
    cross_reading,
    memory_series,
    outside_growth,
)

__all__ = [
    "MemorySampler",
    "StepSampler",
    "sample_period",
    "SAMPLE_BUDGET_NS",
    "SAMPLE_SHARE",
    "SLOW_READER_NS",
    "BENCHMARK_NAMES",
]

#: "auto" keeps the memory reads under this many ns per step (with ~0.2 us for the
#: timing, the whole bookkeeping stays under 1 us whatever the step costs)...
SAMPLE_BUDGET_NS = 400.0
#: ...and under this share of a step. The reads cost a loop about twice what they cost
#: alone (a 25 us step on the CPU lost 3-4 % of its throughput to reads every 10-13 steps,
#: 1 % with one every 1000), so 0.1 % here is about 0.2 % of the loop: with the loop's one
#: clock read a step, a 25 us step keeps its throughput within 0.5 % of a plain loop.
SAMPLE_SHARE = 0.001
#: A memory reader this slow (ns a read) is sampled by its share of the run, not by count.
SLOW_READER_NS = 200_000
#: The names benchmark results have always given a series (``BenchmarkResult.memory_source``).
BENCHMARK_NAMES = {"process_rss": "host_rss"}


def sample_period(
    series: Sequence[MemorySeries],
    memory_sample_every: Union[int, str],
    n: int,
    warm_ns: Sequence[int],
    align: int = 1,
) -> int:
    """Steps between memory samples: as given, or "auto" from the cost of a reading of
    every series, measured here: a read every ``ceil(cost / budget)`` steps, the budget
    being 0.4 us or 0.1 % of the warm-up's median step if less, with at least 16 samples
    over the run (fewer, at least 3, when a slow reader such as NVML's
    process list would cost more than 0.5% of the run). ``align``: under "auto", the
    period is made a multiple of it (the GPU event interval, so that a sample falls on a
    step that ends an interval anyway) while that keeps 16 samples."""
    if memory_sample_every != "auto":
        return int(memory_sample_every)
    costs = []
    first = series[0] if series else None
    peak = first.peak if first is not None and first.reset_peak is not None else None
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for s in series:
            s.read()
        if peak is not None:
            try:
                peak()  # StepSampler reads and resets it at every sample too
                first.reset_peak()  # type: ignore[union-attr,misc]
            except Exception:
                peak = None  # StepSampler.start finds it unusable as well
        costs.append(time.perf_counter_ns() - t0)
    cost = sorted(costs)[2]
    step_ns = sorted(warm_ns)[len(warm_ns) // 2] if warm_ns else 0
    budget = min(SAMPLE_BUDGET_NS, SAMPLE_SHARE * step_ns) if step_ns > 0 else SAMPLE_BUDGET_NS
    every = max(1, math.ceil(cost / max(budget, 1.0)))
    every = min(every, max(1, n // 16))
    # An OpenMM loop of 400 calls ran ~3% slower with 16 NVML reads (ms each): a slow
    # reader gets fewer samples. Faster readers (PyTorch's counters: 45-80 us) keep 16.
    if step_ns > 0 and cost > SLOW_READER_NS and 16 * cost > 0.005 * n * step_ns:
        every = max(every, min(max(1, n // 3), math.ceil(cost / (0.005 * step_ns))))
    if align > 1:
        up = -(-every // align) * align
        every = up if up <= max(1, n // 16) else max(align, (every // align) * align)
    return every


class StepSampler:
    """The readings of a run of steps, in preallocated arrays: slot 0 holds the reading
    before step 0 (step -1), then one after every ``every``-th step. Array stores keep no
    Python objects alive per sample, so the bookkeeping neither allocates nor grows the
    memory it watches."""

    def __init__(
        self,
        series: List[MemorySeries],
        every: int,
        n: int,
        side: Optional[Callable[[], int]] = None,
        side_every: int = 0,
    ) -> None:
        self.series = series
        self.readers = [s.read for s in series]
        self.every = every
        size = n // every + 2
        self.steps = array("q", bytes(8 * size))
        self.values = [array("q", bytes(8 * size)) for _ in series]
        self.count = 0
        self._pairs = list(zip(self.values, self.readers))
        # The first series' peak counter, where its allocator keeps one that can be
        # reset: read and reset at every sample, so that each interval has its own peak
        # (a spike between two samples is seen, not only the samples' levels).
        first = series[0] if series else None
        self.peaks: Optional["array[int]"] = None
        self._peak = first.peak if first is not None and first.reset_peak is not None else None
        self._reset = first.reset_peak if first is not None and self._peak is not None else None
        if self._peak is not None:
            self.peaks = array("q", bytes(8 * size))
        # A dearer reading taken at every ``side_every``-th sample only (NVML's figure
        # for the process, hundreds of microseconds): ``side_steps``/``side_values``.
        self._side = side if side is not None and side_every > 0 else None
        self._side_every = max(1, side_every)
        self._side_at = self._side_every if self._side is not None else -1
        side_size = size // self._side_every + 2 if self._side is not None else 0
        self.side_steps = array("q", bytes(8 * side_size))
        self.side_values = array("q", bytes(8 * side_size))
        self.side_count = 0

    def start(self) -> List[int]:
        """Takes the reading before the first step (recorded as step -1); returns it."""
        if self._reset is not None and not self._reset_ok():
            self._peak = self._reset = self.peaks = None  # a peak that cannot be reset
        first = [r() for r in self.readers]
        self.steps[0] = -1
        for k, v in enumerate(first):
            self.values[k][0] = v
        if self.peaks is not None:
            self.peaks[0] = first[0]
        self.count = 1
        return first

    def _reset_ok(self) -> bool:
        try:
            return bool(self._reset()) and self._peak() is not None  # type: ignore[misc]
        except Exception:  # an allocator without the counter (a stand-in, an old release)
            return False

    def sample(self, i: int) -> None:
        """Takes the reading after step ``i`` (and the peak since the last sample)."""
        c = self.count
        self.steps[c] = i
        for values, read in self._pairs:
            values[c] = read()
        peaks = self.peaks
        if peaks is not None:
            peaks[c] = self._peak() or 0  # type: ignore[misc]
            self._reset()  # type: ignore[misc]
        if c == self._side_at:
            self._side_sample(i)
        self.count = c + 1

    def _side_sample(self, i: int) -> None:
        k = self.side_count
        try:
            self.side_values[k] = self._side()  # type: ignore[misc]
        except Exception:  # the dearer reader stopped answering: it is not read again
            self._side, self._side_at = None, -1
            return
        self.side_steps[k] = i
        self.side_count = k + 1
        self._side_at += self._side_every

    def finish(self) -> List[int]:
        """Takes the reading after the loop (and its synchronization), closes the series.
        The peak of the last interval is kept in ``last_peak`` (None without a counter)."""
        self.last_peak = (self._peak() or 0) if self._peak is not None else None
        last = [r() for r in self.readers]
        for s in self.series:
            s.close()
        return last


class MemorySampler:
    """Memory before and after a run, and its peak where the source keeps one, from the
    first series :func:`~gpukeeper.timing.memory_readers.memory_series` picks for plan ``kind``
    on device ``index``. ``source`` names it (``BENCHMARK_NAMES`` spelling; None: not
    read); ``why`` says what could not be read. ``outside``: how much the memory outside
    every framework grew over the run (NVML's figure less the frameworks' reserved
    bytes; None where it is not read: off the GPU, or where NVML is the source itself)."""

    def __init__(
        self, kind: str, index: Optional[int], synchronize: Optional[Callable[[], Any]] = None
    ) -> None:
        self.kind = kind
        self.index = index
        self.synchronize = synchronize
        self.source: Optional[str] = None
        self.before: Optional[int] = None
        self.after: Optional[int] = None
        self.peak: Optional[int] = None
        self.why = ""
        self.outside: Optional[int] = None
        self._cross: Optional[MemorySeries] = None
        self._cross_before: Optional[Tuple[int, int]] = None
        self._series: Optional[MemorySeries] = None
        self._peak_before: Optional[int] = None
        self._peak_reset = False

    def start(self) -> None:
        """Picks the series and takes the reading before the run."""
        notes: List[str] = []
        series, self._cross = memory_series(self.kind, self.index, self.synchronize, notes)
        self._cross_before = cross_reading(self._cross, self.index)
        self.why = "; ".join(notes)
        first = series[0]
        for other in series[1:]:
            other.close()
        self._series = first
        self.source = BENCHMARK_NAMES.get(first.name, first.name)
        self.before = first.read()
        if first.reset_peak is not None:
            # The peak counter is process-wide; resetting it is the only way to get the
            # peak of this run (documented in benchmark_function).
            self._peak_reset = bool(first.reset_peak())
        if first.peak is not None and not self._peak_reset:
            self._peak_before = first.peak()

    def stop(self) -> None:
        """Takes the reading after the run (and the peak), and closes the series."""
        s = self._series
        if s is None:
            return
        self.after = s.read()
        self.outside = outside_growth(self._cross_before, cross_reading(self._cross, self.index))
        if s.peak is not None:
            peak = s.peak()
            # A peak that cannot be reset (JAX's) is this run's only when the run raised it.
            if peak is not None and (
                self._peak_reset or (self._peak_before is not None and peak > self._peak_before)
            ):
                self.peak = int(peak)
        s.close()
        self._series = None

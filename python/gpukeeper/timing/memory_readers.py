"""Where a measured run's memory is read: the series of readers and the one rule that picks them.

The memory behind a figure or a verdict is the memory of the work measured:

- CPU work: the process's resident set size (what the process holds) first, then the
  in-use counts that exist here (``tracemalloc`` when it is tracing, glibc's
  ``mallinfo2``).
- The work of a framework that waits on its results (JAX): its adapter's reader of bytes
  in use (JAX's ``bytes_in_use``; NVML's figure for this process where it gives no
  statistics).
- An engine's work (its own CUDA context: OpenMM), or work the caller waits for with
  ``synchronize=``: NVML's figure for this process. No loaded framework's counters see
  that memory, even with PyTorch imported beside it.
- A framework's work (events on its stream, or its host clock): the frameworks'
  allocated bytes (gpukeeper's own counters when PyTorch allocates through
  ``use_torch_allocator()``: about a microsecond a read; PyTorch's counters otherwise:
  45-70 us). Unless their counters see nothing on the device (no reserved bytes) while
  NVML sees this process holding memory there: then the work is not theirs, and NVML's
  figure is read.

:func:`reads_nvml` is that rule, :func:`memory_series` applies it; both
``benchmark_function`` and ``benchmark_md_trajectory`` take their memory from it. NVML
also cross-checks the frameworks' counters over a run (:func:`outside_growth`).
"""

from __future__ import annotations

import tracemalloc
from typing import Any, Callable, List, Optional, Tuple

from gpukeeper import frameworks
from gpukeeper.base import host_memory as host
from gpukeeper.base import nvml

__all__ = [
    "MemorySeries",
    "host_series",
    "in_use_series",
    "framework_series",
    "reads_nvml",
    "memory_series",
    "cross_reading",
    "outside_growth",
]

MB = float(1 << 20)


class MemorySeries:
    """One memory reading: a name (the ``memory_source`` it is reported under), the
    reader, and whether it counts bytes *in use* (an allocator's live bytes: a leak shows
    up at once) or bytes *held* (RSS, a process's device memory: caches and pages the
    allocator keeps move it too). ``peak`` reads the most bytes in use so far, and
    ``reset_peak`` starts a new peak (True when it could); None where there is none."""

    def __init__(
        self,
        name: str,
        read: Callable[[], int],
        in_use: bool,
        close: Optional[Callable[[], None]] = None,
        peak: Optional[Callable[[], Optional[int]]] = None,
        reset_peak: Optional[Callable[[], bool]] = None,
    ) -> None:
        self.name = name
        self.read = read
        self.in_use = in_use
        self.close = close or (lambda: None)
        self.peak = peak
        self.reset_peak = reset_peak


def host_series() -> List[MemorySeries]:
    """RSS (what the process holds) first, then the in-use counts that exist here:
    tracemalloc when it is tracing, glibc's mallinfo2."""
    rss = host.RssReader()
    series = [MemorySeries(rss.source, rss, False, rss.close)]
    if tracemalloc.is_tracing():
        series.append(
            MemorySeries("tracemalloc", lambda: int(tracemalloc.get_traced_memory()[0]), True)
        )
    in_use = host.malloc_in_use_reader()
    if in_use is not None:
        series.append(MemorySeries("malloc_in_use", in_use, True))
    return series


def in_use_series(fw: frameworks.FrameworkAdapter, index: int) -> Optional[MemorySeries]:
    """The bytes in use of ``fw`` (a framework that waits on its results: JAX) on device
    ``index``, under its name, with its peak (which cannot be reset); None when it gives
    no memory statistics there."""
    readers = fw.in_use_reader(index)
    if readers is None:
        return None
    read, peak = readers
    return MemorySeries(fw.name, read, True, peak=peak)


def framework_series(index: int) -> MemorySeries:
    """The loaded frameworks' allocated bytes on device ``index`` (the cheapest reader
    that sees all of them); the framework's resettable peak when its own counters are
    read and its peak follows them (PyTorch's)."""
    read, source = frameworks.allocated_reader(index)
    fw = frameworks.ADAPTERS.get(source)
    if fw is None or not fw.peak_follows_reader:
        return MemorySeries(source, read, True)
    return MemorySeries(
        source,
        read,
        True,
        peak=lambda: fw.peak(index),
        reset_peak=lambda: fw.reset_peak(index),
    )


def reads_nvml(
    kind: str, synchronize: Optional[Callable[[], Any]], reserved: int, nvml_bytes: Optional[int]
) -> bool:
    """Whether GPU work of plan ``kind`` has its memory read from NVML's figure for this
    process rather than the frameworks' counters: for an engine's work and work the
    caller waits for (``synchronize``) always; for a framework's work ("events",
    "framework") when the frameworks hold nothing on the device (``reserved`` bytes 0)
    while NVML sees this process holding memory there (``nvml_bytes``)."""
    if kind == "engine" or synchronize is not None:
        return True
    return reserved == 0 and bool(nvml_bytes)


def memory_series(
    kind: str, index: Optional[int], synchronize: Optional[Callable[[], Any]], notes: List[str]
) -> Tuple[List[MemorySeries], Optional[MemorySeries]]:
    """The memory series of a run of plan ``kind`` (the first decides) and the NVML
    series that cross-checks the frameworks' counters (None where nothing is to check).

    ``kind`` is a :class:`gpukeeper.timing.plans.Plan`'s. What cannot be read goes to
    ``notes`` (host memory is then watched instead of the device's).
    """
    if kind == "cpu" or index is None:
        return host_series(), None
    nvml_read, why = nvml.process_memory_reader(index)
    nvml_own = MemorySeries("nvml_process", nvml_read, False) if nvml_read is not None else None
    waits_on = frameworks.waiting_on_result(kind)
    if waits_on is not None:
        own = in_use_series(waits_on, index)
        if own is not None:
            return [own], nvml_own
        notes.append(f"{waits_on.display_name} gives no memory statistics on this device")
    elif kind in ("events", "framework"):
        if nvml_own is None:
            return [framework_series(index)], None
        if not reads_nvml(kind, synchronize, frameworks.reserved_bytes(index), nvml_own.read()):
            return [framework_series(index)], nvml_own
    if nvml_own is not None:
        return [nvml_own], None
    notes.append(
        f"the device memory of this process cannot be read (NVML {why}): "
        "host memory is watched instead"
    )
    return host_series(), None


def cross_reading(cross: Optional[MemorySeries], index: Optional[int]) -> Optional[Tuple[int, int]]:
    """(NVML bytes of this process, frameworks' reserved bytes) on the device, for the
    check that the frameworks' counters explain the process's device memory."""
    if cross is None or index is None:
        return None
    try:
        return cross.read(), frameworks.reserved_bytes(index)
    except Exception:
        return None


def outside_growth(
    before: Optional[Tuple[int, int]], after: Optional[Tuple[int, int]]
) -> Optional[int]:
    """How much the memory outside every framework grew between two :func:`cross_reading`
    s: NVML's figure for the process less the frameworks' reserved bytes (None when
    either was not read). An engine's or an extension's allocations are seen only here."""
    if before is None or after is None:
        return None
    return (after[0] - after[1]) - (before[0] - before[1])

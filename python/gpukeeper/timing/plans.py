"""Host-clock plans for GPU work events cannot see, and a benchmark run's memory readings.

A plan (``HostSync``) times JAX's streams or an engine's own CUDA context on the host
clock up to a wait; ``MemorySampler`` reads memory before, after and at the peak of a run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

from gpukeeper import frameworks, host
from gpukeeper import nvml as _nvml
from gpukeeper.devices import DeviceSpec
from gpukeeper.timing.timer import TimerBackend

__all__ = ["HostSync", "MemorySampler", "engine_plan", "host_sync_plan", "jax_plan"]


@dataclass
class HostSync:
    """GPU work gpukeeper cannot put events around (JAX's streams, an engine's own CUDA
    context): each call is timed on the host clock up to ``wait(result)``."""

    name: str  # the result's backend: "jax" or "engine"
    index: int
    how: str
    wait: Callable[[Any], None]
    synchronized: Optional[bool]


def jax_plan(index: int) -> HostSync:
    """JAX work on CUDA device ``index``: waited for by ``jax.block_until_ready``."""
    return HostSync("jax", index, "host clock around jax.block_until_ready on the result",
                    lambda result: frameworks.jax_block_until_ready(result), True)


def engine_plan(index: int, synchronize: Optional[Callable[[], Any]], why: str) -> HostSync:
    """An engine's work on CUDA device ``index``: waited for by the frameworks'
    synchronize and the caller's ``synchronize`` (without one, queued work is missed)."""

    def wait(result: Any) -> None:
        frameworks.synchronize_all(index)
        if synchronize is not None:
            synchronize()

    if synchronize is not None:
        how = f"{why}: host clock around each call and the caller's synchronize()"
    else:
        how = (f"{why}: host clock around each call, without a synchronization (none given): "
               "work still queued when a call returns is not in its time")
    return HostSync("engine", index, how, wait, True if synchronize is not None else False)


def host_sync_plan(device: Any, spec: DeviceSpec, synchronize: Optional[Callable[[], Any]]) -> Optional[HostSync]:
    """The host-clock plan for GPU work that events cannot see, decided before the
    warm-up (JAX found from the warm-up's result is decided after it); None when events
    (or the CPU clock) time the work."""
    if synchronize is not None and spec.is_cuda:
        return engine_plan(spec.index or 0, synchronize, f"GPU work on cuda:{spec.index or 0}")
    if device is not None or spec.is_cuda:
        return None
    jax_devices = frameworks.jax_gpu_devices()
    if jax_devices and synchronize is None:
        return jax_plan(int(getattr(jax_devices[0], "id", 0)))
    if frameworks.gpu_frameworks_loaded():
        return None
    devices = frameworks.context_devices()
    if devices:
        return engine_plan(devices[0], synchronize,
                           f"a CUDA context with no framework on cuda:{devices[0]}")
    return None


class MemorySampler:
    """Reads memory before/after/peak from the framework that owns the device: JAX's
    statistics or NVML's figure for this process under a plan, else PyTorch's allocated
    bytes (resetting its peak counter), CuPy's pool, or the host RSS on the CPU.
    ``source`` names where the figures came from (None: not read; ``why`` says why)."""

    def __init__(self, backend: TimerBackend, host_sync: Optional[HostSync] = None) -> None:
        self.backend = backend
        self.host_sync = host_sync
        self.source: Optional[str] = None
        self.before: Optional[int] = None
        self.after: Optional[int] = None
        self.peak: Optional[int] = None
        self.why = ""
        self._read: Optional[Callable[[], Optional[int]]] = None
        self._peak_before: Optional[int] = None

    def start(self) -> None:
        plan = self.host_sync
        if plan is not None and plan.name == "jax" and self._start_jax(plan):
            return
        if plan is not None:
            read, why = _nvml.process_memory_reader(plan.index)
            if read is None:
                self.why = f"device memory not read: NVML {why}"
                return
            self.source = "nvml_process"
            self._read = read
            self.before = read()
            return
        b = self.backend
        if b.name == "torch":
            torch = sys.modules["torch"]
            self.source = "torch"
            self.before = int(torch.cuda.memory_allocated(b.device.index))
            # The peak counter is process-wide; resetting it is the only way to get the
            # peak of this run (documented in benchmark_function).
            torch.cuda.reset_peak_memory_stats(b.device.index)
        elif b.name == "cupy":
            import cupy

            self.source = "cupy"
            self.before = int(cupy.get_default_memory_pool().used_bytes())
        elif not b.is_gpu:
            self.before = host.current_rss_bytes()
            self.source = "host_rss" if self.before is not None else None

    def _start_jax(self, plan: HostSync) -> bool:
        stats = frameworks.jax_memory_stats(plan.index)
        if stats is not None and "bytes_in_use" in stats:
            self.source = "jax"
            self.before = int(stats["bytes_in_use"])
            self._peak_before = stats.get("peak_bytes_in_use")
            return True
        self.why = "JAX gives no memory statistics on this device"
        return False

    def stop(self) -> None:
        b = self.backend
        if self.source == "jax":
            stats = frameworks.jax_memory_stats(self.host_sync.index) or {}  # type: ignore[union-attr]
            self.after = int(stats.get("bytes_in_use", 0))
            peak = stats.get("peak_bytes_in_use")
            # JAX's peak cannot be reset: it is this run's only when the run raised it.
            if peak is not None and self._peak_before is not None and peak > self._peak_before:
                self.peak = int(peak)
        elif self.source == "nvml_process":
            self.after = self._read()  # type: ignore[misc]
        elif self.source == "torch":
            torch = sys.modules["torch"]
            self.after = int(torch.cuda.memory_allocated(b.device.index))
            self.peak = int(torch.cuda.max_memory_allocated(b.device.index))
        elif self.source == "cupy":
            import cupy

            self.after = int(cupy.get_default_memory_pool().used_bytes())
        elif self.source == "host_rss":
            self.after = host.current_rss_bytes()

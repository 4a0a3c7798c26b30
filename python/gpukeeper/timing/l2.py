"""The L2 cache of a CUDA device: ``l2_cache_size`` and ``L2Flusher`` (nvbench's l2flush).

``L2Flusher`` evicts everything from L2 before a measured call, so that every call
starts cold. The size and the buffer come from the frameworks' adapters
(:func:`gpukeeper.frameworks.l2_cache_size`, :func:`gpukeeper.frameworks.l2_scratch`).
"""

from __future__ import annotations

from typing import Any, Optional

from gpukeeper import frameworks
from gpukeeper.base.device_names import DeviceSpec
from gpukeeper.frameworks import Scratch
from gpukeeper.timing.timer import TimerBackend, timing_device

__all__ = ["L2Flusher", "l2_cache_size"]


def l2_cache_size(device: Any = None) -> int:
    """The L2 cache size in bytes of a CUDA device (torch or CuPy); 0 on the CPU."""
    spec = device if isinstance(device, DeviceSpec) else timing_device(device)
    if not spec.is_cuda:
        return 0
    return frameworks.l2_cache_size(spec.index or 0)


class L2Flusher:
    """A device buffer of exactly the L2 size; ``flush()`` overwrites all of it.

    Filling the whole buffer evicts everything else from L2 (nvbench does the same
    with a memset of the L2 size). The fill is queued on ``stream`` (the timed one),
    so it is ordered before the next start event and never inside a measurement.
    """

    def __init__(self, backend: TimerBackend) -> None:
        # The buffer comes from the framework whose streams are timed (CuPy for the cupy
        # backend), else from the first loaded framework that can make one (PyTorch,
        # then CuPy); gpukeeper's own backend without either flushes nothing.
        self.backend = ""
        self.nbytes = l2_cache_size(backend.device)
        self.scratch: Optional[Scratch] = None
        if self.nbytes <= 0:
            self.nbytes = 0
            return
        made = frameworks.l2_scratch(backend.device.index or 0, self.nbytes, prefer=backend.name)
        if made is None:
            self.nbytes = 0
            return
        self.backend, self.scratch = made

    def flush(self, stream: Any = None) -> None:
        """Overwrites the buffer on ``stream`` (the current one when None)."""
        if self.scratch is not None:
            self.scratch.fill(stream)

    def release(self) -> None:
        """Gives the buffer back to its framework."""
        self.scratch = None

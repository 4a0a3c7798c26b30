"""The L2 cache of a CUDA device: ``l2_cache_size`` and ``L2Flusher`` (nvbench's l2flush).

``L2Flusher`` evicts everything from L2 before a measured call, so that every call
starts cold.
"""

from __future__ import annotations

import sys
from typing import Any

from gpukeeper.devices import DeviceSpec
from gpukeeper.timing.timer import TimerBackend, timing_device

__all__ = ["L2Flusher", "l2_cache_size"]


def l2_cache_size(device: Any = None) -> int:
    """The L2 cache size in bytes of a CUDA device (torch or CuPy); 0 on the CPU."""
    spec = device if isinstance(device, DeviceSpec) else timing_device(device)
    if not spec.is_cuda:
        return 0
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return int(torch.cuda.get_device_properties(spec.index).L2_cache_size)
        except Exception:
            pass  # fall through to CuPy
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        props = cupy.cuda.runtime.getDeviceProperties(spec.index or 0)
        return int(props["l2CacheSize"])
    return 0


class L2Flusher:
    """A device buffer of exactly the L2 size; ``flush()`` overwrites all of it.

    Filling the whole buffer evicts everything else from L2 (nvbench does the same
    with a memset of the L2 size). The fill is queued on ``stream`` (the timed one),
    so it is ordered before the next start event and never inside a measurement.
    """

    def __init__(self, backend: TimerBackend) -> None:
        # The buffer comes from the framework whose streams are timed: CuPy for the cupy
        # backend, else PyTorch when loaded, else CuPy when loaded (gpukeeper's own
        # backend without either cannot read the L2 size: nothing is flushed).
        if backend.name == "cupy" or ("torch" not in sys.modules and "cupy" in sys.modules):
            self.backend = "cupy"
        elif "torch" in sys.modules:
            self.backend = "torch"
        else:
            self.backend = ""
        self.nbytes = l2_cache_size(backend.device) if self.backend else 0
        self._buffer: Any = None
        if self.nbytes <= 0:
            return
        index = backend.device.index or 0
        if self.backend == "cupy":
            import cupy  # loaded: the cupy backend was chosen

            with cupy.cuda.Device(index):
                self._buffer = cupy.empty(self.nbytes, dtype=cupy.uint8)
        else:
            torch = sys.modules["torch"]
            self._buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=f"cuda:{index}")

    def flush(self, stream: Any = None) -> None:
        """Overwrites the buffer on ``stream`` (the current one when None)."""
        if self._buffer is None:
            return
        if self.backend == "cupy":
            if stream is not None:
                with stream:
                    self._buffer.fill(0)
            else:
                self._buffer.fill(0)
            return
        torch = sys.modules["torch"]
        if stream is not None:
            with torch.cuda.stream(stream):
                self._buffer.fill_(0)
        else:
            self._buffer.fill_(0)

    def release(self) -> None:
        self._buffer = None

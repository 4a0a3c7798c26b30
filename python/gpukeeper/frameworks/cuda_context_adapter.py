"""The adapter of a CUDA context with no framework: gpukeeper's own pooled events on the
current stream of whoever issues work, for timing without PyTorch or CuPy."""

from __future__ import annotations

from typing import Any

import gpukeeper._core as _core
from gpukeeper.base import device_names as devices
from gpukeeper.base.device_names import DeviceSpec
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.frameworks import registry
from gpukeeper.frameworks.adapter import TimerBackend

__all__ = ["CoreBackend", "core_cuda"]


def core_cuda() -> bool:
    """Whether gpukeeper's own core sees a usable CUDA device."""
    return devices.cuda_status()[0] > 0


class CoreBackend(TimerBackend):
    """gpukeeper's pooled CUDA events (``_core.Event``): no framework needed.

    The stream is the current one of the first loaded framework in the registry that has
    one (PyTorch, else CuPy), else the legacy default stream; pass ``stream=`` to
    ``CUDATimer`` for another one (an int handle, or any object with ``cuda_stream`` or
    ``ptr``).
    """

    name = "gpukeeper"
    is_gpu = True

    def __init__(self, device: DeviceSpec) -> None:
        super().__init__(device)
        if not device.is_cuda or not core_cuda():
            raise InvalidInputError("the 'gpukeeper' timer backend needs a usable CUDA device")
        self._core = _core
        self._index = device.index or 0

    def current_stream(self) -> Any:
        # The int handle: recording on it is one C call, with no attribute lookups.
        for fw in registry.ADAPTERS.values():
            handle = fw.current_stream_handle(self._index)
            if handle is not None:
                return handle
        return 0

    def new_event(self) -> Any:
        return self._core.Event(self._index)

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_ms(end))

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def synchronize(self) -> None:
        self._core.synchronize(self._index)

"""The error types of gpukeeper.

``GpuError`` is the base of all of them. ``InvalidInputError`` is also a
``ValueError``, ``AllocationError`` also a ``MemoryError`` and ``DeviceError`` (a
failed CUDA call, naming the call, the error code's name and its message) also a
``RuntimeError``, so existing ``except`` clauses keep working.
"""

from gpukeeper._core import AllocationError, DeviceError, GpuError, InvalidInputError

__all__ = ["GpuError", "InvalidInputError", "AllocationError", "DeviceError"]

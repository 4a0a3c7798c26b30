"""The error types of gpukeeper.

``GpuError`` is the base of all of them. ``InvalidInputError`` is also a
``ValueError``, ``AllocationError`` also a ``MemoryError`` and ``DeviceError`` (a
failed CUDA call, naming the call, the error code's name and its message) also a
``RuntimeError``, so existing ``except`` clauses keep working.

Of the cleanup (``gpukeeper.cleanup``): ``MemoryLeakError`` (memory still held after a
``GPUContext`` with ``raise_on_leak=True``, carrying its report), ``EmptiedObjectError``
(a module, optimizer or tensor emptied by ``cleanup_models()`` used again; also a
``RuntimeError``) and the ``LeakWarning`` warning (a ``UserWarning``).

Of the timing (``gpukeeper.timing``): the ``TimingWarning`` warning (a ``UserWarning``),
for a measurement that is not what was asked for (a launch-latency gate that timed out).
"""

from typing import Any

from gpukeeper._core import AllocationError, DeviceError, GpuError, InvalidInputError

__all__ = [
    "GpuError",
    "InvalidInputError",
    "AllocationError",
    "DeviceError",
    "MemoryLeakError",
    "EmptiedObjectError",
    "LeakWarning",
    "TimingWarning",
]


class MemoryLeakError(GpuError):
    """Memory was still held after a ``GPUContext`` with ``raise_on_leak=True`` cleaned up.

    ``report`` is the context's ``CleanupReport``. It is typed ``Any`` because errors sit
    at the base of the layers and the report's module above them.
    """

    def __init__(self, message: str, report: Any) -> None:
        super().__init__(message)
        self.report = report


class EmptiedObjectError(GpuError, RuntimeError):
    """A module, optimizer or tensor emptied by ``cleanup_models()`` was used again."""


class LeakWarning(UserWarning):
    """Memory still held after cleanup.

    A ``UserWarning`` rather than a ``ResourceWarning`` on purpose: Python hides
    ResourceWarnings by default, and a leak nobody sees is no warning at all.
    """


class TimingWarning(UserWarning):
    """A measurement is not what was asked for, e.g. the launch latency could not be
    hidden because the timed work waited for the GPU while the stream was held."""

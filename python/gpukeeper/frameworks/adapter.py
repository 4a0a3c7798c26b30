"""The adapter interface: what every framework adapter answers, and the host-clock marks.

An adapter is one framework's view of a device: its memory counters (``memory``), how to
make it let go of its cache (``release``), how to wait for its queued work
(``synchronize``) and, for timing, its marks on a stream (``timer_backend``: the current
stream, events, elapsed time) and its view of the L2 cache (``l2_cache_size``, a
``Scratch`` buffer to flush it with). Adapters sit on the base layer (devices, nvml, host,
errors) and never import a feature or a surface. None imports its framework: one that is
not in ``sys.modules`` is not in use, and importing it would cost seconds and create a
CUDA context.

To add a framework: subclass :class:`FrameworkAdapter` in a module of its own, list an
instance in ``gpukeeper.frameworks.ADAPTERS`` and, for timing, register its
:class:`TimerBackend` with ``gpukeeper.timing.register_backend``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from gpukeeper.base.device_names import DeviceSpec

__all__ = [
    "CpuBackend",
    "FrameworkAdapter",
    "FrameworkMemory",
    "Scratch",
    "TimerBackend",
    "memory_dict",
]


@dataclass(frozen=True)
class FrameworkMemory:
    """Bytes one framework holds on one device.

    ``allocated``: in live tensors/arrays/buffers; ``reserved``: held from the driver,
    including its cache (``reserved >= allocated``). ``None`` where the framework cannot
    tell (e.g. JAX without memory stats).
    """

    name: str
    allocated: Optional[int]
    reserved: Optional[int]


def memory_dict(per: Dict[str, FrameworkMemory]) -> Dict[str, Dict[str, Optional[int]]]:
    """Framework name -> its ``allocated_bytes`` and ``reserved_bytes``: how every report
    writes a set of ``FrameworkMemory`` to JSON."""
    return {
        name: {"allocated_bytes": m.allocated, "reserved_bytes": m.reserved}
        for name, m in per.items()
    }


class FrameworkAdapter:
    """One framework's memory counters, release and synchronize on CUDA devices.

    ``devices`` arguments are the CUDA ordinals to act on. For "every device" the
    registry passes the devices the process uses, so that no adapter touches (and
    creates a context on) a device nobody uses; an adapter that can act on all it holds
    without that risk sets ``whole_process = True`` and receives None instead.
    """

    #: The name under which the framework's memory is reported.
    name: str = "abstract"
    #: Whether ``release(None)``/``synchronize(None)`` may mean "all it holds".
    whole_process: bool = False

    def in_use(self) -> bool:
        """Whether the framework is loaded and uses CUDA in this process."""
        return False

    def memory(self, device: int) -> Optional[FrameworkMemory]:
        """The framework's bytes on ``device``; None when it holds nothing there or is
        not in use."""
        return None

    def release(self, devices: Optional[List[int]]) -> int:
        """Returns the framework's cached memory on ``devices`` to the driver; bytes."""
        return 0

    def synchronize(self, devices: Optional[List[int]]) -> None:
        """Waits for the framework's queued work on ``devices``."""

    def release_hint(self) -> Optional[str]:
        """How the user can make the framework's cache returnable, when ``release``
        cannot (JAX); None when ``release`` empties it."""
        return None

    def reset_peak(self, device: int) -> bool:
        """Starts a new peak of allocated bytes on ``device`` at the current level; False
        when the framework keeps no resettable peak (then ``peak`` is None)."""
        return False

    def peak(self, device: int) -> Optional[int]:
        """The most bytes allocated on ``device`` since ``reset_peak``; None when the
        framework keeps no resettable peak (CuPy) or is not in use."""
        return None

    def l2_cache_size(self, device: int) -> Optional[int]:
        """The L2 cache size of ``device`` in bytes as the framework reads it; None when
        it cannot (not loaded, CUDA unusable through it)."""
        return None

    def l2_scratch(self, device: int, nbytes: int) -> Optional["Scratch"]:
        """A buffer of ``nbytes`` on ``device`` from the framework's allocator, to flush
        the L2 cache with; None when the framework cannot make one."""
        return None


class Scratch:
    """A device buffer one framework allocated (see ``FrameworkAdapter.l2_scratch``):
    ``array`` is the framework's own array of it."""

    array: Any = None

    def fill(self, stream: Any = None) -> None:
        """Overwrites all of the buffer, queued on ``stream`` (the current one when None)."""
        raise NotImplementedError


class TimerBackend:
    """How marks are made and read. Subclass and ``register_backend()`` to add one.

    A mark ("event") is whatever ``new_event()`` returns; ``record`` puts it on a stream,
    ``elapsed_ms`` waits for ``end`` and returns the time from ``start`` to ``end``.
    """

    name: str = "abstract"
    #: True when marks are taken by the device (GPU time), False for a host clock.
    is_gpu: bool = False

    def __init__(self, device: DeviceSpec) -> None:
        self.device = device

    def current_stream(self) -> Any:
        """The stream work is issued to now (None for the CPU)."""
        return None

    def new_event(self) -> Any:
        """A new mark."""
        raise NotImplementedError

    def record(self, event: Any, stream: Any) -> None:
        """Puts ``event`` on ``stream``."""
        raise NotImplementedError

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Waits for ``end``; milliseconds from ``start`` to ``end``."""
        raise NotImplementedError

    def query(self, event: Any) -> bool:
        """True when the device has passed ``event`` (always True on the CPU)."""
        return True

    def synchronize(self) -> None:
        """Waits for all work on the device."""


class CpuBackend(TimerBackend):
    """A steady host clock (``time.perf_counter_ns``): used without a usable GPU."""

    name = "cpu"
    is_gpu = False

    def new_event(self) -> List[int]:
        # A one-element list: mutable, so the same mark can be recorded again.
        return [0]

    def record(self, event: List[int], stream: Any) -> None:
        event[0] = time.perf_counter_ns()

    def elapsed_ms(self, start: List[int], end: List[int]) -> float:
        return (end[0] - start[0]) / 1e6

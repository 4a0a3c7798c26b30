"""The adapter interface: what every framework adapter answers, and the host-clock marks.

An adapter is everything gpukeeper knows about one framework: its memory counters
(``memory``, a resettable ``peak``, a reader of bytes in use), how to make it let go of
its cache (``release``), how to wait for its queued work (``synchronize``, or blocking on
a result for a framework with streams of its own, as JAX), its live arrays, where its
allocations are made (``record_allocations``) and, for timing, its marks on a stream
(``timer_backend``: the current stream, events, elapsed time) and its view of the L2 cache
(``l2_cache_size``, a ``Scratch`` buffer to flush it with). The measuring code (timing,
trajectories, cleanup, the account) asks the registry (``gpukeeper.frameworks``), which
asks every adapter; nothing outside ``frameworks/`` names a framework.

Adapters sit on the base layer (devices, nvml, host, errors) and never import a feature
or a surface. None imports its framework: one that is not in ``sys.modules`` is not in
use, and importing it would cost seconds and create a CUDA context.

To add a framework: subclass :class:`FrameworkAdapter` in a module of its own and list an
instance in ``gpukeeper.frameworks.registry.ADAPTERS``; what it leaves at the defaults
here it does not have.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type

from gpukeeper.base.device_names import DeviceSpec
from gpukeeper.base.errors import InvalidInputError

__all__ = [
    "ArrayDescription",
    "CpuBackend",
    "DeviceFilter",
    "FilledScratch",
    "FrameworkAdapter",
    "FrameworkEventBackend",
    "FrameworkMemory",
    "InUseReader",
    "LiveArray",
    "Scratch",
    "StopRecording",
    "TimerBackend",
    "entered",
    "loaded_with_cuda",
    "memory_dict",
]

#: Whether an array on (device type, index) is wanted: ``("cuda", 0)``, ``("cpu", None)``.
DeviceFilter = Callable[[str, Optional[int]], bool]
#: (a reader of the bytes in use, a reader of their peak or None when there is none).
InUseReader = Tuple[Callable[[], int], Callable[[], Optional[int]]]
#: Ends a ``record_allocations``.
StopRecording = Callable[[], None]


@dataclass(frozen=True)
class ArrayDescription:
    """What a tensor or array is: its framework's name, its device ("cuda:0"), its kind
    ("Tensor", "ndarray"), shape, dtype and the bytes of its allocation."""

    framework: str
    device: str
    kind: str
    shape: Tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class LiveArray(ArrayDescription):
    """One allocation held by a live tensor or array that Python can see.

    ``nbytes`` is the whole allocation (the storage for PyTorch, the memory chunk for
    CuPy), counted once however many views share it; ``shape``/``dtype``/``kind`` are
    those of the base tensor or array when a view's base is alive. ``data_ptr`` is the
    allocation's address, the key under which creation sites are recorded.
    """

    data_ptr: int
    grad_fn: bool = False  # a PyTorch result that keeps an autograd graph alive


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
    #: The framework's name in words, for messages ("PyTorch", "JAX").
    display_name: str = "abstract"
    #: The modules whose folders a stack passes through on its way to the user's code.
    modules: Tuple[str, ...] = ()
    #: The distributions whose versions ``gpukeeper info`` lists (read from their
    #: metadata, never imported).
    distributions: Tuple[str, ...] = ()
    #: Whether ``peak``/``reset_peak`` follow the figures of ``allocated_reader`` when
    #: this framework is the one read (PyTorch): a run's memory series then has a peak.
    peak_follows_reader: bool = False
    #: True for a framework whose work runs on streams of its own, waited for by blocking
    #: on its result (JAX): no events can be put beside it, its work is timed on the
    #: host clock around ``block_until_ready``, and its plan kind is its ``name``.
    waits_on_result: bool = False
    #: That wait in words, for a plan's ``how`` ("jax.block_until_ready").
    result_wait: str = ""
    #: The backend that puts CUDA events on the framework's current stream (None: it
    #: gives none), and its priority among the usable backends (the highest wins).
    timer_backend: Optional[Type["TimerBackend"]] = None
    timer_priority: int = 0

    def in_use(self) -> bool:
        """Whether the framework is loaded and uses CUDA in this process."""
        return False

    def cuda_usable(self) -> bool:
        """Whether the framework is loaded and CUDA is usable through it (it may not have
        made a context yet): then work asked to run with no device runs on CUDA, and
        its ``timer_backend`` can time it."""
        return False

    def gpu_loaded(self) -> bool:
        """Whether the framework is loaded and runs GPU work gpukeeper can see."""
        return self.in_use()

    def may_hold_context(self) -> bool:
        """Whether the framework could have made a CUDA context (cheap checks only)."""
        return self.in_use()

    def context_devices(self) -> List[int]:
        """The CUDA devices the framework knows it holds contexts on, asked only where the
        driver cannot be reached; [] when it cannot tell."""
        return []

    def current_device(self) -> Optional[int]:
        """The CUDA device the framework calls current, where it can tell without
        initialising anything; None otherwise."""
        return None

    def current_stream_handle(self, device: int) -> Optional[int]:
        """The handle (``cudaStream_t`` as an int) of the framework's current stream on
        ``device``, when CUDA is usable through it; None otherwise."""
        return None

    def device_properties(self, device: int) -> Optional[Dict[str, Any]]:
        """``get_gpu_info`` fields of ``device`` as the framework reads them (``name``,
        ``compute_capability`` ...), without initialising anything new; None when it
        cannot."""
        return None

    def oom_error(self) -> Optional[type]:
        """The framework's out-of-memory error type, when it is loaded and has one."""
        return None

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

    def memory_and_peak(self, device: int) -> Tuple[Optional[FrameworkMemory], Optional[int]]:
        """``(memory(device), peak(device))``; an adapter whose counters give both in one
        read (PyTorch's statistics) answers with that one read."""
        return self.memory(device), (self.peak(device) if self.in_use() else None)

    def l2_cache_size(self, device: int) -> Optional[int]:
        """The L2 cache size of ``device`` in bytes as the framework reads it; None when
        it cannot (not loaded, CUDA unusable through it)."""
        return None

    def l2_scratch(self, device: int, nbytes: int) -> Optional["Scratch"]:
        """A buffer of ``nbytes`` on ``device`` from the framework's allocator, to flush
        the L2 cache with; None when the framework cannot make one."""
        return None

    # ------------------------------------------------- memory in use (a run's series)

    def in_use_reader(self, device: int) -> Optional[InUseReader]:
        """For a framework that ``waits_on_result``: readers of its bytes in use on
        ``device`` and of their peak (JAX's ``bytes_in_use``, ``peak_bytes_in_use``);
        None when it gives no such statistics there."""
        return None

    # ------------------------------------- results (frameworks that wait on results)

    def gpu_device_ids(self) -> List[int]:
        """The ids of the framework's GPU devices (numbered as CUDA numbers them) when it
        is loaded and has any; [] otherwise."""
        return []

    def holds_arrays(self, value: Any) -> bool:
        """Whether ``value`` (any nesting of containers) holds the framework's arrays on
        a GPU: the work that made it ran in this framework."""
        return False

    def result_device(self, value: Any) -> Optional[int]:
        """The GPU device holding the framework's first array in ``value``, or None."""
        return None

    def block_until_ready(self, value: Any) -> Any:
        """Waits for the framework's work that produces ``value``; returns ``value``."""
        return value

    # ------------------------------------------------------------------ live arrays

    def array_type(self) -> Optional[type]:
        """The framework's array (tensor) type when it is loaded, else None: the type
        ``describe_array`` and ``holds_device_memory`` are asked about."""
        return None

    def describe_array(self, obj: Any, wanted: DeviceFilter) -> Optional[Tuple[int, LiveArray]]:
        """(rank, entry) for an ``array_type`` object on a ``wanted`` device, or None
        (not wanted, empty, or no storage to tell). Of the objects that share one
        allocation the highest rank describes it: a base over a view, then the
        largest."""
        return None

    def holds_device_memory(self, obj: Any) -> bool:
        """Whether an ``array_type`` object holds memory on a device."""
        return False

    # ---------------------------------------------------------- allocation sites

    def record_allocations(
        self, on_alloc: Callable[[Sequence[int]], None]
    ) -> Optional[StopRecording]:
        """Starts calling ``on_alloc(addresses)`` with the addresses of the allocations
        the framework makes from now on (the call happens where they are made, so the
        caller can take the stack); returns what stops it, or None when the framework is
        not loaded or cannot tell."""
        return None


class Scratch:
    """A device buffer one framework allocated (see ``FrameworkAdapter.l2_scratch``):
    ``array`` is the framework's own array of it."""

    array: Any = None

    def fill(self, stream: Any = None) -> None:
        """Overwrites all of the buffer, queued on ``stream`` (the current one when None)."""
        raise NotImplementedError


def loaded_with_cuda(name: str) -> Any:
    """The module ``name`` when it is already imported (never imports it) and has a
    ``cuda`` attribute (PyTorch, CuPy), else None."""
    module = sys.modules.get(name)
    return module if module is not None and hasattr(module, "cuda") else None


def entered(manager: Any) -> StopRecording:
    """Enters ``manager`` (a context manager, such as an allocation hook) and returns the
    call that leaves it; leaving never raises (a hook that fails to leave is left as is)."""
    manager.__enter__()

    def stop() -> None:
        try:
            manager.__exit__(None, None, None)
        except Exception:
            pass

    return stop


class FilledScratch(Scratch):
    """A framework's scratch array, overwritten by ``zero()`` (its fill with zeros); on a
    given stream, inside ``on_stream(stream)`` (the framework's context manager that makes
    that stream current)."""

    def __init__(
        self, array: Any, zero: Callable[[], Any], on_stream: Callable[[Any], Any]
    ) -> None:
        self.array = array
        self._zero = zero
        self._on_stream = on_stream

    def fill(self, stream: Any = None) -> None:
        if stream is None:
            self._zero()
            return
        with self._on_stream(stream):
            self._zero()


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


class FrameworkEventBackend(TimerBackend):
    """A framework's own CUDA events: recorded with ``event.record(stream)``, waited for
    with ``event.synchronize()``. A subclass sets ``name`` and ``needs`` (what its error
    says is missing) and gives ``framework`` (its module when events can be made through
    it, else None; kept as ``self.module``), ``event_ms`` and the other methods of
    :class:`TimerBackend`."""

    is_gpu = True
    needs: str = ""

    def __init__(self, device: DeviceSpec) -> None:
        super().__init__(device)
        module = self.framework()
        if module is None:
            raise InvalidInputError(f"the {self.name!r} timer backend needs {self.needs}")
        self.module = module

    @staticmethod
    def framework() -> Any:
        """The framework's module when events can be made through it, else None."""
        raise NotImplementedError

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        end.synchronize()
        return float(self.event_ms(start, end))

    def event_ms(self, start: Any, end: Any) -> float:
        """Milliseconds from ``start`` to ``end``, both passed by the device."""
        raise NotImplementedError


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

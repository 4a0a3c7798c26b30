"""The PyTorch adapter: its memory counters (or the pool behind it), release, synchronize,
``torch.cuda.Event`` marks, an L2 scratch buffer, its live tensors and a TorchDispatchMode
that records where each new storage is made."""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from gpukeeper.base import process_life
from gpukeeper.frameworks.adapter import (
    DeviceFilter,
    FilledScratch,
    FrameworkAdapter,
    FrameworkEventBackend,
    FrameworkMemory,
    LiveArray,
    Scratch,
    StopRecording,
    entered,
    loaded_with_cuda,
)

__all__ = [
    "TorchAdapter",
    "TorchBackend",
    "compiled_frames",
    "current_raw_stream",
    "import_torch",
    "loaded_torch",
    "torch_allocated_reader",
    "torch_cuda",
    "torch_current_device",
    "torch_device_name",
    "torch_dtype_name",
    "torch_dispatch_mode",
    "torch_in_use",
    "torch_oom_error",
    "torch_storage_weakref",
    "torch_uses_gpukeeper",
]


def loaded_torch() -> Any:
    """PyTorch when it is already imported (never imports it), else None."""
    return loaded_with_cuda("torch")


def import_torch() -> Any:
    """PyTorch, imported now if it is not yet: for features whose point is PyTorch itself
    (its profiler). Raises ImportError when it is not installed."""
    loaded = loaded_torch()
    if loaded is not None:
        return loaded
    import torch

    return torch


def torch_current_device() -> Optional[int]:
    """The CUDA device PyTorch calls current, once it has initialised CUDA (asking before
    would initialise it), else None."""
    torch = loaded_torch()
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:
        pass
    return None


def torch_device_name(device: int) -> Optional[str]:
    """The name PyTorch gives CUDA device ``device`` once it has initialised CUDA, else None."""
    torch = loaded_torch()
    try:
        if torch is not None and torch.cuda.is_initialized():
            return str(torch.cuda.get_device_name(device))
    except Exception:
        pass
    return None


def torch_oom_error() -> Optional[type]:
    """``torch.cuda.OutOfMemoryError`` when PyTorch is loaded and has it, else None."""
    error = getattr(getattr(loaded_torch(), "cuda", None), "OutOfMemoryError", None)
    return error if isinstance(error, type) else None


def torch_storage_weakref() -> Any:
    """PyTorch's ``StorageWeakRef`` (a weak reference to a tensor's storage, to see it die),
    or None when PyTorch is not loaded or lacks it."""
    if loaded_torch() is None:
        return None
    try:
        from torch.multiprocessing.reductions import StorageWeakRef
    except Exception:  # pragma: no cover - every torch with storages has it
        return None
    return StorageWeakRef


def torch_dispatch_mode() -> Optional[Tuple[type, type]]:
    """(``torch.Tensor``, ``TorchDispatchMode``) to watch every tensor operation, when
    PyTorch is loaded, else None."""
    torch = loaded_torch()
    if torch is None or not hasattr(torch, "utils"):
        return None
    from torch.utils._python_dispatch import TorchDispatchMode

    return torch.Tensor, TorchDispatchMode


def _dynamo_utils() -> Any:
    """torch._dynamo.utils if dynamo is loaded, else None (importing it just to count would
    cost seconds)."""
    return sys.modules.get("torch._dynamo.utils")


def compiled_frames() -> Optional[int]:
    """Frames torch.compile has compiled so far in this process (None when dynamo was
    never loaded: nothing can have been compiled)."""
    utils = _dynamo_utils()
    if utils is None:
        return None
    try:
        return int(utils.counters["frames"]["total"])
    except Exception:
        return None


def torch_cuda() -> Any:
    """PyTorch when it is loaded *and* CUDA is usable through it, else None."""
    torch = loaded_torch()
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


# The torch module seen with CUDA initialised. CUDA stays initialised for the life of the
# process, so later calls skip the two checks (a few microseconds each time, and the leak
# check asks several times per test); a forked child starts without it, as PyTorch does.
_initialized_torch: Any = None


def _forget_initialized_torch() -> None:
    global _initialized_torch
    _initialized_torch = None


process_life.after_fork_in_child(_forget_initialized_torch)


def current_raw_stream(torch: Any, device: int) -> int:
    """The handle of ``torch``'s current CUDA stream on ``device``. CUDA builds of torch
    answer it in one C call; ``torch.cuda.current_stream`` builds a ``Stream`` object
    through several Python calls, which a rank summary made three times a call."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


def torch_in_use() -> Any:
    """PyTorch when it has initialised CUDA (a CUDA tensor was made), else None."""
    global _initialized_torch
    torch = loaded_torch()
    if torch is None:
        return None
    if torch is _initialized_torch:
        return torch
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None  # no CUDA tensor was ever made: nothing to read or release
    except Exception:
        return None
    _initialized_torch = torch
    return torch


def torch_uses_gpukeeper() -> bool:
    """True when use_torch_allocator() routed PyTorch's allocations to gpukeeper: then
    PyTorch's own counters are meaningless and the pool's are read instead."""
    return _pool_behind_torch() is not None


def _pool_behind_torch() -> Any:
    """``gpukeeper.integrations.torch_allocator`` (the pool's counters, peak and reset)
    while PyTorch allocates through it, else None. Read from ``sys.modules``: the
    integration sits above the adapters."""
    integration = sys.modules.get("gpukeeper.integrations.torch_allocator")
    return integration if integration is not None and integration.is_active() else None


def _torch_on(device: int) -> Any:
    """PyTorch when it has initialised CUDA and ``device`` is one of its devices."""
    torch = torch_in_use()
    return None if torch is None or device >= torch.cuda.device_count() else torch


def _figure(device: int, of_pool: str, of_torch: Callable[[Any, int], Any]) -> Any:
    """A figure of PyTorch's memory on ``device``: the pool's function ``of_pool`` under
    use_torch_allocator(), else ``of_torch(torch, device)``; None when PyTorch has not
    initialised CUDA or has no such device."""
    torch = _torch_on(device)
    if torch is None:
        return None
    pool = _pool_behind_torch()
    return getattr(pool, of_pool)(device) if pool else of_torch(torch, device)


def torch_allocated_reader(device: int) -> Tuple[Callable[[], int], str]:
    """(a reader of PyTorch's allocated bytes on ``device``, the name its figures go
    under): the pool's counters under ``use_torch_allocator()`` (about a microsecond a
    read, ``"gpukeeper_torch_allocator"``), PyTorch's otherwise (45-70 us, ``"torch"``).
    Reads 0 before PyTorch has initialised CUDA; never initialises it."""
    if torch_uses_gpukeeper():
        usage = sys.modules["gpukeeper.integrations.torch_allocator"].pool_usage
        return (lambda: int(usage(device)[0])), "gpukeeper_torch_allocator"
    torch = loaded_torch()
    if torch is None:
        return (lambda: 0), "torch"
    # The public wrapper, not _stats: it answers {} (not a new context) before CUDA is
    # initialised, and a run may start before its first CUDA tensor.
    raw = torch.cuda.memory.memory_stats_as_nested_dict

    def read() -> int:
        try:
            return int(raw(device)["allocated_bytes"]["all"]["current"])
        except (KeyError, TypeError):
            return 0

    return read, "torch"


def _stats(torch: Any, device: int) -> Any:
    """PyTorch's nested allocator stats for an initialised CUDA and an int ``device``.
    The binding directly where it exists: the public wrapper only re-checks both, and
    this runs twice per test under ``--gpu-leaks``."""
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    return raw(device) if raw is not None else torch.cuda.memory.memory_stats_as_nested_dict(device)


def _counts(torch: Any, device: int) -> Tuple[int, int]:
    """(allocated, reserved) from one raw stats call: memory_allocated() and
    memory_reserved() each flatten the whole stats dict (~100 keys), which would cost a
    GPUContext exit several hundred microseconds. PyTorch has no cheaper counter read:
    this call (13-19 us on an H100 host) is most of what a leak check costs."""
    stats = _stats(torch, device)
    try:
        return (
            int(stats["allocated_bytes"]["all"]["current"]),
            int(stats["reserved_bytes"]["all"]["current"]),
        )
    except (KeyError, TypeError):  # no allocation yet on that device: empty stats
        return 0, 0


def _peak(torch: Any, device: int) -> int:
    stats = _stats(torch, device)
    try:
        return int(stats["allocated_bytes"]["all"]["peak"])
    except (KeyError, TypeError):  # no allocation yet on that device
        return 0


def _clear_cublas_workspaces(torch: Any) -> None:
    # cuBLAS/cuBLASLt keep one workspace per (handle, stream) allocated through the
    # caching allocator for the life of the process (tens of MiB on Hopper): without this
    # the first matmul inside a GPUContext would look like a leak and never come back.
    # (torch's own CudaMemoryLeakCheck clears them the same way.)
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        try:
            clear_workspaces()
        except Exception:
            pass  # an older build without the workspace map: nothing to clear


class TorchAdapter(FrameworkAdapter):
    """PyTorch's caching allocator, or gpukeeper's pool when ``use_torch_allocator()``
    routed PyTorch to it."""

    name = "torch"
    display_name = "PyTorch"
    modules = ("torch",)
    distributions = ("torch",)
    peak_follows_reader = True
    timer_priority = 20

    def in_use(self) -> bool:
        return torch_in_use() is not None

    def cuda_usable(self) -> bool:
        return torch_cuda() is not None

    def gpu_loaded(self) -> bool:
        # torch_in_use is cached once true: it answers first
        return torch_in_use() is not None or torch_cuda() is not None

    def current_device(self) -> Optional[int]:
        return torch_current_device()

    def context_devices(self) -> List[int]:
        torch = torch_in_use()
        if torch is None:
            return []
        has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
        devices = [
            d
            for d in range(torch.cuda.device_count())
            if has_context is not None and has_context(d)
        ]
        return devices + [int(torch.cuda.current_device())]

    def current_stream_handle(self, device: int) -> Optional[int]:
        torch = torch_cuda()
        if torch is None:
            return None
        return current_raw_stream(torch, device)

    def device_properties(self, device: int) -> Optional[Dict[str, Any]]:
        torch = loaded_torch()
        if torch is None:
            return None
        try:
            p = torch.cuda.get_device_properties(device)
            return dict(
                name=str(p.name),
                compute_capability=f"{p.major}.{p.minor}",
                compute_capability_tuple=(int(p.major), int(p.minor)),
                total_memory_bytes=int(p.total_memory),
                multiprocessors=int(p.multi_processor_count),
                l2_cache_bytes=getattr(p, "L2_cache_size", None),
                uuid=(f"GPU-{p.uuid}" if getattr(p, "uuid", None) else None),
                torch_cuda_version=torch.version.cuda,
            )
        except Exception:
            return None  # a broken torch CUDA build: the other sources still answer

    def oom_error(self) -> Optional[type]:
        return torch_oom_error()

    def array_type(self) -> Optional[type]:
        tensor = getattr(sys.modules.get("torch"), "Tensor", None)
        return tensor if isinstance(tensor, type) else None

    def describe_array(self, obj: Any, wanted: DeviceFilter) -> Optional[Tuple[int, LiveArray]]:
        try:
            dev = obj.device
            if not wanted(dev.type, dev.index):
                return None
            storage = obj.untyped_storage()
            ptr = int(storage.data_ptr())
            nbytes = int(storage.nbytes())
            if ptr == 0 or nbytes == 0:
                return None  # empty, or a wrapper subclass whose data lives elsewhere
            label = f"{dev.type}:{dev.index}" if dev.index is not None else dev.type
            is_base = obj._base is None
            graph = obj.grad_fn is not None
            rank = (2 if is_base else 0) * (1 << 62) + (1 << 61 if graph else 0)
            rank += obj.numel() * obj.element_size()
            entry = LiveArray(
                "torch",
                label,
                type(obj).__name__,
                tuple(obj.shape),
                torch_dtype_name(obj.dtype),
                nbytes,
                ptr,
                graph,
            )
        except Exception:
            return None  # sparse, meta, fake or otherwise storage-less tensors
        return rank, entry

    def holds_device_memory(self, obj: Any) -> bool:
        try:
            return bool(obj.device.type != "cpu" and obj.untyped_storage().nbytes() > 0)
        except Exception:
            return False

    def record_allocations(
        self, on_alloc: Callable[[Sequence[int]], None]
    ) -> Optional[StopRecording]:
        torch_types = torch_dispatch_mode()
        if torch_types is None:
            return None
        return entered(_recorder_class(torch_types)(on_alloc))

    def memory(self, device: int) -> Optional[FrameworkMemory]:
        counts = _figure(device, "pool_usage", _counts)
        return None if counts is None else FrameworkMemory("torch", *counts)

    def release(self, devices: Optional[List[int]]) -> int:
        assert devices is not None, "not whole_process: the registry passes the devices"
        torch = torch_in_use()
        if torch is None:
            return 0
        _clear_cublas_workspaces(torch)
        if torch_uses_gpukeeper():
            released = 0
            for d in devices:
                released += sys.modules["gpukeeper.integrations.torch_allocator"].release(d)
            return released
        devices = [d for d in devices if d < torch.cuda.device_count()]
        before = sum(_counts(torch, d)[1] for d in devices)
        torch.cuda.empty_cache()
        try:
            torch.cuda.ipc_collect()
        except Exception:
            pass  # no IPC handles, or no driver support: nothing to collect
        after = sum(_counts(torch, d)[1] for d in devices)
        return max(0, before - after)

    def reset_peak(self, device: int) -> bool:
        # Under use_torch_allocator() the peak is that of the pool behind PyTorch (not a
        # registered MemoryPool, so the gpukeeper adapter does not count it).
        torch = _torch_on(device)
        if torch is None:
            return False
        pool = _pool_behind_torch()
        if pool:
            return bool(pool.reset_peak(device))
        torch.cuda.reset_peak_memory_stats(device)
        return True

    def peak(self, device: int) -> Optional[int]:
        return _figure(device, "peak_allocated", _peak)

    def memory_and_peak(self, device: int) -> Tuple[Optional[FrameworkMemory], Optional[int]]:
        # One statistics call for the three figures: each call builds PyTorch's nested
        # dict of about 200 items (13-19 us on an H100 host).
        torch = torch_in_use()
        if torch is None or device >= torch.cuda.device_count():
            return None, None
        if torch_uses_gpukeeper():
            return self.memory(device), self.peak(device)
        stats = _stats(torch, device)
        try:
            allocated = stats["allocated_bytes"]["all"]
            reserved = int(stats["reserved_bytes"]["all"]["current"])
            return FrameworkMemory("torch", int(allocated["current"]), reserved), int(
                allocated["peak"]
            )
        except (KeyError, TypeError):  # no allocation yet on that device
            return FrameworkMemory("torch", 0, 0), 0

    def synchronize(self, devices: Optional[List[int]]) -> None:
        assert devices is not None, "not whole_process: the registry passes the devices"
        torch = torch_in_use()
        if torch is None:
            return
        count = torch.cuda.device_count()
        for d in devices:
            if d < count:
                torch.cuda.synchronize(d)

    def l2_cache_size(self, device: int) -> Optional[int]:
        torch = torch_cuda()
        if torch is None:
            return None
        try:
            return int(torch.cuda.get_device_properties(device).L2_cache_size)
        except Exception:
            return None  # an older build without the property: another adapter may know

    def l2_scratch(self, device: int, nbytes: int) -> Optional[Scratch]:
        torch = torch_cuda()
        if torch is None:
            return None
        array = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
        return FilledScratch(array, lambda: array.fill_(0), torch.cuda.stream)


def torch_dtype_name(dtype: Any) -> str:
    """A PyTorch dtype as a report writes it: ``float32`` for ``torch.float32``."""
    return str(dtype).replace("torch.", "")


_dispatch_mode_class: Any = None


def _storage_ptrs(tensors: Sequence[Any]) -> List[int]:
    ptrs = []
    for t in tensors:
        try:
            ptr = int(t.untyped_storage().data_ptr())
        except Exception:
            continue  # sparse/meta/fake: no storage to attribute
        if ptr:
            ptrs.append(ptr)
    return ptrs


def _recorder_class(torch_types: Tuple[type, type]) -> Any:
    """A TorchDispatchMode that passes the address of each new storage to its callback
    (made once), from what ``torch_dispatch_mode()`` gives. It sees every ATen op of the
    thread that entered it (and of autograd's threads, which inherit it)."""
    global _dispatch_mode_class
    if _dispatch_mode_class is None:
        tensor_type, TorchDispatchMode = torch_types

        class _Recorder(TorchDispatchMode):  # type: ignore[misc, valid-type]
            def __init__(self, on_alloc: Callable[[Sequence[int]], None]) -> None:
                super().__init__()
                self.on_alloc = on_alloc

            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                out = func(*args, **(kwargs or {}))
                # Views and in-place ops make no new storage: only the others are recorded
                # (a storage's address, reused later by the allocator, is overwritten then).
                if not func.is_view and not func._schema.is_mutable:
                    if isinstance(out, tensor_type):
                        ptrs = _storage_ptrs((out,))
                    elif isinstance(out, (tuple, list)):
                        ptrs = _storage_ptrs([t for t in out if isinstance(t, tensor_type)])
                    else:
                        ptrs = []
                    if ptrs:
                        self.on_alloc(ptrs)
                return out

        _dispatch_mode_class = _Recorder
    return _dispatch_mode_class


class TorchBackend(FrameworkEventBackend):
    """``torch.cuda.Event`` on PyTorch's current stream of the device."""

    name = "torch"
    needs = "PyTorch loaded with usable CUDA"
    framework = staticmethod(torch_cuda)

    def current_stream(self) -> Any:
        return self.module.cuda.current_stream(self.device.index)

    def new_event(self) -> Any:
        return self.module.cuda.Event(enable_timing=True)

    def event_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def synchronize(self) -> None:
        self.module.cuda.synchronize(self.device.index)


TorchAdapter.timer_backend = TorchBackend

"""What each framework in the process holds on a device, and how to make it let go.

One adapter per framework (:mod:`.torch_adapter`, :mod:`.cupy_adapter`,
:mod:`.jax_adapter`, gpukeeper's own pools in :mod:`.pools_adapter`, and a CUDA context
with no framework in :mod:`.cuda_context_adapter`), each owning its memory counters,
release, synchronize, timing marks and plan facts, L2 scratch, live arrays and
allocation sites. :mod:`.registry` lists them; this module gives the answers over all of
them (the measuring code reads the frameworks only through these: ``allocated_reader``,
``reserved_bytes``, ``l2_cache_size``, ``l2_scratch``, ``result_framework`` ...);
:mod:`.contexts` says which devices hold contexts, :mod:`.live_arrays` which tensors
and arrays hold memory. Nothing here imports a framework: one that is not
in ``sys.modules`` is not in use, and importing it would cost seconds and create a CUDA
context.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

from gpukeeper.base import device_names as _devices
from gpukeeper.frameworks.adapter import (
    FrameworkAdapter,
    FrameworkMemory,
    InUseReader,
    Scratch,
    memory_dict,
)
from gpukeeper.frameworks.contexts import (
    ENGINE,
    OUTSIDE,
    ContextCensus,
    active_devices,
    context_census,
    context_devices,
    engine_memory,
    gpu_frameworks_loaded,
    outside_memory,
)
from gpukeeper.frameworks.cupy_adapter import (
    CupyAdapter,
    cupy_memory_hook,
    loaded_cupy,
)
from gpukeeper.frameworks.driver import primary_context_active
from gpukeeper.frameworks.jax_adapter import (
    JaxAdapter,
    holds_jax_arrays,
    jax_block_until_ready,
    jax_device_index,
    jax_gpu_devices,
    jax_memory_stats,
    jax_release_hint,
)
from gpukeeper.frameworks.live_arrays import (
    LiveArray,
    device_array_predicate,
    live_array_holders,
    live_arrays,
    live_buffers,
)
from gpukeeper.frameworks.pools_adapter import (
    PoolsAdapter,
    host_pool_memory,
    host_pool_peak,
    live_pools,
    register_pool,
    reset_host_pool_peak,
)
from gpukeeper.frameworks.registry import (
    ADAPTERS,
    adapter,
    array_frameworks,
    device_properties,
    distributions,
    framework_dirs,
    result_framework,
    result_gpu_device,
    waiting_on_result,
)
from gpukeeper.frameworks.torch_adapter import (
    TorchAdapter,
    compiled_frames,
    import_torch,
    loaded_torch,
    torch_allocated_reader,
    torch_cuda,
    torch_device_name,
    torch_dispatch_mode,
    torch_dtype_name,
    torch_in_use,
    torch_storage_weakref,
    torch_uses_gpukeeper,
)

__all__ = [
    "ADAPTERS",
    "ENGINE",
    "OUTSIDE",
    "outside_memory",
    "ContextCensus",
    "CupyAdapter",
    "FrameworkAdapter",
    "FrameworkMemory",
    "InUseReader",
    "JaxAdapter",
    "PoolsAdapter",
    "TorchAdapter",
    "array_frameworks",
    "device_properties",
    "distributions",
    "result_framework",
    "result_gpu_device",
    "waiting_on_result",
    "LiveArray",
    "active_devices",
    "Scratch",
    "adapter",
    "allocated_reader",
    "compiled_frames",
    "context_census",
    "cupy_memory_hook",
    "current_framework_device",
    "device_array_predicate",
    "framework_dirs",
    "context_devices",
    "engine_memory",
    "gpu_frameworks_loaded",
    "holds_jax_arrays",
    "host_pool_memory",
    "host_pool_peak",
    "jax_block_until_ready",
    "jax_device_index",
    "jax_gpu_devices",
    "jax_memory_stats",
    "import_torch",
    "jax_release_hint",
    "l2_cache_size",
    "l2_scratch",
    "live_array_holders",
    "live_arrays",
    "live_buffers",
    "live_pools",
    "memory_dict",
    "loaded_frameworks",
    "loaded_cupy",
    "loaded_torch",
    "oom_error_types",
    "memory_by_framework",
    "peak_by_framework",
    "primary_context_active",
    "register_pool",
    "release_all_caches",
    "release_hint",
    "reserved_bytes",
    "reset_host_pool_peak",
    "reset_peaks",
    "synchronize_all",
    "torch_allocated_reader",
    "torch_cuda",
    "torch_device_name",
    "torch_dispatch_mode",
    "torch_dtype_name",
    "torch_in_use",
    "torch_storage_weakref",
    "torch_uses_gpukeeper",
]


def current_framework_device() -> Optional[int]:
    """The CUDA device a loaded framework calls current: the first in the registry that
    says (PyTorch's once it has initialised CUDA, else CuPy's); None when none says.
    Imports nothing and initialises nothing."""
    for fw in ADAPTERS.values():
        index = fw.current_device()
        if index is not None:
            return index
    return None


# gpukeeper.devices sits below this layer and asks through this for "the current device".
_devices.set_current_index_source(current_framework_device)


def oom_error_types() -> Tuple[type, ...]:
    """The out-of-memory error types of the loaded frameworks (``torch.cuda.OutOfMemoryError``)."""
    found = (fw.oom_error() for fw in ADAPTERS.values())
    return tuple(error for error in found if error is not None)


class _Targets:
    """The devices an adapter acts on: the one named, else those the process uses
    (asked of the driver once per call, and only if an adapter needs them)."""

    def __init__(self, device: Optional[int]) -> None:
        self.device = device
        self.active: Optional[List[int]] = None

    def of(self, fw: FrameworkAdapter) -> Optional[List[int]]:
        if self.device is not None:
            return [self.device]
        if fw.whole_process:
            return None
        if self.active is None:
            self.active = active_devices()
        return self.active


def loaded_frameworks() -> List[str]:
    """Frameworks present in the process that hold (or could hold) device memory."""
    return [name for name, fw in ADAPTERS.items() if fw.in_use()]


def memory_by_framework(device: int = 0) -> Dict[str, FrameworkMemory]:
    """Each loaded framework's allocated and reserved bytes on ``device``."""
    result = {}
    for name, fw in ADAPTERS.items():
        memory = fw.memory(device)
        if memory is not None:
            result[name] = memory
    return result


def reset_peaks(device: int) -> List[str]:
    """Starts a new peak of allocated bytes on ``device`` in every framework that keeps
    one; the names of those that do."""
    return [name for name, fw in ADAPTERS.items() if fw.in_use() and fw.reset_peak(device)]


def peak_by_framework(device: int) -> Dict[str, int]:
    """Each framework's most allocated bytes on ``device`` since ``reset_peaks``; only
    the frameworks that keep a resettable peak."""
    result = {}
    for name, fw in ADAPTERS.items():
        if fw.in_use():
            peak = fw.peak(device)
            if peak is not None:
                result[name] = peak
    return result


def synchronize_all(device: Optional[int] = None) -> None:
    """Waits for the queued work of every loaded framework (all devices when None)."""
    targets = _Targets(device)
    for fw in ADAPTERS.values():
        if fw.in_use():
            fw.synchronize(targets.of(fw))


def release_all_caches(device: Optional[int] = None) -> Dict[str, int]:
    """Releases every framework's cached device memory; bytes released per framework."""
    targets = _Targets(device)
    return {name: fw.release(targets.of(fw)) if fw.in_use() else 0 for name, fw in ADAPTERS.items()}


def release_hint(name: str) -> Optional[str]:
    """For a framework whose cache cannot be released from outside (JAX), how the user
    can make it returnable; None for the frameworks whose caches ``release_all_caches``
    empties."""
    fw = ADAPTERS.get(name)
    return fw.release_hint() if fw is not None else None


def reserved_bytes(device: int) -> int:
    """The bytes every loaded framework holds from the driver on ``device`` (0: their
    counters see nothing there)."""
    return sum(m.reserved or 0 for m in memory_by_framework(device).values())


def allocated_reader(device: int) -> Tuple[Callable[[], int], str]:
    """(the cheapest reader of allocated bytes on ``device`` that sees every loaded
    framework, the name its figures go under): PyTorch's counters (or the pool behind
    it) when PyTorch is the one framework, that framework's own when another is alone,
    else the sum over all of them (``"frameworks"``)."""
    loaded = loaded_frameworks()
    if loaded == ["torch"] or (not loaded and torch_cuda() is not None):
        return torch_allocated_reader(device)
    if len(loaded) == 1:
        fw = ADAPTERS[loaded[0]]

        def read_one() -> int:
            m = fw.memory(device)
            return (m.allocated or 0) if m is not None else 0

        return read_one, loaded[0]

    def read_all() -> int:
        return sum(m.allocated or 0 for m in memory_by_framework(device).values())

    return read_all, "frameworks"


def l2_cache_size(device: int) -> int:
    """The L2 cache size of CUDA device ``device`` in bytes, from the first loaded
    framework that can read it (PyTorch, then CuPy); 0 when none can."""
    for fw in ADAPTERS.values():
        size = fw.l2_cache_size(device)
        if size:
            return size
    return 0


def l2_scratch(
    device: int, nbytes: int, prefer: Optional[str] = None
) -> Optional[Tuple[str, Scratch]]:
    """(the framework's name, a buffer of ``nbytes`` on ``device`` from it) to flush the
    L2 cache with: from ``prefer`` (the framework whose stream is timed) when it can,
    else from the first loaded framework that can; None when none can."""
    names = ([prefer] if prefer in ADAPTERS else []) + [n for n in ADAPTERS if n != prefer]
    for name in names:
        scratch = ADAPTERS[name].l2_scratch(device, nbytes)
        if scratch is not None:
            return name, scratch
    return None

"""What each framework in the process holds on a device, and how to make it let go.

One adapter per framework (:mod:`.torch_adapter`, :mod:`.cupy_adapter`,
:mod:`.jax_adapter`, gpukeeper's own pools in :mod:`.pools_adapter`, and a CUDA context
with no framework in :mod:`.cuda_context_adapter`), each owning its memory counters,
release, synchronize and timing marks. This module holds the registry and the answers
over all of them; :mod:`.contexts` says which devices hold contexts, :mod:`.live_arrays`
which tensors and arrays hold memory. Nothing here imports a framework: one that is not
in ``sys.modules`` is not in use, and importing it would cost seconds and create a CUDA
context.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from gpukeeper.frameworks.adapter import FrameworkAdapter, FrameworkMemory, memory_dict
from gpukeeper.frameworks.contexts import (
    ENGINE,
    ContextCensus,
    active_devices,
    context_census,
    context_devices,
    engine_memory,
    gpu_frameworks_loaded,
)
from gpukeeper.frameworks.cupy_adapter import CupyAdapter
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
from gpukeeper.frameworks.live_arrays import LiveArray, live_array_holders, live_arrays
from gpukeeper.frameworks.pools_adapter import (
    PoolsAdapter,
    host_pool_memory,
    host_pool_peak,
    live_pools,
    register_pool,
    reset_host_pool_peak,
)
from gpukeeper.frameworks.torch_adapter import (
    TorchAdapter,
    loaded_torch,
    torch_cuda,
    torch_in_use,
    torch_uses_gpukeeper,
)

__all__ = [
    "ADAPTERS",
    "ENGINE",
    "ContextCensus",
    "FrameworkAdapter",
    "FrameworkMemory",
    "LiveArray",
    "active_devices",
    "adapter",
    "context_census",
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
    "jax_release_hint",
    "live_array_holders",
    "live_arrays",
    "live_pools",
    "memory_dict",
    "loaded_frameworks",
    "loaded_torch",
    "memory_by_framework",
    "peak_by_framework",
    "primary_context_active",
    "register_pool",
    "release_all_caches",
    "release_hint",
    "reset_host_pool_peak",
    "reset_peaks",
    "synchronize_all",
    "torch_cuda",
    "torch_in_use",
    "torch_uses_gpukeeper",
]

#: The adapters, in the order reports list them. Tests replace entries to fake a machine.
ADAPTERS: Dict[str, FrameworkAdapter] = {
    "torch": TorchAdapter(),
    "cupy": CupyAdapter(),
    "jax": JaxAdapter(),
    "gpukeeper": PoolsAdapter(),
}


def adapter(name: str) -> FrameworkAdapter:
    """The adapter registered as ``name`` (KeyError for an unknown name)."""
    return ADAPTERS[name]


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

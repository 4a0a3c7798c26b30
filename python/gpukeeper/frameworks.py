"""What each framework in the process holds on a device, and how to make it let go.

One small adapter per framework (PyTorch, CuPy, JAX, gpukeeper's own pools), used by
cleanup (``GPUContext``, ``cleanup_cuda``) and by the device account (``memory_report``).
Nothing here imports a framework: one that is not in ``sys.modules`` is not in use, and
importing it would cost seconds and create a CUDA context.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional

__all__ = [
    "FrameworkMemory",
    "loaded_frameworks",
    "memory_by_framework",
    "synchronize_all",
    "release_all_caches",
    "register_pool",
    "live_pools",
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


# --------------------------------------------------------------------- gpukeeper pools

_pools: "weakref.WeakSet[Any]" = weakref.WeakSet()
_extra_pools: List[Callable[[], Iterable[Any]]] = []


def register_pool(pool: Any) -> None:
    """Counts a MemoryPool (anything with stats/devices/emergency_cleanup_all) in reports."""
    _pools.add(pool)


def register_pool_source(source: Callable[[], Iterable[Any]]) -> None:
    """Adds a function returning more pools (e.g. the pools behind the torch allocator)."""
    _extra_pools.append(source)


def live_pools() -> List[Any]:
    """Every gpukeeper pool registry alive in the process."""
    pools = list(_pools)
    for source in _extra_pools:
        pools.extend(source())
    return pools


def _gpukeeper_memory(device: int) -> Optional[FrameworkMemory]:
    pools = live_pools()
    if not pools:
        return None
    allocated = reserved = 0
    for pool in pools:
        if getattr(pool, "kind", "device") not in ("device", "async"):
            continue  # host and pinned pools hold no device memory
        if device not in pool.devices():
            continue
        stats = pool.stats(device)
        allocated += stats.allocated_bytes
        reserved += stats.reserved_bytes
    return FrameworkMemory("gpukeeper", allocated, reserved)


def _gpukeeper_release(device: Optional[int]) -> int:
    released = 0
    for pool in live_pools():
        if device is None:
            released += pool.emergency_cleanup_all()
        elif device in pool.devices():
            released += pool.emergency_cleanup(device)
    return released


# --------------------------------------------------------------------- PyTorch


def _torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "cuda"):
        return None
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None  # no CUDA tensor was ever made: nothing to read or release
    except Exception:
        return None
    return torch


def _torch_uses_gpukeeper() -> bool:
    """True when use_torch_allocator() routed PyTorch's allocations to gpukeeper: then
    PyTorch's own counters are meaningless and the pool's are read instead."""
    integration = sys.modules.get("gpukeeper.integrations.torch_allocator")
    return bool(integration is not None and integration.is_active())


def _torch_memory(device: int) -> Optional[FrameworkMemory]:
    torch = _torch()
    if torch is None or device >= torch.cuda.device_count():
        return None
    if _torch_uses_gpukeeper():
        integration = sys.modules["gpukeeper.integrations.torch_allocator"]
        allocated, reserved = integration.pool_usage(device)
        return FrameworkMemory("torch", allocated, reserved)
    return FrameworkMemory(
        "torch",
        int(torch.cuda.memory_allocated(device)),
        int(torch.cuda.memory_reserved(device)),
    )


def _torch_release(device: Optional[int]) -> int:
    torch = _torch()
    if torch is None:
        return 0
    if _torch_uses_gpukeeper():
        return sys.modules["gpukeeper.integrations.torch_allocator"].release(device)
    devices = range(torch.cuda.device_count()) if device is None else [device]
    before = sum(int(torch.cuda.memory_reserved(d)) for d in devices)
    torch.cuda.empty_cache()
    try:
        torch.cuda.ipc_collect()
    except Exception:
        pass  # no IPC handles, or no driver support: nothing to collect
    after = sum(int(torch.cuda.memory_reserved(d)) for d in devices)
    return max(0, before - after)


def _torch_synchronize(device: Optional[int]) -> None:
    torch = _torch()
    if torch is None:
        return
    devices = range(torch.cuda.device_count()) if device is None else [device]
    for d in devices:
        torch.cuda.synchronize(d)


# --------------------------------------------------------------------- CuPy


def _cupy() -> Any:
    cupy = sys.modules.get("cupy")
    if cupy is None or not hasattr(cupy, "cuda"):
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None
    except Exception:
        return None
    return cupy


def _cupy_memory(device: int) -> Optional[FrameworkMemory]:
    cupy = _cupy()
    if cupy is None:
        return None
    pool = cupy.get_default_memory_pool()
    with cupy.cuda.Device(device):
        # CuPy's default pool is per device; its counters read the current device's.
        return FrameworkMemory("cupy", int(pool.used_bytes()), int(pool.total_bytes()))


def _cupy_release(device: Optional[int]) -> int:
    cupy = _cupy()
    if cupy is None:
        return 0
    pool = cupy.get_default_memory_pool()
    devices = range(cupy.cuda.runtime.getDeviceCount()) if device is None else [device]
    released = 0
    for d in devices:
        with cupy.cuda.Device(d):
            before = int(pool.total_bytes())
            pool.free_all_blocks()
            released += max(0, before - int(pool.total_bytes()))
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    return released


def _cupy_synchronize(device: Optional[int]) -> None:
    cupy = _cupy()
    if cupy is None:
        return
    devices = range(cupy.cuda.runtime.getDeviceCount()) if device is None else [device]
    for d in devices:
        with cupy.cuda.Device(d):
            cupy.cuda.runtime.deviceSynchronize()


# --------------------------------------------------------------------- JAX


def _jax_devices() -> List[Any]:
    jax = sys.modules.get("jax")
    if jax is None:
        return []
    try:
        return [d for d in jax.devices() if d.platform == "gpu"]
    except Exception:
        return []


def _jax_memory(device: int) -> Optional[FrameworkMemory]:
    devices = _jax_devices()
    if device >= len(devices):
        return None
    try:
        stats = devices[device].memory_stats() or {}
    except Exception:
        stats = {}
    allocated = stats.get("bytes_in_use")
    reserved = stats.get("pool_bytes", stats.get("bytes_reserved", allocated))
    return FrameworkMemory("jax", allocated, reserved)


def _jax_release(device: Optional[int]) -> int:
    jax = sys.modules.get("jax")
    if jax is None or not _jax_devices():
        return 0
    try:
        jax.clear_caches()  # compiled executables; JAX's buffer pool has no public release
    except Exception:
        pass
    return 0


def _jax_synchronize(device: Optional[int]) -> None:
    jax = sys.modules.get("jax")
    if jax is None or not _jax_devices():
        return
    try:
        jax.effects_barrier()
    except Exception:
        pass


# --------------------------------------------------------------------- the registry

_READERS: Dict[str, Callable[[int], Optional[FrameworkMemory]]] = {
    "torch": _torch_memory,
    "cupy": _cupy_memory,
    "jax": _jax_memory,
    "gpukeeper": _gpukeeper_memory,
}
_RELEASERS: Dict[str, Callable[[Optional[int]], int]] = {
    "torch": _torch_release,
    "cupy": _cupy_release,
    "jax": _jax_release,
    "gpukeeper": _gpukeeper_release,
}
_SYNCHRONIZERS: List[Callable[[Optional[int]], None]] = [
    _torch_synchronize,
    _cupy_synchronize,
    _jax_synchronize,
]


def loaded_frameworks() -> List[str]:
    """Frameworks present in the process that hold (or could hold) device memory."""
    names = []
    if _torch() is not None:
        names.append("torch")
    if _cupy() is not None:
        names.append("cupy")
    if _jax_devices():
        names.append("jax")
    if live_pools():
        names.append("gpukeeper")
    return names


def memory_by_framework(device: int = 0) -> Dict[str, FrameworkMemory]:
    """Each loaded framework's allocated and reserved bytes on ``device``."""
    result = {}
    for name, reader in _READERS.items():
        memory = reader(device)
        if memory is not None:
            result[name] = memory
    return result


def synchronize_all(device: Optional[int] = None) -> None:
    """Waits for the queued work of every loaded framework (all devices when None)."""
    for sync in _SYNCHRONIZERS:
        sync(device)
    # gpukeeper's pools synchronize the streams they use when they release memory.


def release_all_caches(device: Optional[int] = None) -> Dict[str, int]:
    """Releases every framework's cached device memory; bytes released per framework."""
    return {name: release(device) for name, release in _RELEASERS.items()}

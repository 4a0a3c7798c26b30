"""What each framework in the process holds on a device, and how to make it let go.

One small adapter per framework (PyTorch, CuPy, JAX, gpukeeper's own pools), used by
cleanup (``GPUContext``, ``cleanup_cuda``) and by the device account (``memory_report``).
Nothing here imports a framework: one that is not in ``sys.modules`` is not in use, and
importing it would cost seconds and create a CUDA context.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

__all__ = [
    "FrameworkMemory",
    "loaded_frameworks",
    "memory_by_framework",
    "synchronize_all",
    "release_all_caches",
    "register_pool",
    "live_pools",
    "active_devices",
    "host_pool_memory",
    "LiveArray",
    "live_arrays",
    "live_array_holders",
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
    allocated, reserved = _torch_counts(torch, device)
    return FrameworkMemory("torch", allocated, reserved)


def _torch_counts(torch: Any, device: int) -> Tuple[int, int]:
    """(allocated, reserved) from one raw stats call: memory_allocated() and
    memory_reserved() each flatten the whole stats dict (~100 keys), which would cost a
    GPUContext exit several hundred microseconds."""
    stats = torch.cuda.memory.memory_stats_as_nested_dict(device)
    try:
        return (
            int(stats["allocated_bytes"]["all"]["current"]),
            int(stats["reserved_bytes"]["all"]["current"]),
        )
    except (KeyError, TypeError):  # no allocation yet on that device: empty stats
        return 0, 0


def _torch_release(device: Optional[int]) -> int:
    torch = _torch()
    if torch is None:
        return 0
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
    if _torch_uses_gpukeeper():
        return sys.modules["gpukeeper.integrations.torch_allocator"].release(device)
    devices = _torch_devices(torch, device)
    before = sum(_torch_counts(torch, d)[1] for d in devices)
    torch.cuda.empty_cache()
    try:
        torch.cuda.ipc_collect()
    except Exception:
        pass  # no IPC handles, or no driver support: nothing to collect
    after = sum(_torch_counts(torch, d)[1] for d in devices)
    return max(0, before - after)


def _torch_devices(torch: Any, device: Optional[int]) -> List[int]:
    if device is not None:
        return [device]
    # "All devices" means the ones this process uses: touching another would create a
    # CUDA context there (hundreds of MiB) just to find nothing.
    count = torch.cuda.device_count()
    return [d for d in active_devices() if d < count]


def _torch_synchronize(device: Optional[int]) -> None:
    torch = _torch()
    if torch is None:
        return
    for d in _torch_devices(torch, device):
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
    devices = _cupy_devices(cupy, device)
    released = 0
    for d in devices:
        with cupy.cuda.Device(d):
            before = int(pool.total_bytes())
            pool.free_all_blocks()
            released += max(0, before - int(pool.total_bytes()))
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    return released


def _cupy_devices(cupy: Any, device: Optional[int]) -> List[int]:
    if device is not None:
        return [device]
    # As for torch: cupy.cuda.Device(d) on a device without a context would create one.
    count = cupy.cuda.runtime.getDeviceCount()
    return [d for d in active_devices() if d < count]


def _cupy_synchronize(device: Optional[int]) -> None:
    cupy = _cupy()
    if cupy is None:
        return
    for d in _cupy_devices(cupy, device):
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


# --------------------------------------------------------------------- devices in use

# (cuDevicePrimaryCtxGetState, [CUdevice per ordinal]) once loaded; False when the driver
# cannot be reached through ctypes (no libcuda, or cuInit failed).
_driver: Any = None
_driver_lock = threading.Lock()


def _load_driver() -> Any:
    global _driver
    with _driver_lock:
        if _driver is not None:
            return _driver
        try:
            lib = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
            if lib.cuInit(0) != 0:
                raise OSError("cuInit failed")
            count = ctypes.c_int(0)
            if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
                raise OSError("cuDeviceGetCount failed")
            handles = []
            for ordinal in range(count.value):
                dev = ctypes.c_int(0)
                if lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
                    raise OSError("cuDeviceGet failed")
                handles.append(dev.value)
            get_state = lib.cuDevicePrimaryCtxGetState
            get_state.argtypes = [
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_uint),
                ctypes.POINTER(ctypes.c_int),
            ]
            get_state.restype = ctypes.c_int
            _driver = (get_state, handles)
        except (OSError, AttributeError):
            _driver = False
        return _driver


def _cuda_maybe_in_use() -> bool:
    """Whether anything in the process could have made a CUDA context (cheap checks
    only: without this, asking the driver would initialise it for nothing)."""
    if _torch() is not None or _cupy() is not None or _jax_devices():
        return True
    return any(getattr(p, "kind", "device") in ("device", "async", "pinned") for p in live_pools())


def active_devices() -> List[int]:
    """CUDA devices on which this process holds a context, without creating one.

    Asks the driver (``cuDevicePrimaryCtxGetState`` through ctypes; every framework here
    uses the primary context). Without a reachable driver: the devices of gpukeeper's
    device pools and PyTorch's current device. Empty when nothing uses CUDA.
    """
    if not _cuda_maybe_in_use():
        return []
    driver = _load_driver()
    if driver:
        get_state, handles = driver
        flags = ctypes.c_uint(0)
        active = ctypes.c_int(0)
        result = []
        for ordinal, handle in enumerate(handles):
            if get_state(handle, ctypes.byref(flags), ctypes.byref(active)) == 0 and active.value:
                result.append(ordinal)
        return result
    devices = set()
    for pool in live_pools():
        if getattr(pool, "kind", "device") in ("device", "async"):
            devices.update(pool.devices())
    torch = _torch()
    if torch is not None:
        has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
        for d in range(torch.cuda.device_count()):
            if has_context is not None and has_context(d):
                devices.add(d)
        devices.add(torch.cuda.current_device())
    return sorted(devices)


# --------------------------------------------------------------------- host memory


def host_pool_memory() -> Optional[FrameworkMemory]:
    """Bytes gpukeeper's host and pinned pools hold (``None`` when there are none).

    Not part of ``memory_by_framework``, which counts device memory only; cleanup
    watches it too, as it is all there is to watch without a GPU.
    """
    allocated = reserved = 0
    found = False
    for pool in live_pools():
        if getattr(pool, "kind", "device") not in ("host", "pinned"):
            continue
        found = True
        for d in pool.devices():
            stats = pool.stats(d)
            if stats is not None:
                allocated += stats.allocated_bytes
                reserved += stats.reserved_bytes
    return FrameworkMemory("gpukeeper", allocated, reserved) if found else None


# --------------------------------------------------------------------- live arrays


@dataclass(frozen=True)
class LiveArray:
    """One allocation held by a live tensor or array that Python can see.

    ``nbytes`` is the whole allocation (the storage for PyTorch, the memory chunk for
    CuPy), counted once however many views share it; ``shape``/``dtype``/``kind`` are
    those of the base tensor or array when a view's base is alive. ``data_ptr`` is the
    allocation's address, the key under which creation sites are recorded.
    """

    framework: str
    device: str
    kind: str
    shape: Tuple[int, ...]
    dtype: str
    nbytes: int
    data_ptr: int


def _device_filter(device: Union[int, str, None]) -> Callable[[str, Optional[int]], bool]:
    if device is None:
        return lambda kind, index: kind == "cuda"
    if device == "cpu":
        return lambda kind, index: kind == "cpu"
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        from gpukeeper.errors import InvalidInputError

        raise InvalidInputError(
            f"live_arrays: device must be a CUDA ordinal, None or 'cpu', got {device!r}"
        )
    return lambda kind, index: kind == "cuda" and index == device


def _walk_arrays(device: Union[int, str, None]) -> Iterator[Tuple[Tuple[str, str, int], int, LiveArray, Any]]:
    """Each PyTorch tensor and CuPy array on ``device`` that Python can reach, as
    ``(allocation key, rank, entry, object)``; shared by ``live_arrays`` and
    ``live_array_holders``."""
    wanted = _device_filter(device)
    torch = sys.modules.get("torch")
    tensor_type = getattr(torch, "Tensor", None) if torch is not None else None
    cupy = sys.modules.get("cupy")
    cupy_type = getattr(cupy, "ndarray", None) if cupy is not None else None
    if tensor_type is None and cupy_type is None:
        return
    # Classified by type(), cached per type: isinstance() would call __class__ on every
    # object (slower, and some proxies warn when touched).
    kinds: Dict[type, int] = {}
    for obj in gc.get_objects():
        cls = type(obj)
        kind = kinds.get(cls)
        if kind is None:
            if tensor_type is not None and issubclass(cls, tensor_type):
                kind = 1
            elif cupy_type is not None and issubclass(cls, cupy_type):
                kind = 2
            else:
                kind = 0
            kinds[cls] = kind
        if kind == 0:
            continue
        if kind == 1:
            try:
                dev = obj.device
                if not wanted(dev.type, dev.index):
                    continue
                storage = obj.untyped_storage()
                ptr = int(storage.data_ptr())
                nbytes = int(storage.nbytes())
                if ptr == 0 or nbytes == 0:
                    continue  # empty, or a wrapper subclass whose data lives elsewhere
                label = f"{dev.type}:{dev.index}" if dev.index is not None else dev.type
                is_base = obj._base is None
                rank = (2 if is_base else 0) * (1 << 62) + obj.numel() * obj.element_size()
                entry = LiveArray(
                    "torch", label, type(obj).__name__, tuple(obj.shape),
                    str(obj.dtype).replace("torch.", ""), nbytes, ptr,
                )
            except Exception:
                continue  # sparse, meta, fake or otherwise storage-less tensors
            yield ("torch", label, ptr), rank, entry, obj
        else:
            try:
                index = int(obj.device.id)
                if not wanted("cuda", index):
                    continue
                mem = obj.data.mem
                ptr = int(mem.ptr)
                nbytes = int(mem.size)
                if ptr == 0 or nbytes == 0:
                    continue
                label = f"cuda:{index}"
                rank = (2 if obj.base is None else 0) * (1 << 62) + int(obj.nbytes)
                entry = LiveArray(
                    "cupy", label, type(obj).__name__, tuple(obj.shape), str(obj.dtype), nbytes, ptr
                )
            except Exception:
                continue
            yield ("cupy", label, ptr), rank, entry, obj


def live_arrays(device: Union[int, str, None] = None) -> List[LiveArray]:
    """Every PyTorch tensor and CuPy array Python can reach on ``device``, largest first.

    ``device``: a CUDA ordinal, ``None`` (every CUDA device) or ``"cpu"`` (host tensors).
    Walks ``gc.get_objects()``: tens of milliseconds, meant for reports and leak hunts,
    never for a fast path. Memory held only from C++ (an autograd graph's saved tensors,
    a library's workspace) is not seen.
    """
    found: Dict[Tuple[str, str, int], Tuple[int, LiveArray]] = {}
    for key, rank, entry, _obj in _walk_arrays(device):
        # Several tensors may share one allocation: keep the one that best describes it
        # (a base over a view, then the largest).
        old = found.get(key)
        if old is None or rank > old[0]:
            found[key] = (rank, entry)
    return sorted((e for _, e in found.values()), key=lambda e: (-e.nbytes, e.framework, e.data_ptr))


def live_array_holders(device: Union[int, str, None] = None) -> List[Tuple[LiveArray, List[Any]]]:
    """Like ``live_arrays``, with the Python objects (tensors, views, arrays) that refer to
    each allocation: the allocation is freed once they all die (unless C++ holds it too).

    For cleanup that waits for those objects to die (weak references); the list holds
    them strongly, so drop it promptly.
    """
    found: Dict[Tuple[str, str, int], Tuple[int, LiveArray, List[Any]]] = {}
    for key, rank, entry, obj in _walk_arrays(device):
        old = found.get(key)
        if old is None:
            found[key] = (rank, entry, [obj])
        else:
            old[2].append(obj)
            if rank > old[0]:
                found[key] = (rank, entry, old[2])
    ordered = sorted(found.values(), key=lambda v: (-v[1].nbytes, v[1].framework, v[1].data_ptr))
    return [(entry, objs) for _, entry, objs in ordered]

"""What each framework in the process holds on a device, and how to make it let go.

One small adapter per framework (PyTorch, CuPy, JAX, gpukeeper's own pools), used by
cleanup (``GPUContext``, ``cleanup_cuda``) and by the device account (``memory_report``).
Nothing here imports a framework: one that is not in ``sys.modules`` is not in use, and
importing it would cost seconds and create a CUDA context.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from gpukeeper import host, nvml
from gpukeeper.devices import current_cuda_index, parse_device

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
    "jax_gpu_devices",
    "holds_jax_arrays",
    "jax_device_index",
    "jax_block_until_ready",
    "jax_memory_stats",
    "jax_release_hint",
    "release_hint",
    "gpu_frameworks_loaded",
    "primary_context_active",
    "ContextCensus",
    "context_census",
    "context_devices",
    "engine_memory",
    "ENGINE",
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


def loaded_torch() -> Any:
    """PyTorch when it is already imported (never imports it), else None."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and hasattr(torch, "cuda") else None


def torch_in_use() -> Any:
    """PyTorch when it has initialised CUDA (a CUDA tensor was made), else None."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "cuda"):
        return None
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None  # no CUDA tensor was ever made: nothing to read or release
    except Exception:
        return None
    return torch


def torch_uses_gpukeeper() -> bool:
    """True when use_torch_allocator() routed PyTorch's allocations to gpukeeper: then
    PyTorch's own counters are meaningless and the pool's are read instead."""
    integration = sys.modules.get("gpukeeper.integrations.torch_allocator")
    return bool(integration is not None and integration.is_active())


def _torch_memory(device: int) -> Optional[FrameworkMemory]:
    torch = torch_in_use()
    if torch is None or device >= torch.cuda.device_count():
        return None
    if torch_uses_gpukeeper():
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
    torch = torch_in_use()
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
    if torch_uses_gpukeeper():
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
    torch = torch_in_use()
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


def jax_gpu_devices() -> List[Any]:
    """JAX's GPU devices when JAX is loaded (never imported here), else []."""
    return _jax_devices()


def _jax_arrays(value: Any) -> Iterator[Any]:
    """The JAX arrays among the leaves of ``value`` (any pytree), none without JAX."""
    jax = sys.modules.get("jax")
    array_type = getattr(jax, "Array", None) if jax is not None else None
    if array_type is None:
        return
    try:
        leaves = jax.tree_util.tree_leaves(value)
    except Exception:
        leaves = [value]
    for leaf in leaves:
        if isinstance(leaf, array_type):
            yield leaf


def holds_jax_arrays(value: Any) -> bool:
    """True when ``value`` (any pytree: an array, a tuple, a dict ...) holds a JAX array
    on a GPU: the work that made it ran in JAX, on JAX's own streams."""
    for leaf in _jax_arrays(value):
        try:
            if all(d.platform == "gpu" for d in leaf.devices()):
                return True
        except Exception:
            return True  # an array whose devices cannot be read: JAX work all the same
    return False


def jax_device_index(value: Any) -> Optional[int]:
    """The id of the GPU device holding the first JAX array in ``value`` (JAX numbers a
    process's GPUs as CUDA does), or None."""
    for leaf in _jax_arrays(value):
        try:
            for d in leaf.devices():
                if d.platform == "gpu":
                    return int(d.id)
        except Exception:
            continue
    return None


def jax_block_until_ready(value: Any) -> Any:
    """``jax.block_until_ready(value)``: waits for the JAX work that produces ``value``
    (every array leaf of it). No-op without JAX."""
    jax = sys.modules.get("jax")
    if jax is None:
        return value
    return jax.block_until_ready(value)


def jax_memory_stats(device: int = 0) -> Optional[Dict[str, int]]:
    """JAX's allocator statistics of its GPU device ``device`` (``bytes_in_use``,
    ``peak_bytes_in_use``, ``pool_bytes`` ...), or None when unavailable."""
    devices = _jax_devices()
    if device >= len(devices):
        return None
    try:
        stats = devices[device].memory_stats()
    except Exception:
        return None
    return dict(stats) if stats else None


def jax_release_hint() -> str:
    """How to make JAX give its device memory back, given this process's settings.

    XLA's default allocator preallocates 75% of the device (``XLA_PYTHON_CLIENT_PREALLOCATE``)
    and, preallocated or grown on demand, never returns a byte to the driver; only the
    ``platform`` allocator frees memory when arrays are freed (slower: no cache).
    The variables are read when JAX's GPU backend starts, so they must be set before.
    """
    allocator = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").strip().lower()
    if allocator == "platform":
        return ("XLA_PYTHON_CLIENT_ALLOCATOR=platform is set: JAX frees memory when arrays "
                "are freed; what is still reserved is held by live arrays")
    preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").strip().lower()
    if preallocate in ("false", "0"):
        return ("JAX's allocator never returns memory to the driver: set "
                "XLA_PYTHON_CLIENT_ALLOCATOR=platform before JAX starts to make it returnable")
    return ("JAX preallocates 75% of the device and never returns it: set "
            "XLA_PYTHON_CLIENT_PREALLOCATE=false (allocate on demand) or "
            "XLA_PYTHON_CLIENT_ALLOCATOR=platform (return memory when arrays are freed) "
            "before JAX starts")


def release_hint(name: str) -> Optional[str]:
    """For a framework whose cache cannot be released from outside (JAX), how the user
    can make it returnable; None for the frameworks whose caches ``release_all_caches``
    empties."""
    if name == "jax":
        return jax_release_hint()
    return None


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
    if torch_in_use() is not None:
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

class _Driver:
    """The few driver calls used to look at contexts without creating one."""

    def __init__(self, lib: Any, handles: List[int]) -> None:
        self.lib = lib
        self.handles = handles  # CUdevice per CUDA ordinal
        get_state = lib.cuDevicePrimaryCtxGetState
        get_state.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_int)]
        get_state.restype = ctypes.c_int
        self.get_state = get_state

    def primary_active(self, ordinal: int) -> Optional[bool]:
        flags = ctypes.c_uint(0)
        active = ctypes.c_int(0)
        if self.get_state(self.handles[ordinal], ctypes.byref(flags), ctypes.byref(active)) != 0:
            return None
        return bool(active.value)

    def foreign_current_context(self) -> Optional[int]:
        """The CUDA ordinal of the context current on this thread when it is not its
        device's primary context (one an engine made with cuCtxCreate), else None."""
        lib = self.lib
        try:
            ctx = ctypes.c_void_p(0)
            if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
                return None
            dev = ctypes.c_int(0)
            if lib.cuCtxGetDevice(ctypes.byref(dev)) != 0 or dev.value not in self.handles:
                return None
            ordinal = self.handles.index(dev.value)
            active = self.primary_active(ordinal)
            if active is None:
                return None
            if not active:
                return ordinal  # a context is current and the primary one does not exist
            # Retaining an active primary context only counts a reference (it creates
            # nothing); released at once.
            primary = ctypes.c_void_p(0)
            if lib.cuDevicePrimaryCtxRetain(ctypes.byref(primary), dev) != 0:
                return None
            release = getattr(lib, "cuDevicePrimaryCtxRelease_v2", None) or lib.cuDevicePrimaryCtxRelease
            release(dev)
            return ordinal if primary.value != ctx.value else None
        except (AttributeError, OSError):
            return None


# The driver once loaded; False when it cannot be reached through ctypes (no libcuda, or
# cuInit failed).
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
            _driver = _Driver(lib, handles)
        except (OSError, AttributeError):
            _driver = False
        return _driver


def _cuda_maybe_in_use() -> bool:
    """Whether anything in the process could have made a CUDA context (cheap checks
    only: without this, asking the driver would initialise it for nothing)."""
    if torch_in_use() is not None or _cupy() is not None or _jax_devices():
        return True
    return any(getattr(p, "kind", "device") in ("device", "async", "pinned") for p in live_pools())


def active_devices() -> List[int]:
    """CUDA devices on which this process holds a primary context, without creating one.

    Asks the driver (``cuDevicePrimaryCtxGetState`` through ctypes; every framework here
    uses the primary context). Without a reachable driver: the devices of gpukeeper's
    device pools and PyTorch's current device. Empty when no framework uses CUDA (see
    :func:`context_devices` for contexts that no framework made).
    """
    if not _cuda_maybe_in_use():
        return []
    driver = _load_driver()
    if driver:
        return [d for d in range(len(driver.handles)) if driver.primary_active(d)]
    devices = set()
    for pool in live_pools():
        if getattr(pool, "kind", "device") in ("device", "async"):
            devices.update(pool.devices())
    torch = torch_in_use()
    if torch is not None:
        has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
        for d in range(torch.cuda.device_count()):
            if has_context is not None and has_context(d):
                devices.add(d)
        devices.add(torch.cuda.current_device())
    return sorted(devices)


# --------------------------------------------------------------------- a CUDA context with no framework

#: The name under which memory of CUDA contexts that no framework owns is counted.
ENGINE = "engine"

_libcuda_seen = False


def _libcuda_loaded() -> Optional[bool]:
    """Whether the CUDA driver library is mapped into the process (once seen, it stays:
    nothing unloads it). Without it no CUDA context can exist, so nothing else is asked."""
    global _libcuda_seen
    if _libcuda_seen:
        return True
    loaded = host.library_loaded("libcuda.so.1") if sys.platform != "win32" else None
    if loaded:
        _libcuda_seen = True
    return loaded


def gpu_frameworks_loaded() -> List[str]:
    """The frameworks loaded in the process that run GPU work gpukeeper can see: PyTorch
    (imported, with usable CUDA), CuPy, JAX with a GPU, and gpukeeper's device pools."""
    names = []
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda"):
        try:
            if torch.cuda.is_available():
                names.append("torch")
        except Exception:
            pass
    if _cupy() is not None:
        names.append("cupy")
    if _jax_devices():
        names.append("jax")
    if any(getattr(p, "kind", "device") in ("device", "async") for p in live_pools()):
        names.append("gpukeeper")
    return names


def primary_context_active(device: int) -> Optional[bool]:
    """Whether the primary context of CUDA device ``device`` exists (the one PyTorch,
    CuPy, JAX and gpukeeper share), asked without creating one. False when the CUDA
    driver is not even loaded in the process; None when the driver cannot be asked."""
    if _libcuda_loaded() is False:
        return False
    driver = _load_driver()
    if not driver or device >= len(driver.handles):
        return None
    return driver.primary_active(device)


@dataclass(frozen=True)
class ContextCensus:
    """The CUDA contexts this process holds on one device, as far as can be seen.

    ``primary``: whether the primary context exists (None: unknown). ``other``: a lower
    bound of the *other* contexts (made with ``cuCtxCreate``, e.g. by OpenMM): 1 when
    one is seen (NVML lists this process on a device whose primary context does not
    exist, or one is current on the calling thread), 0 when none is seen (the driver
    cannot list a process's contexts, so one current on no thread goes unseen), None
    when nothing could be asked. ``listed``/``process_bytes``: this process in NVML's
    list and its device memory there. ``how``: the evidence, in words.
    """

    device: int
    primary: Optional[bool]
    other: Optional[int]
    listed: Optional[bool]
    process_bytes: Optional[int]
    how: str

    @property
    def count(self) -> Optional[int]:
        """Contexts seen on the device (a lower bound); None when nothing is known."""
        if self.primary is None and self.other is None:
            return None
        return int(bool(self.primary)) + (self.other or 0)


def context_census(
    device: int,
    *,
    reading: Optional[nvml.ProcessReading] = None,
    primary_in_use: bool = False,
) -> ContextCensus:
    """Counts this process's CUDA contexts on ``device`` without creating one (the
    driver's primary-context state, the context current on this thread, NVML's
    per-process list). ``reading``: that list's answer when the caller has it already;
    ``primary_in_use``: the caller knows the primary context exists (a framework holds
    memory on the device, and the frameworks allocate in the primary context)."""
    loaded = _libcuda_loaded()
    if reading is None:
        reading = nvml.this_process_memory(device) if loaded is not False else nvml.ProcessReading(False, 0)
    primary = True if primary_in_use else primary_context_active(device)
    driver = _load_driver() if loaded is not False else None
    foreign = driver.foreign_current_context() if driver else None
    evidence = []
    other: Optional[int] = 0 if (primary is not None or reading.listed is not None) else None
    if foreign == device:
        other = 1
        evidence.append("a context other than the primary one is current on this thread")
    if reading.listed and primary is False:
        other = 1
        evidence.append("NVML lists this process on the device and its primary context does not exist")
    if loaded is False:
        evidence.append("the CUDA driver is not loaded in this process")
    elif primary is None:
        evidence.append("the driver cannot be asked about the primary context")
    else:
        evidence.append("primary context active" if primary else "no primary context")
    if reading.listed is None and reading.reason:
        evidence.append(f"NVML: {reading.reason}")
    return ContextCensus(device, primary, other, reading.listed, reading.used_bytes, "; ".join(evidence))


def _cuda_device_count() -> int:
    driver = _load_driver()
    if driver:
        return len(driver.handles)
    try:
        from gpukeeper import _core

        status = _core.cuda_status()
        return int(status["device_count"]) if status["available"] else 0
    except Exception:
        return 0


def context_devices() -> List[int]:
    """CUDA devices on which this process holds any CUDA context: a framework's primary
    context or one an engine made for itself (``cuCtxCreate``: OpenMM), without
    creating one. NVML's per-process list where it can tell, else the driver's
    primary-context state. Empty when the CUDA driver is not loaded in the process."""
    if _libcuda_loaded() is False:
        return []
    found = []
    for device in range(_cuda_device_count()):
        reading = nvml.this_process_memory(device)
        if reading.listed:
            found.append(device)
        elif reading.listed is None and primary_context_active(device):
            found.append(device)
    return found


def engine_memory(device: int) -> Optional[FrameworkMemory]:
    """Device memory of this process that no loaded framework accounts for, from NVML's
    per-process figure: its CUDA contexts and what engines allocate in them. Only read
    when no GPU framework is loaded (then it is all of the process's device memory, and
    a change in it is the engine's); None when a framework is loaded, when the process
    holds no context on ``device``, or when NVML cannot tell. ``allocated`` and
    ``reserved`` are the same figure: from outside, an engine's live buffers and its
    cache cannot be told apart."""
    if gpu_frameworks_loaded() or _libcuda_loaded() is False:
        return None
    reading = nvml.this_process_memory(device)
    if not reading.listed or reading.used_bytes is None:
        return None
    return FrameworkMemory(ENGINE, reading.used_bytes, reading.used_bytes)


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


def _device_filter(device: Any) -> Callable[[str, Optional[int]], bool]:
    """None: every CUDA device; ``"cpu"``: host arrays; else that CUDA device."""
    kind, index = parse_device(device, "live_arrays device")
    if kind == "auto":
        return lambda k, i: k == "cuda"
    if kind == "cpu":
        return lambda k, i: k == "cpu"
    if index is None:
        index = current_cuda_index()
    return lambda k, i: k == "cuda" and i == index


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

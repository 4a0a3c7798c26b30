"""The CuPy adapter: its default pool's counters, release, synchronize,
``cupy.cuda.Event`` marks, an L2 scratch buffer, its live arrays and a memory hook that
records where each allocation is made."""

from __future__ import annotations

import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple

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
    "CupyAdapter",
    "CupyBackend",
    "cupy_current_device",
    "cupy_cuda",
    "cupy_memory_hook",
    "loaded_cupy",
]


def loaded_cupy() -> Any:
    """CuPy when it is already imported (never imports it), else None."""
    return loaded_with_cuda("cupy")


def cupy_current_device() -> Optional[int]:
    """The CUDA device CuPy calls current when CuPy is loaded, else None."""
    cupy = loaded_cupy()
    try:
        if cupy is not None:
            return int(cupy.cuda.runtime.getDevice())
    except Exception:
        pass
    return None


def cupy_memory_hook() -> Any:
    """``cupy.cuda.MemoryHook`` (the base of hooks called on every CuPy allocation) when
    CuPy is loaded, else None."""
    return getattr(getattr(loaded_cupy(), "cuda", None), "MemoryHook", None)


def cupy_cuda() -> Any:
    """CuPy when it is loaded and sees a device, else None."""
    cupy = loaded_cupy()
    if cupy is None:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None
    except Exception:
        return None
    return cupy


def _usable(cupy: Any, devices: List[int]) -> List[int]:
    # cupy.cuda.Device(d) on a device without a context would create one; the registry
    # passes the devices in use, and this drops those CuPy cannot see.
    count = cupy.cuda.runtime.getDeviceCount()
    return [d for d in devices if d < count]


class CupyAdapter(FrameworkAdapter):
    """CuPy's default memory pool (per device) and its pinned pool."""

    name = "cupy"
    display_name = "CuPy"
    modules = ("cupy", "cupyx")
    distributions = ("cupy-cuda13x", "cupy-cuda12x", "cupy")
    timer_priority = 10

    def in_use(self) -> bool:
        return cupy_cuda() is not None

    def cuda_usable(self) -> bool:
        return cupy_cuda() is not None

    def current_device(self) -> Optional[int]:
        return cupy_current_device()

    def current_stream_handle(self, device: int) -> Optional[int]:
        cupy = cupy_cuda()
        if cupy is None:
            return None
        with cupy.cuda.Device(device):
            return int(cupy.cuda.get_current_stream().ptr)

    def array_type(self) -> Optional[type]:
        ndarray = getattr(sys.modules.get("cupy"), "ndarray", None)
        return ndarray if isinstance(ndarray, type) else None

    def describe_array(self, obj: Any, wanted: DeviceFilter) -> Optional[Tuple[int, LiveArray]]:
        try:
            index = int(obj.device.id)
            if not wanted("cuda", index):
                return None
            mem = obj.data.mem
            ptr = int(mem.ptr)
            nbytes = int(mem.size)
            if ptr == 0 or nbytes == 0:
                return None
            label = f"cuda:{index}"
            rank = (2 if obj.base is None else 0) * (1 << 62) + int(obj.nbytes)
            entry = LiveArray(
                "cupy", label, type(obj).__name__, tuple(obj.shape), str(obj.dtype), nbytes, ptr
            )
        except Exception:
            return None
        return rank, entry

    def holds_device_memory(self, obj: Any) -> bool:
        return True  # a CuPy array is on a device

    def record_allocations(
        self, on_alloc: Callable[[Sequence[int]], None]
    ) -> Optional[StopRecording]:
        hook_base = cupy_memory_hook()
        if hook_base is None:
            return None

        class _CupyRecorder(hook_base):  # type: ignore[misc, valid-type]
            def malloc_postprocess(self, **kwargs: Any) -> None:
                ptr = kwargs.get("mem_ptr")
                if ptr:
                    on_alloc((int(ptr),))

        hook = _CupyRecorder()
        hook.name = f"gpukeeper-tracker-{id(hook)}"  # hook names must be unique per thread
        try:
            return entered(hook)
        except Exception:
            return None  # CuPy's hooks unavailable: its arrays are listed without sites

    def memory(self, device: int) -> Optional[FrameworkMemory]:
        cupy = cupy_cuda()
        if cupy is None:
            return None
        pool = cupy.get_default_memory_pool()
        with cupy.cuda.Device(device):
            # CuPy's default pool is per device; its counters read the current device's.
            return FrameworkMemory("cupy", int(pool.used_bytes()), int(pool.total_bytes()))

    def release(self, devices: Optional[List[int]]) -> int:
        assert devices is not None, "not whole_process: the registry passes the devices"
        cupy = cupy_cuda()
        if cupy is None:
            return 0
        pool = cupy.get_default_memory_pool()
        released = 0
        for d in _usable(cupy, devices):
            with cupy.cuda.Device(d):
                before = int(pool.total_bytes())
                pool.free_all_blocks()
                released += max(0, before - int(pool.total_bytes()))
        cupy.get_default_pinned_memory_pool().free_all_blocks()
        return released

    def synchronize(self, devices: Optional[List[int]]) -> None:
        assert devices is not None, "not whole_process: the registry passes the devices"
        cupy = cupy_cuda()
        if cupy is None:
            return
        for d in _usable(cupy, devices):
            with cupy.cuda.Device(d):
                cupy.cuda.runtime.deviceSynchronize()

    def l2_cache_size(self, device: int) -> Optional[int]:
        cupy = cupy_cuda()
        if cupy is None:
            return None
        return int(cupy.cuda.runtime.getDeviceProperties(device)["l2CacheSize"])

    def l2_scratch(self, device: int, nbytes: int) -> Optional[Scratch]:
        cupy = cupy_cuda()
        if cupy is None:
            return None
        with cupy.cuda.Device(device):
            array = cupy.empty(nbytes, dtype=cupy.uint8)
        # A CuPy stream is itself the context manager that makes it current.
        return FilledScratch(array, lambda: array.fill(0), lambda stream: stream)


class CupyBackend(FrameworkEventBackend):
    """``cupy.cuda.Event`` on CuPy's current stream."""

    name = "cupy"
    needs = "CuPy loaded with a usable device"
    framework = staticmethod(cupy_cuda)

    def current_stream(self) -> Any:
        with self.module.cuda.Device(self.device.index or 0):
            return self.module.cuda.get_current_stream()

    def new_event(self) -> Any:
        with self.module.cuda.Device(self.device.index or 0):
            return self.module.cuda.Event()

    def event_ms(self, start: Any, end: Any) -> float:
        return float(self.module.cuda.get_elapsed_time(start, end))

    def query(self, event: Any) -> bool:
        return bool(event.done)

    def synchronize(self) -> None:
        with self.module.cuda.Device(self.device.index or 0):
            self.module.cuda.runtime.deviceSynchronize()


CupyAdapter.timer_backend = CupyBackend

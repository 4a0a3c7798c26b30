"""The CUDA driver, asked through ctypes without creating a context: primary-context
state, the context current on this thread, and whether libcuda is loaded at all."""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any, List, Optional

from gpukeeper import devices, host

__all__ = ["cuda_device_count", "libcuda_loaded", "load_driver", "primary_context_active"]


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


def load_driver() -> Any:
    """The driver (loaded once), or False when it cannot be reached."""
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


_libcuda_seen = False


def libcuda_loaded() -> Optional[bool]:
    """Whether the CUDA driver library is mapped into the process (once seen, it stays:
    nothing unloads it). Without it no CUDA context can exist, so nothing else is asked."""
    global _libcuda_seen
    if _libcuda_seen:
        return True
    loaded = host.library_loaded("libcuda.so.1") if sys.platform != "win32" else None
    if loaded:
        _libcuda_seen = True
    return loaded


def primary_context_active(device: int) -> Optional[bool]:
    """Whether the primary context of CUDA device ``device`` exists (the one PyTorch,
    CuPy, JAX and gpukeeper share), asked without creating one. False when the CUDA
    driver is not even loaded in the process; None when the driver cannot be asked."""
    if libcuda_loaded() is False:
        return False
    driver = load_driver()
    if not driver or device >= len(driver.handles):
        return None
    return driver.primary_active(device)


def cuda_device_count() -> int:
    """CUDA devices the driver sees (the runtime's count without a driver handle)."""
    driver = load_driver()
    if driver:
        return len(driver.handles)
    return devices.cuda_status()[0]

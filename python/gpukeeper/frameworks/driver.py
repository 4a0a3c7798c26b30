"""The CUDA driver, asked without creating a context: whether libcuda is loaded, the
driver's devices, primary-context state, the context current on this thread, PCI bus ids
and device attributes. The questions are answered by gpukeeper's core
(``csrc/gpukeeper/device/driver_queries.cpp``); this module adds the cheap guards."""

from __future__ import annotations

from typing import Any, Dict, Optional

import gpukeeper._core as _core
from gpukeeper.base import device_names as devices

__all__ = [
    "backend",
    "cuda_device_count",
    "current_context_foreign",
    "device_info",
    "device_pci_bus_id",
    "driver_device_count",
    "libcuda_loaded",
    "primary_context_active",
]

#: What answers the driver questions: gpukeeper's core. A seam: tests put a fake driver
#: here (``tests/python/engine_fakes.FakeDriver``).
backend: Any = _core

_libcuda_seen = False


def libcuda_loaded() -> Optional[bool]:
    """Whether the CUDA driver library is mapped into the process (once seen, it stays:
    nothing unloads it). Without it no CUDA context can exist, so nothing else is asked.
    None where the platform cannot tell."""
    global _libcuda_seen
    if _libcuda_seen:
        return True
    loaded = _core.cuda_driver_loaded()
    if loaded:
        _libcuda_seen = True
    return loaded


def primary_context_active(device: int) -> Optional[bool]:
    """Whether the primary context of CUDA device ``device`` exists (the one PyTorch,
    CuPy, JAX and gpukeeper share), asked without creating one. False when the CUDA
    driver is not even loaded in the process; None when the driver cannot be asked."""
    if libcuda_loaded() is False:
        return False
    return backend.primary_context_active(device)


def current_context_foreign() -> Optional[int]:
    """The CUDA ordinal of the context current on this thread when it is not its device's
    primary context (one an engine made with ``cuCtxCreate``, as OpenMM does), else None."""
    if libcuda_loaded() is False:
        return None
    return backend.current_context_foreign()


def driver_device_count() -> Optional[int]:
    """Devices the driver reports, or None when it cannot be reached. Initialises the
    driver (``cuInit``, no context) on first use."""
    return backend.driver_device_count()


def cuda_device_count() -> int:
    """CUDA devices the driver sees; the runtime's count when the driver cannot be asked."""
    count = driver_device_count()
    if count is not None:
        return count
    return devices.cuda_status()[0]


def device_pci_bus_id(device: int) -> Optional[str]:
    """The PCI bus id of CUDA device ``device`` (``'0000:65:00.0'``), or None. Asked only
    once libcuda is loaded: initialising the driver for a lookup costs time and host memory."""
    if libcuda_loaded() is False:
        return None
    return backend.device_pci_bus_id(device)


def device_info(device: int) -> Optional[Dict[str, Any]]:
    """The device as the driver describes it without a context (multiprocessors, clocks,
    bus width, L2 size, compute capability, name, total memory, UUID; only the keys it
    answered), or None when the driver cannot be reached or has no such device."""
    return backend.driver_device_info(device)

"""Device utilities: pick a device, describe it, read its memory, warm it up.

>>> from gpukeeper.account.device_utils import get_device, warmup_cuda, get_gpu_memory_info
>>> device = get_device()
>>> warmup_cuda()
>>> mem_info = get_gpu_memory_info()
>>> print(f"GPU Memory: {mem_info['allocated']:.2f} GB")

Everything works without a GPU ("CPU mode"):

- ``get_device()`` returns the CPU device;
- ``get_gpu_info()`` returns a dict with ``mode == "cpu"`` describing the host;
- ``get_gpu_memory_info()`` reports the *process's host memory*: ``allocated`` is the
  resident set size (RSS, from ``/proc/self/statm``), ``peak`` the peak RSS, ``free`` /
  ``total`` the machine's available / total memory. RSS is what a leak grows on a host, so
  ``check_memory_leak`` means the same thing in both modes ("did the memory this process
  holds grow?"); gpukeeper's host pools are listed separately (``host_pools_*_bytes``).
- ``warmup_cuda()`` does nothing and returns 0.0.

Nothing here imports PyTorch: it is used when it is already loaded (``sys.modules``),
because importing it costs seconds and may create a CUDA context.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Any, Dict, Optional, Tuple

import gpukeeper._core as _core
from gpukeeper import frameworks
from gpukeeper.account.account_reader import memory_report
from gpukeeper.account.device_account import MemoryReport
from gpukeeper.base import nvml
from gpukeeper.base.arg_checks import check_int
from gpukeeper.base.device_names import DeviceSpec, resolve_device
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.host_memory import process_rss_bytes
from gpukeeper.frameworks import driver as cuda_driver

__all__ = [
    "get_device",
    "get_gpu_info",
    "get_gpu_memory_info",
    "warmup_cuda",
    "check_memory_leak",
    "process_rss_bytes",
]

GB = float(1 << 30)


# --------------------------------------------------------------------- helpers


def _torch_auto_cuda() -> bool:
    """Whether "auto" may mean CUDA: not where a loaded PyTorch cannot use it (a CPU
    build of torch on a GPU machine would be handed a device it cannot run on)."""
    torch = frameworks.loaded_torch()
    if torch is None:
        return True
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _resolve(device: Any) -> DeviceSpec:
    return resolve_device(device, auto_cuda=_torch_auto_cuda())


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", "r", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _version_text(v: int) -> Optional[str]:
    """CUDA's integer version (12040) as text ("12.4")."""
    if not v:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


# --------------------------------------------------------------------- get_device


def get_device(device: Any = None) -> Any:
    """The device to run on: CUDA when usable, else CPU (never raises for a missing GPU).

    Returns a ``torch.device`` when PyTorch is loaded, else a string (``"cuda:N"`` or
    ``"cpu"``). ``device`` may name one explicitly (``"cuda:1"``, ``1``, ``"cpu"``, a
    ``torch.device``); a malformed or nonexistent CUDA device raises ``InvalidInputError``
    rather than silently running on the wrong device. ``get_device()`` alone falls back
    to the CPU when CUDA is unusable.
    """
    text = str(_resolve(device))
    torch = frameworks.loaded_torch()
    return torch.device(text) if torch is not None else text


# --------------------------------------------------------------------- get_gpu_info


def _nvml_info(index: int, info: Dict[str, Any]) -> None:
    """Fills clocks, driver version, UUID and PCI id from NVML (pynvml), when present."""
    lib, _reason = nvml.NVML.get()
    if lib is None:
        return
    try:
        handle, _how = nvml.device_handle(lib, index)
    except Exception:
        return

    def put(key: str, fn: Any, *args: Any) -> None:
        if info.get(key) is not None:
            return
        try:
            value = fn(handle, *args)
        except Exception:
            return  # not supported on this board (e.g. clocks on some vGPUs)
        info[key] = value.decode() if isinstance(value, bytes) else value

    put("name", lib.nvmlDeviceGetName)
    put("uuid", lib.nvmlDeviceGetUUID)
    put("sm_clock_max_mhz", lib.nvmlDeviceGetMaxClockInfo, lib.NVML_CLOCK_SM)
    put("memory_clock_max_mhz", lib.nvmlDeviceGetMaxClockInfo, lib.NVML_CLOCK_MEM)
    put("sm_clock_mhz", lib.nvmlDeviceGetClockInfo, lib.NVML_CLOCK_SM)
    put("memory_clock_mhz", lib.nvmlDeviceGetClockInfo, lib.NVML_CLOCK_MEM)
    if info.get("compute_capability") is None:
        try:
            major, minor = lib.nvmlDeviceGetCudaComputeCapability(handle)
            info["compute_capability"] = f"{major}.{minor}"
            info["compute_capability_tuple"] = (int(major), int(minor))
        except Exception:
            pass
    if info.get("total_memory_bytes") is None:
        try:
            info["total_memory_bytes"] = int(lib.nvmlDeviceGetMemoryInfo(handle).total)
        except Exception:
            pass
    try:
        info["pci_bus_id"] = nvml.text(lib.nvmlDeviceGetPciInfo(handle).busId)
    except Exception:
        pass
    if not info.get("driver_version") and nvml.NVML.driver:
        info["driver_version"] = nvml.NVML.driver


def get_gpu_info(device: Any = None) -> Dict[str, Any]:
    """Specifications of one GPU as a dict (CPU mode: a description of the host).

    CUDA keys: ``mode`` ("cuda"), ``device`` (ordinal), ``name``, ``compute_capability``
    ("9.0") and ``compute_capability_tuple``, ``total_memory_bytes`` / ``total_memory_gb``,
    ``multiprocessors``, ``l2_cache_bytes``, ``sm_clock_max_mhz``,
    ``memory_clock_max_mhz``, ``sm_clock_mhz`` / ``memory_clock_mhz`` (current),
    ``driver_version``, ``runtime_version`` (the CUDA runtime gpukeeper's core links),
    ``torch_cuda_version``, ``uuid``, ``pci_bus_id``, ``sources`` (where they came from).
    A value no source could give is None.

    Sources, in order: PyTorch's device properties when PyTorch is loaded; the driver API
    (gpukeeper's core asks libcuda; no context created); NVML (nvidia-ml-py) for clocks, driver
    version and PCI id. CPU keys: ``mode`` ("cpu"), ``device`` ("cpu"), ``reason`` (why not
    CUDA), ``name`` (CPU model), ``cpu_count``, ``total_memory_bytes`` / ``total_memory_gb``
    (host), ``platform``.

    Raises ``InvalidInputError`` for a malformed or nonexistent device.
    """
    spec = _resolve(device)
    index = spec.index
    status = _core.cuda_status()
    if index is None:
        return _cpu_info(spec.reason)
    info = _blank_cuda_info(index, status)
    _framework_info(index, info)
    _driver_info(index, info)
    before = dict(info)
    _nvml_info(index, info)
    if info != before:
        info["sources"].append("nvml")
    if info["total_memory_bytes"] is not None:
        info["total_memory_gb"] = info["total_memory_bytes"] / GB
    return info


def _cpu_info(reason: Any) -> Dict[str, Any]:
    try:
        _available, total = _core.host_memory_info()
    except Exception:
        total = 0
    return {
        "mode": "cpu",
        "device": "cpu",
        "cuda_available": False,
        "reason": reason,
        "name": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "total_memory_bytes": int(total),
        "total_memory_gb": int(total) / GB,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def _blank_cuda_info(index: int, status: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "mode": "cuda",
        "device": index,
        "cuda_available": True,
        "name": None,
        "compute_capability": None,
        "compute_capability_tuple": None,
        "total_memory_bytes": None,
        "total_memory_gb": None,
        "multiprocessors": None,
        "l2_cache_bytes": None,
        "sm_clock_max_mhz": None,
        "memory_clock_max_mhz": None,
        "sm_clock_mhz": None,
        "memory_clock_mhz": None,
        "driver_version": _version_text(int(status.get("driver_version", 0))),
        "runtime_version": _version_text(int(status.get("runtime_version", 0))),
        "torch_cuda_version": None,
        "uuid": None,
        "pci_bus_id": None,
        "sources": [],
    }


def _framework_info(index: int, info: Dict[str, Any]) -> None:
    """Fills ``info`` from the device properties of the first loaded framework that can
    read them (PyTorch's)."""
    found = frameworks.device_properties(index)
    if found is None:
        return
    name, props = found
    info.update(props)
    info["sources"].append(name)


def _driver_info(index: int, info: Dict[str, Any]) -> None:
    """Fills what is still missing in ``info`` from the driver API."""
    drv = cuda_driver.device_info(index)
    if not drv:
        return
    for key, value in drv.items():
        if key in ("cc_major", "cc_minor"):
            continue
        if info.get(key) is None:
            info[key] = value
    if info["compute_capability"] is None and "cc_major" in drv:
        info["compute_capability"] = f"{drv['cc_major']}.{drv.get('cc_minor', 0)}"
        info["compute_capability_tuple"] = (drv["cc_major"], drv.get("cc_minor", 0))
    info["sources"].append("driver")


# --------------------------------------------------------------------- memory


def get_gpu_memory_info(device: Any = None) -> Dict[str, Any]:
    """Memory of one device right now. Values in GB (floats), with ``*_bytes`` twins.

    A view of :func:`gpukeeper.memory_report` (``detail="counters"``: the same figures,
    read by the same code, without NVML's process lists). Keys: ``allocated`` (in live
    tensors/arrays/buffers of every loaded framework: PyTorch, CuPy, JAX, gpukeeper's
    pools; a framework that cannot tell counts 0), ``reserved`` (held from the driver,
    caches included), ``peak`` (the report's ``peak_allocated_bytes``: the frameworks'
    peaks since ``frameworks.reset_peaks``, summed, and at least ``allocated``), ``free``
    and ``total`` (the device's, NVML first, else cudaMemGetInfo; 0 when neither can
    tell), ``*_bytes`` for each, ``mode`` ("cuda"/"cpu"), ``device``, ``source``,
    ``free_total_source`` (the report's ``memory_source``), ``frameworks`` (the
    per-framework breakdown).

    CPU mode (see the module doc): ``allocated`` is what the C allocator has handed out
    and not had back (glibc's ``mallinfo2()``; ``source`` says "malloc_in_use"), else the
    process's RSS ("process_rss"): RSS keeps pages the allocator caches for reuse, so it
    neither falls when memory is freed nor always grows when it is taken. ``reserved`` is
    the RSS, ``peak`` the peak RSS (at least ``allocated``), ``free``/``total`` the host's
    available/total memory, plus ``host_pools_allocated_bytes``/
    ``host_pools_reserved_bytes`` (gpukeeper host pools).
    """
    index = _resolve(device).index
    report = memory_report("cpu" if index is None else index, detail="counters")
    if report.mode == "cpu":
        out, values = _host_figures(report)
    else:
        allocated = sum(m.allocated or 0 for m in report.frameworks.values())
        out = {
            "mode": "cuda",
            "device": report.device,
            "source": "frameworks",
            "free_total_source": report.memory_source,
            "frameworks": frameworks.memory_dict(report.frameworks),
        }
        values = {
            "allocated": allocated,
            "reserved": sum(m.reserved or 0 for m in report.frameworks.values()),
            "peak": max(allocated, report.peak_allocated_bytes or 0),
            "free": report.free_bytes,
            "total": report.total_bytes,
        }
    for key, value in values.items():
        out[key] = value / GB
        out[f"{key}_bytes"] = int(value)
    return out


def _host_figures(report: MemoryReport) -> Tuple[Dict[str, Any], Dict[str, int]]:
    """``get_gpu_memory_info``'s keys and byte figures from a CPU-mode report."""
    figures = report.host
    rss = report.process_bytes if report.process_bytes is not None else process_rss_bytes()
    in_use = figures.get("malloc_in_use_bytes")
    allocated = rss if in_use is None else in_use
    out: Dict[str, Any] = {
        "mode": "cpu",
        "device": "cpu",
        "source": "process_rss" if in_use is None else "malloc_in_use",
        "host_pools_allocated_bytes": figures.get("gpukeeper_pools_allocated_bytes") or 0,
        "host_pools_reserved_bytes": figures.get("gpukeeper_pools_reserved_bytes") or 0,
    }
    values = {
        "allocated": allocated,
        "reserved": rss,
        "peak": max(rss, allocated, figures.get("peak_rss_bytes") or 0),
        "free": report.free_bytes,
        "total": report.total_bytes,
    }
    return out, values


def check_memory_leak(initial_mem: float, tolerance_mb: float = 10.0, device: Any = None) -> bool:
    """True when there is **no** leak: allocated memory now is at most ``tolerance_mb``
    above ``initial_mem``.

    ``initial_mem`` is in GB, as returned by ``get_gpu_memory_info()['allocated']`` (in
    CPU mode that is the process's RSS). Pending GPU work is waited for first, so memory
    freed by queued frees is counted as freed. A two-point check: for a trajectory use
    ``benchmark_md_trajectory``, whose verdict comes from the slope over many samples.
    Raises ``InvalidInputError`` for a negative tolerance or a non-numeric ``initial_mem``.
    """
    if isinstance(initial_mem, bool) or not isinstance(initial_mem, (int, float)):
        raise InvalidInputError(f"initial_mem must be a number of GB, got {initial_mem!r}")
    if not tolerance_mb >= 0:
        raise InvalidInputError(f"tolerance_mb must be >= 0, got {tolerance_mb!r}")
    index = _resolve(device).index
    if index is not None:
        frameworks.synchronize_all(index)
    now_gb = get_gpu_memory_info(index if index is not None else "cpu")["allocated"]
    return (now_gb - float(initial_mem)) * 1024.0 <= tolerance_mb


# --------------------------------------------------------------------- warm-up


def warmup_cuda(device: Any = None, *, matmul_size: int = 1024, iterations: int = 3) -> float:
    """Initialises CUDA on ``device`` so the first timed call does not pay for it.

    Creates the context, launches a few elementwise kernels and ``iterations`` matmuls of
    ``matmul_size`` squared (which creates the cuBLAS handle and its workspace), then
    synchronises. Uses PyTorch when it is loaded, else CuPy when loaded; with neither,
    creates the context through gpukeeper's core (a small device allocation). Does
    nothing in CPU mode. Returns the seconds spent.
    """
    check_int(matmul_size, "matmul_size", 1)
    check_int(iterations, "iterations", 0)
    index = _resolve(device).index
    if index is None:
        return 0.0
    start = time.perf_counter()
    torch = frameworks.loaded_torch()
    cupy = frameworks.loaded_cupy()
    if torch is not None:
        dev = torch.device(f"cuda:{index}")
        with torch.cuda.device(dev):
            x = torch.randn(matmul_size, matmul_size, device=dev)
            y = (x * 2.0 + 1.0).relu()
            for _ in range(iterations):
                y = x @ y
            torch.cuda.synchronize(dev)
            del x, y
    elif cupy is not None:
        with cupy.cuda.Device(index):
            x = cupy.random.standard_normal((matmul_size, matmul_size), dtype=cupy.float32)
            y = x * 2.0 + 1.0
            for _ in range(iterations):
                y = x @ y
            cupy.cuda.runtime.deviceSynchronize()
            del x, y
    else:
        # No framework: the context is what costs; a pool allocation creates it.
        from gpukeeper.pool.memory_pool import MemoryPool

        pool = MemoryPool()
        with pool.get_managed_buffer(index, 1 << 18, "float32"):
            pass
        pool.emergency_cleanup_all()
    return time.perf_counter() - start

"""One memory manager per device.

>>> gpu_mem = get_gpu_memory_manager()          # the current device; one per device
>>> gpu_mem.free_cache()                        # every framework's caches; never raises
>>> if gpu_mem.allocate(size_gb=required_gb):   # True when that much GPU memory can be had
...     result = gpu_process(data)
... else:                                       # not enough, or no usable GPU at all
...     result = cpu_process(data)
>>> used, available, total = gpu_mem.get_memory_info()   # GiB
>>> print(gpu_mem)
GPU 0 (NVIDIA H200): 3.21 GB used / 136.54 GB free / 139.75 GB total (2.3% used)

Sizes are in GB of 1024**3 bytes (what the helper code it replaces computed), as floats.

*Used* is device-wide: ``total - free``, every process included (what nvidia-smi
shows), so ``used + available == total``. For the split by framework, context and
other processes, see :func:`gpukeeper.account.account_reader.memory_report` (``manager.report()``).

**CPU mode.** Without a usable GPU, ``allocate()`` answers False whatever the size, so
that the former helper's ``if gpu_mem.allocate(...): gpu_process(...) else: cpu_process(...)``
takes the CPU path; ``manager.reason`` says why ("" when a GPU is usable) and so does
``str()``. The figures then describe the host (available is its ``MemAvailable``, total
its physical memory), ``free_cache()`` releases gpukeeper's host pools and
``manager.cpu_mode`` is True. Whether the host can take ``size_gb`` is its own question:
``host_allocate(size_gb)``, in either mode.

The FAISS helpers are in :mod:`gpukeeper.account.faiss_helpers` (re-exported here).
"""

from __future__ import annotations

import gc
import logging
import math
import numbers
import threading
from typing import Any, Callable, Dict, Optional, Tuple, Union

import gpukeeper._core as _core
from gpukeeper import frameworks
from gpukeeper.account.account_reader import memory_report
from gpukeeper.account.device_account import MemoryReport
from gpukeeper.base import device_names as devices
from gpukeeper.base.errors import InvalidInputError

__all__ = [
    "GPUMemoryManager",
    "get_gpu_memory_manager",
    "FaissUnavailableError",
    "calculate_faiss_temp_memory",
    "create_faiss_gpu_resources",
    "create_faiss_index",
]

# The FAISS helpers are imported next to the manager, as the manager's users expect.
from gpukeeper.account.faiss_helpers import (  # noqa: E402
    FaissUnavailableError,
    calculate_faiss_temp_memory,
    create_faiss_gpu_resources,
    create_faiss_index,
)

_log = logging.getLogger("gpukeeper")
GiB = 1 << 30


class GPUMemoryManager:
    """Memory of one CUDA device (or of the host in CPU mode), in GB of 1024**3 bytes.

    Get it from :func:`get_gpu_memory_manager`, which keeps one per device.
    """

    def __init__(self, device: Optional[int], cpu_reason: str = "") -> None:
        self.device: Optional[int] = device  # None in CPU mode
        self.cpu_reason = cpu_reason

    @property
    def cpu_mode(self) -> bool:
        """True when there is no usable CUDA device and the host is described instead."""
        return self.device is None

    @property
    def reason(self) -> str:
        """Why no GPU is usable (then ``allocate()`` is always False); "" when one is."""
        if self.device is not None:
            return ""
        return self.cpu_reason or "no usable CUDA device"

    # ----------------------------------------------------------------- figures

    def _free_total(self) -> Tuple[int, int]:
        """(free, total) bytes: ``memory_report``'s cheapest reading (``detail="device"``)."""
        report = self.report(detail="device")
        return report.free_bytes, report.total_bytes

    def get_memory_info(self) -> Tuple[float, float, float]:
        """``(used, available, total)`` in GB; ``used = total - available``. A view of
        :meth:`report` (``detail="device"``: the device's free and total alone)."""
        free, total = self._free_total()
        return (total - free) / GiB, free / GiB, total / GiB

    def get_used_memory(self) -> float:
        """Device-wide used memory in GB (every process; see memory_report for who)."""
        free, total = self._free_total()
        return (total - free) / GiB

    def get_available_memory(self) -> float:
        """Free device memory in GB (the host's available memory in CPU mode)."""
        return self._free_total()[0] / GiB

    def get_total_memory(self) -> float:
        """Total device memory in GB (physical host memory in CPU mode)."""
        return self._free_total()[1] / GiB

    def report(self, **kwargs: Any) -> MemoryReport:
        """:func:`gpukeeper.account.account_reader.memory_report` for this manager's device."""
        return memory_report("cpu" if self.device is None else self.device, **kwargs)

    # ----------------------------------------------------------------- actions

    def free_cache(self, collect: bool = False) -> int:
        """Releases every framework's cached memory (PyTorch, CuPy, JAX, gpukeeper pools)
        on this device; returns the bytes released. Never raises: a failure is logged.

        ``collect=True`` first runs ``gc.collect()`` (about 20 ms once torch is
        imported), so that tensors kept alive only by reference cycles go too.
        """
        released = 0
        try:
            if collect:
                gc.collect()
            # All devices in CPU mode: host pools are all that there is to release.
            per_framework = frameworks.release_all_caches(self.device)
            released = sum(int(v) for v in per_framework.values())
        except Exception as exc:  # the former helper's contract: safe, handles errors internally
            _log.warning(
                "gpukeeper: free_cache on %s failed: %s: %s", self._label(), type(exc).__name__, exc
            )
        return released

    def allocate(self, size_gb: Any) -> bool:
        """True when ``size_gb`` GB of GPU memory can be had on this device now,
        releasing the frameworks' caches first if the free memory falls short; False
        otherwise, and always False without a usable GPU (``reason`` says why).

        A check, not a reservation: nothing is allocated, and another thread or process
        may take the memory afterwards. A size above the device's total (``inf``
        included) is False at once. ``InvalidInputError`` for a negative, NaN or
        non-numeric size (in CPU mode too); never an exception for a size that is merely
        too big. For host memory, see :meth:`host_allocate`.
        """
        size = _size_gb(size_gb)
        if self.device is None:
            return False  # the GPU path of the caller's code cannot run here
        return self._can_have(
            size, f"allocate({size_gb!r})", self._label(), self._free_total, self.free_cache
        )

    def host_allocate(self, size_gb: Any) -> bool:
        """True when ``size_gb`` GB of host memory is available now (the host's
        ``MemAvailable``), releasing gpukeeper's host-pool caches first if it falls
        short; in either mode. A check, not a reservation. ``InvalidInputError`` for a
        negative, NaN or non-numeric size."""
        size = _size_gb(size_gb)
        return self._can_have(
            size, f"host_allocate({size_gb!r})", "host", _host_free_total, _release_host_pools
        )

    @staticmethod
    def _can_have(
        size: float,
        call: str,
        where: str,
        free_total: Callable[[], Tuple[int, int]],
        release: Callable[[], Any],
    ) -> bool:
        """Whether ``size`` GB fit in what ``free_total`` reports, after ``release``
        when they do not fit at first but could."""
        try:
            free, total = free_total()
        except Exception as exc:  # memory we cannot query cannot be promised
            _log.warning("gpukeeper: %s could not read %s: %s", call, where, exc)
            return False
        need = size * GiB
        if need <= free:
            return True
        if need > total:
            return False  # no cache release can help; skip its cost
        release()
        try:
            free, _ = free_total()
        except Exception:
            return False
        return need <= free

    # ----------------------------------------------------------------- text

    def _label(self) -> str:
        if self.device is None:
            return "host"
        return f"GPU {self.device}"

    def _name(self) -> str:
        if self.device is None:
            return ""
        try:
            from gpukeeper.base import nvml as _nvml

            nvml, _ = _nvml.NVML.get()
            if nvml is not None:
                handle, _how = _nvml.device_handle(nvml, self.device)
                return _nvml.text(nvml.nvmlDeviceGetName(handle))
        except Exception:
            pass
        return frameworks.torch_device_name(self.device) or ""

    def __str__(self) -> str:
        try:
            used, available, total = self.get_memory_info()
        except Exception as exc:
            return f"{self._label()}: memory unknown ({type(exc).__name__}: {exc})"
        pct = 100.0 * used / total if total else 0.0
        figures = (
            f"{used:.2f} GB used / {available:.2f} GB "
            f"{'available' if self.cpu_mode else 'free'} / {total:.2f} GB total ({pct:.1f}% used)"
        )
        if self.cpu_mode:
            return (
                f"CPU mode, no usable GPU ({self.reason}), allocate() is False; "
                f"host memory: {figures}"
            )
        name = self._name()
        return f"{self._label()}{f' ({name})' if name else ''}: {figures}"

    def __repr__(self) -> str:
        target = "cpu" if self.device is None else self.device
        return f"GPUMemoryManager(device={target!r})"


def _host_free_total() -> Tuple[int, int]:
    available, total = _core.host_memory_info()
    return int(available), int(total)


def _release_host_pools() -> int:
    """Host and pinned pools' caches only: a host question must not empty the GPU's."""
    released = 0
    try:
        for pool in frameworks.live_pools():
            if getattr(pool, "kind", "device") in ("host", "pinned"):
                released += int(pool.emergency_cleanup_all())
    except Exception as exc:
        _log.warning("gpukeeper: releasing host pools failed: %s: %s", type(exc).__name__, exc)
    return released


def _size_gb(size_gb: Any) -> float:
    if isinstance(size_gb, bool) or not isinstance(size_gb, numbers.Real):
        raise InvalidInputError(f"size_gb must be a number of GB, got {type(size_gb).__name__}")
    size = float(size_gb)
    if math.isnan(size):
        raise InvalidInputError("size_gb must be a number of GB, got NaN")
    if size < 0:
        raise InvalidInputError(f"size_gb must not be negative, got {size_gb!r}")
    return size


_managers: Dict[Union[int, str], GPUMemoryManager] = {}
_managers_lock = threading.Lock()


def get_gpu_memory_manager(device: Any = None) -> GPUMemoryManager:
    """The :class:`GPUMemoryManager` of ``device``: the same object on every call.

    ``device`` is None (the current device: PyTorch's once it has initialised CUDA,
    else CuPy's, else 0), an index, ``"cuda:N"``, a ``torch.device`` or ``"cpu"``.
    Without CUDA, None and ``"cpu"`` give the one CPU-mode manager; a CUDA device is an
    ``InvalidInputError`` there. Creation is thread-safe.
    ``InvalidInputError`` for a malformed or nonexistent device.
    """
    spec = devices.resolve_device(device)
    index, reason = spec.index, spec.reason
    count, why = devices.cuda_status()
    if index is None and count == 0:
        reason = (
            f"CUDA unavailable: {why}"  # one CPU manager: the machine's reason, however asked for
        )
    key: Union[int, str] = "cpu" if index is None else index
    manager = _managers.get(key)
    if manager is not None:
        return manager
    with _managers_lock:
        manager = _managers.get(key)
        if manager is None:
            manager = GPUMemoryManager(index, reason)
            _managers[key] = manager
    return manager

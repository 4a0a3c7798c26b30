"""Fakes for the NVML, engine and JAX tests on a machine without a GPU.

- ``FakeNvml``: pynvml for every test that fakes NVML (devices, process lists whose entry
  for this process can change between reads, failures on demand, the function table);
  ``proc`` makes an entry of its lists and ``install_nvml`` puts it in place.
- ``FakeDriver``: what ``frameworks`` asks the CUDA driver (primary-context state, the
  context current on this thread).
- ``fake_jax``: a ``jax`` module with one GPU device, arrays that record
  ``block_until_ready`` and a configurable ``memory_stats()``.
- ``install_engine``: a process in which no framework is loaded and an engine holds a
  CUDA context of its own on device 0 (the OpenMM case).
- ``FakeTorch``: PyTorch imported, its counters at a fixed level (an engine's memory is
  not in them).
- ``fresh_nvml``: a fixture that forgets gpukeeper's NVML state around a test;
  ``md_step`` and ``MD_STEPS``: a host-only MD step and its inputs.
"""

from __future__ import annotations

import ctypes
import os
import sys
import types
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pytest

from gpukeeper.base import device_names as devices
from gpukeeper.base import nvml
from gpukeeper.frameworks import driver as cuda_driver
from gpukeeper.frameworks import pools_adapter

MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def fresh_nvml() -> Any:
    """gpukeeper's NVML state forgotten before and after a test (the fakes replace it)."""
    nvml.NVML.reset()
    yield
    nvml.NVML.reset()


def md_step(x: Any) -> float:
    """An MD step with no device work: its "forces" are a sum on the host."""
    return float(np.sum(x))


MD_STEPS = [np.ones(16) for _ in range(4)]


class _Info:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def proc(pid: int, used: Optional[int]) -> Any:
    """One entry of NVML's process list: ``used`` None where NVML cannot tell."""
    return _Info(pid=pid, usedGpuMemory=used)


#: NVML's "not available" figure in its C structs (what the wrapper turns into None).
NOT_AVAILABLE = ctypes.c_ulonglong(-1).value


class ProcessInfoV3(ctypes.Structure):
    """The fields of NVML's ``nvmlProcessInfo_v3_t`` that gpukeeper reads."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class FakeNvml(types.ModuleType):
    """pynvml with ``count`` devices of ``total``/``free`` bytes named ``name``.

    The compute-process list is ``processes`` (``proc(pid, used)`` entries, or
    ``(pid, used)`` pairs with :data:`NOT_AVAILABLE` for an unknown figure), then this
    process when ``used`` is given: an int, or a callable returning it (called on every
    read, so a test can make it grow). ``graphics`` is the graphics list. ``fail_init``
    and ``fail_processes`` make those calls fail. ``function_table=True`` adds the pieces
    of pynvml's function table that ``nvml.running_processes`` reads the list through in
    one driver call. Counters: ``reads`` (every read of the compute list),
    ``driver_calls`` (through the function table), ``wrapper_calls`` (through the
    wrapper), ``by_index`` (the indices asked for a handle)."""

    class NVMLError(Exception):
        pass

    NVML_CLOCK_SM = 0
    NVML_CLOCK_MEM = 1
    NVML_SUCCESS = 0
    NVML_ERROR_INSUFFICIENT_SIZE = 7
    NVML_VALUE_NOT_AVAILABLE_ulonglong = ctypes.c_ulonglong(-1)

    def __init__(self, processes: Optional[List[Any]] = None, *, used: Any = None,
                 count: int = 1, total: int = 80 * GiB, free: int = 60 * GiB,
                 name: Any = "Fake GPU", function_table: bool = False) -> None:
        super().__init__("pynvml")
        self.processes = list(processes or [])
        self.used = used
        self.count, self.total, self.free, self.name = count, total, free, name
        self.fail_init = False
        self.fail_processes = False
        self.graphics: List[Any] = []
        self.by_index: List[int] = []
        self.reads = self.driver_calls = self.wrapper_calls = 0
        if function_table:
            self.c_nvmlProcessInfo_v3_t = ProcessInfoV3
            self._nvmlGetFunctionPointer = self._function_pointer

    def _listed(self) -> List[Any]:
        if self.fail_processes:
            raise self.NVMLError("Insufficient Permissions")
        self.reads += 1
        listed = [proc(p[0], None if p[1] == NOT_AVAILABLE else p[1])
                  if isinstance(p, tuple) else p for p in self.processes]
        if self.used is not None:
            used = self.used() if callable(self.used) else self.used
            listed.append(proc(os.getpid(), int(used)))
        return listed

    def _function_pointer(self, name: str) -> Any:
        assert name == "nvmlDeviceGetComputeRunningProcesses_v3"

        def fn(handle: Any, count_ref: Any, entries: Any) -> int:
            self.driver_calls += 1
            listed = self._listed()
            count = ctypes.cast(count_ref, ctypes.POINTER(ctypes.c_uint)).contents
            if entries is None or count.value < len(listed):
                count.value = len(listed)
                return self.NVML_ERROR_INSUFFICIENT_SIZE if listed else self.NVML_SUCCESS
            for i, p in enumerate(listed):
                figure = p.usedGpuMemory
                entries[i].pid = p.pid
                entries[i].usedGpuMemory = NOT_AVAILABLE if figure is None else figure
            count.value = len(listed)
            return self.NVML_SUCCESS

        return fn

    @staticmethod
    def nvmlStructToFriendlyObject(entry: Any) -> Any:
        return _Info(pid=entry.pid, usedGpuMemory=entry.usedGpuMemory)

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "999.99"

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self.by_index.append(index)
        return ("handle", index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetHandleByPciBusId(self, bus: str) -> Any:
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return f"GPU-fake{handle[1]}-0000"

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        return self.name

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return _Info(total=self.total, free=self.free, used=self.total - self.free)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> List[Any]:
        self.wrapper_calls += 1
        return self._listed()

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> List[Any]:
        return list(self.graphics)

    def nvmlDeviceGetClockInfo(self, handle: Any, which: int) -> int:
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return 0


class FakeDriver:
    """The driver as ``frameworks.driver.backend`` (gpukeeper._core's driver functions)
    answers: ``primary`` per device, and the device of a non-primary context current on
    this thread (None: none)."""

    def __init__(self, primary: Dict[int, bool], foreign: Optional[int] = None) -> None:
        self.primary = primary
        self.foreign = foreign

    def driver_device_count(self) -> Optional[int]:
        return len(self.primary)

    def primary_context_active(self, device: int) -> Optional[bool]:
        return self.primary.get(device)

    def current_context_foreign(self) -> Optional[int]:
        return self.foreign

    def device_pci_bus_id(self, device: int) -> Optional[str]:
        return None  # NVML then matches by UUID or index

    def driver_device_info(self, device: int) -> Optional[Dict[str, Any]]:
        return None


def install_nvml(monkeypatch: Any, fake: FakeNvml) -> FakeNvml:
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml.NVML.reset()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def install_driver(monkeypatch: Any, driver: FakeDriver) -> FakeDriver:
    monkeypatch.setattr(devices, "cuda_status", lambda: (len(driver.primary), ""))
    monkeypatch.setattr(cuda_driver, "libcuda_loaded", lambda: True)
    monkeypatch.setattr(cuda_driver, "backend", driver)
    return driver


def hide_frameworks(monkeypatch: Any) -> None:
    """No framework in the process: torch/cupy/jax out of sys.modules (this test's code
    never imports them; monkeypatch puts them back), no gpukeeper device pool."""
    for name in ("torch", "cupy", "jax"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(pools_adapter, "live_pools", lambda: [])


def install_engine(monkeypatch: Any, used: Any) -> FakeNvml:
    """An engine (OpenMM) holding its own CUDA context on device 0; no framework."""
    hide_frameworks(monkeypatch)
    install_driver(monkeypatch, FakeDriver({0: False}))
    return install_nvml(monkeypatch, FakeNvml(used=used))


class FakeTorch(types.ModuleType):
    """torch with CUDA usable (``available``) and its counters at a fixed level: the
    engine's work is elsewhere, so nothing moves them. Counts peak resets."""

    def __init__(self, allocated: int, reserved: int, available: bool = True) -> None:
        super().__init__("torch")
        stats = {"allocated_bytes": {"all": {"current": allocated, "peak": reserved}},
                 "reserved_bytes": {"all": {"current": reserved}}}
        self.peak_resets = 0

        def reset_peak(device: int) -> None:
            self.peak_resets += 1

        memory = types.SimpleNamespace(memory_stats_as_nested_dict=lambda d: stats)
        self.cuda = types.SimpleNamespace(
            is_available=lambda: available, is_initialized=lambda: available, device_count=lambda: 1,
            current_device=lambda: 0, synchronize=lambda d=None: None, memory=memory,
            reset_peak_memory_stats=reset_peak,
        )
        self._C = types.SimpleNamespace()
        self.Tensor = type("Tensor", (), {})


class Growing:
    """A device-memory figure that grows by ``step`` bytes every read (an engine that
    leaks), from ``start``."""

    def __init__(self, start: int, step: int) -> None:
        self.value = start
        self.step = step

    def __call__(self) -> int:
        self.value += self.step
        return self.value


# --------------------------------------------------------------------- JAX


def fake_jax(stats: Optional[Dict[str, int]] = None) -> types.ModuleType:
    """A ``jax`` module with one GPU device whose ``memory_stats()`` returns ``stats``."""
    jax = types.ModuleType("jax")
    jax.blocked = 0  # type: ignore[attr-defined]

    class Device:
        platform = "gpu"
        id = 0

        def memory_stats(self) -> Optional[Dict[str, int]]:
            return None if stats is None else dict(stats)

    device = Device()

    class Array:
        def __init__(self, value: float) -> None:
            self.value = value

        def devices(self) -> set:
            return {device}

    def block_until_ready(x: Any) -> Any:
        jax.blocked += 1  # type: ignore[attr-defined]
        return x

    tree_util = types.SimpleNamespace(
        tree_leaves=lambda x: list(x) if isinstance(x, (list, tuple)) else [x]
    )
    jax.Array = Array  # type: ignore[attr-defined]
    jax.devices = lambda: [device]  # type: ignore[attr-defined]
    jax.block_until_ready = block_until_ready  # type: ignore[attr-defined]
    jax.tree_util = tree_util  # type: ignore[attr-defined]
    jax.clear_caches = lambda: None  # type: ignore[attr-defined]
    jax.effects_barrier = lambda: None  # type: ignore[attr-defined]
    return jax


def counter() -> Callable[[], None]:
    """A callable that counts its calls in ``.calls``."""

    def call() -> None:
        call.calls += 1  # type: ignore[attr-defined]

    call.calls = 0  # type: ignore[attr-defined]
    return call

"""NVML, loaded at run time: the device's memory and this process's share of it.

NVML comes from nvidia-ml-py (``import pynvml``), imported and initialised once, lazily,
by :data:`NVML`. Without it, or when NVML fails, ``NVML.get()`` says why (e.g.
``"unavailable: No module named 'pynvml' (install nvidia-ml-py)"``) and callers fill
what they can; nothing here raises for a missing or failing NVML.

NVML needs no CUDA context, so asking it never costs the ~0.5 GiB a new context takes,
and it sees every context of a process: the primary context the frameworks share and
the ones an engine makes for itself with ``cuCtxCreate`` (OpenMM does).

Device numbers are CUDA's (after ``CUDA_VISIBLE_DEVICES``); the matching NVML device is
found by PCI bus id (when the CUDA driver is loaded), by UUID (when PyTorch has initialised CUDA),
else through ``CUDA_VISIBLE_DEVICES``, else by the same index, which assumes CUDA's
device order is NVML's (true for identical GPUs, or with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import gpukeeper._core as _core

__all__ = [
    "Nvml",
    "NVML",
    "nvml_status",
    "text",
    "error_text",
    "device_handle",
    "device_free_total",
    "ProcessMemory",
    "process_name",
    "device_processes",
    "ProcessReading",
    "this_process_memory",
    "process_memory_reader",
    "INSTALL_HINT",
]

INSTALL_HINT = "install nvidia-ml-py"


class Nvml:
    """pynvml, imported and initialised once per process (thread-safe).

    ``get()`` returns ``(module, "")`` when NVML works, else ``(None, reason)``. The
    result is kept: a failed nvmlInit is not retried on every call (it costs ~ms).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tried = False
        self._module: Any = None
        self._reason = ""
        self.driver = ""
        # CUDA device index -> (NVML handle, how it was found); filled lazily.
        self.handles: Dict[int, Tuple[Any, str]] = {}

    def get(self) -> Tuple[Any, str]:
        """``(pynvml, "")`` when NVML works, else ``(None, why not)``."""
        if self._tried:
            return self._module, self._reason
        with self._lock:
            if not self._tried:
                self._module, self._reason = self._load()
                self._tried = True
        return self._module, self._reason

    def _load(self) -> Tuple[Any, str]:
        try:
            import pynvml
        except ImportError as exc:
            return None, f"unavailable: {exc} ({INSTALL_HINT})"
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            return None, f"unavailable: nvmlInit failed: {error_text(exc)}"
        try:
            self.driver = text(pynvml.nvmlSystemGetDriverVersion())
        except Exception:
            self.driver = ""  # only decorates the status line
        return pynvml, ""

    def status(self) -> str:
        """``"ok (driver X)"`` when NVML works, else ``"unavailable: <why>"``."""
        module, reason = self.get()
        if module is None:
            return reason
        return f"ok (driver {self.driver})" if self.driver else "ok"

    def reset(self) -> None:
        """Forgets the loaded state (tests swap pynvml for a fake)."""
        with self._lock:
            self._tried = False
            self._module = None
            self._reason = ""
            self.driver = ""
            self.handles = {}


#: The process's one NVML loader.
NVML = Nvml()


def nvml_status() -> str:
    """``"ok (driver X)"`` when NVML works, else ``"unavailable: <why>"``."""
    return NVML.status()


def text(value: Any) -> str:
    """A string from what pynvml returns (bytes in old nvidia-ml-py versions)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def error_text(exc: BaseException) -> str:
    """``"NVMLError_X: message"``, safe to call on any exception."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # NVMLError.__str__ itself calls into NVML
        return type(exc).__name__


# --------------------------------------------------------------------- CUDA device -> NVML


def _cuda_visible_entry(device: int) -> Optional[str]:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = [e.strip() for e in value.split(",")]
    # CUDA stops at the first invalid entry; a valid one is an index or a UUID prefix.
    return entries[device] if device < len(entries) and entries[device] else None


def _driver_uuid(device: int) -> Optional[str]:
    # The device's UUID without its "GPU-" prefix (cuDeviceGetUuid), under the same
    # condition as the bus id: only once libcuda is loaded.
    if not _core.cuda_driver_loaded():
        return None
    info = _core.driver_device_info(device)
    uuid = str((info or {}).get("uuid") or "")
    return uuid[4:] if uuid.startswith("GPU-") else (uuid or None)


def _pci_bus_id(device: int) -> Optional[str]:
    # Asked of the driver only once libcuda is loaded (a framework or gpukeeper uses CUDA):
    # initialising it for a lookup would cost time and host memory. nvml sits below the
    # framework layer, so it asks the core directly rather than frameworks.driver.
    if not _core.cuda_driver_loaded():
        return None
    return _core.device_pci_bus_id(device)


def device_handle(nvml: Any, device: int) -> Tuple[Any, str]:
    """The NVML handle of CUDA device ``device`` and how it was matched (cached).

    Raises what pynvml raises (or ``LookupError``) when no NVML device matches.
    """
    cached = NVML.handles.get(device)
    if cached is not None:
        return cached
    found: Optional[Tuple[Any, str]] = None
    bus_id = _pci_bus_id(device)
    if bus_id:
        try:
            found = (nvml.nvmlDeviceGetHandleByPciBusId(bus_id), f"PCI bus id {bus_id}")
        except Exception:
            found = None
    if found is None:
        uuid = _driver_uuid(device)
        for candidate in [f"GPU-{uuid}", f"MIG-{uuid}", uuid] if uuid else []:
            try:
                found = (nvml.nvmlDeviceGetHandleByUUID(candidate), f"UUID {candidate}")
                break
            except Exception:
                continue
    if found is None:
        entry = _cuda_visible_entry(device)
        if entry is not None and entry.isdigit():
            found = (nvml.nvmlDeviceGetHandleByIndex(int(entry)), f"CUDA_VISIBLE_DEVICES={entry}")
        elif entry is not None:
            found = _handle_by_uuid_prefix(nvml, entry)
        else:
            found = (nvml.nvmlDeviceGetHandleByIndex(device), "same index")
    NVML.handles[device] = found
    return found


def _handle_by_uuid_prefix(nvml: Any, prefix: str) -> Tuple[Any, str]:
    # CUDA accepts any unique prefix of a UUID in CUDA_VISIBLE_DEVICES; NVML wants it whole.
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        if text(nvml.nvmlDeviceGetUUID(handle)).startswith(prefix):
            return handle, f"CUDA_VISIBLE_DEVICES={prefix}"
    raise LookupError(f"no NVML device matches CUDA_VISIBLE_DEVICES entry {prefix!r}")


def device_free_total(device: int, *, use_nvml: bool = True) -> Tuple[int, int, str]:
    """(free, total, source) bytes of CUDA device ``device``.

    NVML first (it needs no CUDA context, so asking never costs the ~0.5 GiB a new
    context takes); ``cudaMemGetInfo`` when NVML is unavailable or has no matching
    device. Raises ``InvalidInputError`` for a bad index and ``DeviceError`` if
    cudaMemGetInfo fails.
    """
    nvml, _ = NVML.get() if use_nvml else (None, "")
    if nvml is not None:
        try:
            handle, _how = device_handle(nvml, device)
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            return int(info.free), int(info.total), "nvml"
        except Exception:
            pass  # fall back to the runtime's own view
    free, total = _core.device_memory_info(device)
    return int(free), int(total), "cudaMemGetInfo"


# --------------------------------------------------------------------- processes


@dataclass(frozen=True)
class ProcessMemory:
    """One process on the device as NVML lists it. ``used_bytes`` is None where NVML
    cannot tell (e.g. insufficient permissions); ``name`` is None where the process is
    not visible from here (another PID namespace)."""

    pid: int
    name: Optional[str]
    used_bytes: Optional[int]


def process_name(pid: int) -> Optional[str]:
    """The command name of ``pid`` (``/proc/PID/comm``), None where it is not visible."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().decode(errors="replace").strip() or None
    except Exception:
        return None  # not visible from this PID namespace, or gone


# Entries of the buffer one call of NVML's process lists fills; more processes on one
# device than this take pynvml's two calls instead.
_LISTED = 64


def running_processes(nvml: Any, handle: Any, getter: str) -> List[Any]:
    """NVML's list ``getter`` (``nvmlDeviceGetComputeRunningProcesses`` or the graphics
    one) for the device: entries with ``pid`` and ``usedGpuMemory`` (None where NVML
    cannot tell).

    One driver call with a buffer of :data:`_LISTED` entries. pynvml's wrapper makes two
    (the count, then the list), and when every rank of a job reads at the same moment
    those calls queue in the driver. Falls back to the wrapper where pynvml lacks the
    function table it is built on, or the buffer is too small."""
    lean = _lean_list(nvml, getter)
    if lean is None:
        return list(getattr(nvml, getter)(handle))
    fn, entries, unknown = lean
    count = ctypes.c_uint(_LISTED)
    ret = fn(handle, ctypes.byref(count), entries)
    if ret == nvml.NVML_ERROR_INSUFFICIENT_SIZE:
        return list(getattr(nvml, getter)(handle))
    if ret != nvml.NVML_SUCCESS:
        raise nvml.NVMLError(ret)
    out = []
    for i in range(count.value):
        info = nvml.nvmlStructToFriendlyObject(entries[i])
        if info.usedGpuMemory == unknown:
            info.usedGpuMemory = None
        out.append(info)
    return out


def device_processes(
    nvml: Any, handle: Any, notes: List[str], *, names: bool = True, wanted: Optional[int] = None
) -> Optional[List[ProcessMemory]]:
    """Every process NVML lists on the device (compute and graphics), one per pid; None
    when neither list could be read (the reasons are appended to ``notes``). ``names``
    False leaves each ``name`` None: reading them costs a file per process.

    ``wanted``: a pid the caller reads for itself alone. When the compute list gives it
    with a figure, the graphics list is not read (a process in both lists has one figure
    in each), and the list returned may lack graphics-only processes: one driver call
    instead of two, which matters when every rank of a job reads at once."""
    seen: Dict[int, Optional[int]] = {}
    ok = False
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        if getattr(nvml, getter, None) is None:
            continue
        if wanted is not None and seen.get(wanted) is not None:
            break
        try:
            infos = running_processes(nvml, handle, getter)
        except Exception as exc:
            notes.append(f"{getter} failed: {error_text(exc)}")
            continue
        ok = True
        for info in infos:
            pid = int(info.pid)
            used = getattr(info, "usedGpuMemory", None)
            used = None if used is None else int(used)
            # A process with compute and graphics work is listed twice with one figure.
            if pid in seen:
                prev = seen[pid]
                used = prev if used is None else used if prev is None else max(used, prev)
            seen[pid] = used
    if not ok:
        return None
    return [
        ProcessMemory(pid, process_name(pid) if names else None, used) for pid, used in seen.items()
    ]


@dataclass(frozen=True)
class ProcessReading:
    """This process on one device, as NVML sees it.

    ``listed``: True when NVML lists this process there (it holds a CUDA context on the
    device), False when it does not, None when that cannot be told (NVML unavailable,
    or a container's PID namespace hides this process). ``used_bytes``: its device
    memory (None when unknown). ``reason``: why something is unknown, else "".
    """

    listed: Optional[bool]
    used_bytes: Optional[int]
    reason: str = ""


def this_process_memory(device: int, pid: Optional[int] = None) -> ProcessReading:
    """What this process (or ``pid``) holds on CUDA device ``device`` according to NVML."""
    nvml, why = NVML.get()
    if nvml is None:
        return ProcessReading(None, None, why)
    try:
        handle, _how = device_handle(nvml, device)
    except Exception as exc:
        return ProcessReading(
            None, None, f"no NVML device matched CUDA device {device}: {error_text(exc)}"
        )
    notes: List[str] = []
    me = os.getpid() if pid is None else pid
    processes = device_processes(nvml, handle, notes, names=False, wanted=me)
    if processes is None:
        return ProcessReading(None, None, "; ".join(notes) or "NVML gave no process list")
    mine = [p for p in processes if p.pid == me]
    if mine:
        used = mine[0].used_bytes
        return ProcessReading(
            True, used, "" if used is not None else "NVML does not report its memory"
        )
    if any(process_name(p.pid) is None for p in processes):
        # Listed PIDs that do not exist here: NVML's PIDs are another namespace's.
        return ProcessReading(
            None,
            None,
            f"pid {me} is not in NVML's list and listed PIDs are "
            "not visible here (a container's PID namespace)",
        )
    return ProcessReading(False, 0)


def process_memory_reader(
    device: int, pid: Optional[int] = None
) -> Tuple[Optional[Callable[[], int]], str]:
    """``(read, "")``: a function returning this process's device memory on ``device``
    (bytes, 0 while it is not listed) from NVML's compute-process list; or ``(None, why)``
    when NVML cannot tell. One driver call a read (tens to hundreds of microseconds)."""
    reading = this_process_memory(device, pid)
    if reading.listed is None or (reading.listed and reading.used_bytes is None):
        return None, reading.reason or "NVML cannot tell this process's memory"
    nvml, _ = NVML.get()
    handle, _how = device_handle(nvml, device)
    me = os.getpid() if pid is None else pid
    lean = _lean_list(nvml, "nvmlDeviceGetComputeRunningProcesses")
    if lean is not None:
        fn, entries, unknown = lean
        count = ctypes.c_uint()

        def read_lean() -> int:
            # The handle, function and buffer are kept: a read is one driver call and a
            # scan of the entries (no Python object per process), about a third of a
            # general listing's cost.
            count.value = _LISTED
            ret = fn(handle, ctypes.byref(count), entries)
            if ret != nvml.NVML_SUCCESS:
                return read()  # a longer list than the buffer, or an error: the general way
            for i in range(count.value):
                if entries[i].pid == me:
                    used = entries[i].usedGpuMemory
                    return 0 if used == unknown else int(used)
            return 0

    def read() -> int:
        for info in running_processes(nvml, handle, "nvmlDeviceGetComputeRunningProcesses"):
            if int(info.pid) == me:
                used = getattr(info, "usedGpuMemory", None)
                return int(used) if used is not None else 0
        return 0

    return (read_lean if lean is not None else read), ""


def _lean_list(nvml: Any, getter: str) -> Optional[Tuple[Any, Any, int]]:
    """(the v3 list function, a buffer of :data:`_LISTED` entries, NVML's "unknown"
    value) where pynvml exposes its function table, for readers that list often."""
    lookup = getattr(nvml, "_nvmlGetFunctionPointer", None)
    entry = getattr(nvml, "c_nvmlProcessInfo_v3_t", None)
    if lookup is None or entry is None:
        return None
    try:
        fn = lookup(getter + "_v3")
    except Exception:
        return None
    return fn, (entry * _LISTED)(), int(nvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value)

"""``memory_report``: reads a device (or every device) and writes its account.

>>> report = memory_report(0)         # CUDA device 0; memory_report("cpu"): host memory
>>> print(report)                     # a readable table
>>> report.frameworks["torch"].reserved
>>> report.context_and_libraries_bytes
>>> report.to_json()                  # or to_dict(); MemoryReport.from_dict() reads it back
>>> everything = memory_report()      # every visible device and their totals
>>> everything.frameworks_reserved_bytes, everything[1].free_bytes  # (DevicesReport)
>>> memory_report(0, detail="counters")   # the frameworks' counters, free and total only

What each figure means is in :mod:`gpukeeper.account.device_account`. ``detail`` says how
much is read: ``"full"`` (the default) everything; ``"counters"`` each framework's
counters and peak and the device's free and total, without NVML's process lists, names,
the contexts or the host section (what ``get_gpu_memory_info`` shows); ``"device"`` the
device's free and total alone (what ``GPUMemoryManager.get_memory_info`` shows).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple, Union, overload

import gpukeeper._core as _core
from gpukeeper import frameworks
from gpukeeper.account.device_account import MemoryReport
from gpukeeper.account.process_account import DevicesReport
from gpukeeper.base import device_names as devices
from gpukeeper.base import host_memory as host_mem
from gpukeeper.base.arg_checks import check_choice
from gpukeeper.base.byte_figures import fmt_bytes, sum_known
from gpukeeper.base.errors import DeviceError
from gpukeeper.base.nvml import (
    NVML,
    ProcessMemory,
    ProcessReading,
    device_handle,
    device_processes,
    error_text,
    nvml_status,
    process_name,
    text,
    this_process_memory,
)
from gpukeeper.frameworks import FrameworkMemory
from gpukeeper.frameworks.ranks import current_rank

__all__ = ["DETAILS", "ProcessMemory", "memory_report", "memory_reports", "nvml_status"]

#: How much ``memory_report(detail=...)`` reads, most first (see the module's docstring).
DETAILS = ("full", "counters", "device")


# --------------------------------------------------------------------- gathering


def _host_section() -> Dict[str, Optional[int]]:
    available, total = _core.host_memory_info()
    pools = frameworks.host_pool_memory()
    allocated = pools.allocated if pools else 0
    reserved = pools.reserved if pools else 0
    return {
        "total_bytes": int(total),
        "available_bytes": int(available),
        "process_rss_bytes": host_mem.current_rss_bytes(),
        "gpukeeper_pools_allocated_bytes": allocated,
        "gpukeeper_pools_reserved_bytes": reserved,
    }


def _not_read(detail: str) -> str:
    """What a lean report (``detail`` other than "full") writes where it read nothing."""
    return f"not read (detail={detail!r})"


def _cpu_report(reason: str, use_nvml: bool, detail: str = "full") -> MemoryReport:
    if detail == "device":
        return _host_totals_report(reason)
    host = _host_section()
    # In CPU mode the host stands for the device: what the C allocator has handed out
    # and the peak resident set are this process's figures (get_gpu_memory_info's).
    host["malloc_in_use_bytes"] = host_mem.malloc_in_use_bytes()
    host["peak_rss_bytes"] = host_mem.peak_rss_bytes()
    pools = [p for p in frameworks.live_pools() if getattr(p, "kind", "") in ("host", "pinned")]
    framework_memory: Dict[str, FrameworkMemory] = {}
    peaks: Dict[str, int] = {}
    if pools:
        framework_memory["gpukeeper"] = FrameworkMemory(
            "gpukeeper",
            host["gpukeeper_pools_allocated_bytes"],
            host["gpukeeper_pools_reserved_bytes"],
        )
        # The host pools stand for the device in CPU mode, so their peak is the report's
        # (peak_by_framework asks of device pools only, and a CPU-only build has none).
        peak = frameworks.host_pool_peak()
        if peak is not None:
            peaks["gpukeeper"] = int(peak)
    if detail != "full":
        nvml = _not_read(detail)
    else:
        nvml = nvml_status() if use_nvml else "disabled (use_nvml=False)"
    return MemoryReport(
        mode="cpu",
        device=None,
        name="host",
        total_bytes=int(host["total_bytes"] or 0),
        free_bytes=int(host["available_bytes"] or 0),
        memory_source="host",
        frameworks=framework_memory,
        process_bytes=host["process_rss_bytes"],
        process_source="resident set size (/proc/self/statm)",
        this_process="CPU mode",
        other_processes=[],
        nvml=nvml,
        host=host,
        notes=[f"CPU mode ({reason}): figures are host memory"],
        peaks=peaks,
        detail=detail,
    )


def _host_totals_report(reason: str) -> MemoryReport:
    """``detail="device"`` in CPU mode: the host's available and total memory alone."""
    available, total = (int(x) for x in _core.host_memory_info())
    return MemoryReport(
        mode="cpu",
        device=None,
        name="host",
        total_bytes=total,
        free_bytes=available,
        memory_source="host",
        frameworks={},
        process_bytes=None,
        process_source=_not_read("device"),
        this_process="CPU mode",
        other_processes=[],
        nvml=_not_read("device"),
        host={"total_bytes": total, "available_bytes": available},
        notes=[f"CPU mode ({reason}): figures are host memory; only its available and total read"],
        detail="device",
    )


#: Where a summary's reading of this process on a device comes from, when not from
#: NVML's process list read there and then (a reading kept off the critical path).
ProcessReadingSource = Callable[[int], ProcessReading]


def _cuda_report(
    device: int,
    use_nvml: bool,
    *,
    for_totals: bool = False,
    process_reading: Optional[ProcessReadingSource] = None,
) -> MemoryReport:
    """The device's account. ``for_totals``: only the figures a rank's summary carries
    are read, for a report that is never shown: no host section, no device name, no
    free and total (reported as 0), no names of the other processes (a file each), and
    no graphics process list once the compute list gives this process's figure
    (``other_processes`` may then be short).
    ``process_reading`` (with ``for_totals``): this process's NVML figure comes from it
    and NVML's process list is not read (``other_processes`` is then empty)."""
    notes: List[str] = []
    framework_memory, reserved_known, peaks = _framework_section(device, notes, for_totals)
    nvml, nvml_reason, handle = _nvml_handle(device, use_nvml, notes)
    given = process_reading if (for_totals and nvml is not None) else None
    name, total, free, source, processes = _device_memory(
        device,
        nvml,
        handle,
        notes,
        details=not for_totals,
        list_processes=given is None,
        sizes=not for_totals,
    )

    pid = os.getpid()
    why = nvml_reason if nvml is None else "NVML gave no process list"
    if given is not None:
        reading = given(device)
        if reading.listed is None:
            processes, why = None, reading.reason or why
        else:
            processes = [ProcessMemory(pid, None, reading.used_bytes)] if reading.listed else []
    process_bytes, this_process, others = _this_process_reading(
        device, pid, processes, reserved_known, why
    )
    listed = None if this_process.startswith("unknown") else this_process.startswith("found")
    census = frameworks.context_census(
        device,
        reading=ProcessReading(listed, process_bytes),
        primary_in_use=(reserved_known or 0) > 0,
    )
    primary, other = census.primary, census.other
    if other is not None and other > 0 and primary:
        notes.append(
            "another CUDA context than the primary one is in use (" + census.how + "): NVML "
            "gives one figure per process, so its memory is not told apart from the "
            "primary context's"
        )
    return _device_report(
        device,
        (name, total, free, source),
        framework_memory,
        NVML.status() if use_nvml else nvml_reason,
        notes,
        process_bytes=process_bytes,
        process_source="nvml" if processes is not None else "unavailable",
        this_process=this_process,
        other_processes=others,
        host={} if for_totals else _host_section(),
        pid=pid,
        primary_context=primary,
        other_contexts=other,
        contexts_how=census.how,
        # One more counter read per framework that keeps a peak: PyTorch's raw stats
        # call (13-19 us on an H100 host), the pools' stats (well under that); none for
        # an adapter that gave its peak with its counters.
        peaks=peaks if peaks is not None else frameworks.peak_by_framework(device),
    )


def _lean_cuda_report(device: int, use_nvml: bool, detail: str) -> MemoryReport:
    """``detail="counters"``: each framework's counters and peak (one read each where
    the adapter can) and the device's free and total; ``detail="device"``: free and
    total alone. Neither reads NVML's process lists, the device's name, the contexts or
    the host, so this process's figure and the other processes are unknown here."""
    notes: List[str] = []
    framework_memory: Dict[str, FrameworkMemory] = {}
    peaks: Dict[str, int] = {}
    if detail == "counters":
        framework_memory, _reserved, read_peaks = _framework_section(device, notes, True)
        peaks = read_peaks or {}
    nvml, nvml_reason, handle = _nvml_handle(device, use_nvml, notes)
    name, total, free, source, _ = _device_memory(
        device, nvml, handle, notes, details=False, list_processes=False
    )
    notes.append(
        f"detail={detail!r}: "
        + ("the frameworks' counters, " if detail == "counters" else "")
        + "free and total read; no process list, contexts or host"
    )
    unread = _not_read(detail)
    nvml_text = NVML.status() if use_nvml else nvml_reason
    return _device_report(
        device,
        (name, total, free, source),
        framework_memory,
        nvml_text,
        notes,
        process_bytes=None,
        process_source=unread,
        this_process="unknown: " + unread,
        other_processes=[],
        host={},
        peaks=peaks,
        detail=detail,
    )


def _device_report(
    device: int,
    figures: Tuple[str, int, int, str],
    framework_memory: Dict[str, FrameworkMemory],
    nvml_text: str,
    notes: List[str],
    **process: Any,
) -> MemoryReport:
    """The report of CUDA device ``device`` from its ``figures`` (name, total, free and
    where they came from), its frameworks' counters and what was read of the process
    (``process``: the rest of ``MemoryReport``'s fields)."""
    name, total, free, source = figures
    return MemoryReport(
        mode="cuda",
        device=device,
        name=name,
        total_bytes=int(total),
        free_bytes=int(free),
        memory_source=source,
        frameworks=framework_memory,
        nvml=nvml_text,
        notes=notes,
        **process,
    )


def _memory_and_peaks(device: int):
    """Each framework's counters and peak on ``device``, one read each where the adapter
    can (PyTorch's statistics give both in one call)."""
    memory: Dict[str, FrameworkMemory] = {}
    peaks: Dict[str, int] = {}
    for name, fw in frameworks.ADAPTERS.items():
        counters, peak = fw.memory_and_peak(device)
        if counters is not None:
            memory[name] = counters
        if peak is not None:
            peaks[name] = int(peak)
    return memory, peaks


def _framework_section(device: int, notes: List[str], with_peaks: bool = False):
    peaks: Optional[Dict[str, int]] = None
    if with_peaks:
        framework_memory, peaks = _memory_and_peaks(device)
    else:
        framework_memory = frameworks.memory_by_framework(device)
    reserved_known = sum_known(m.reserved for m in framework_memory.values())
    if reserved_known is None:
        unknown = [n for n, m in framework_memory.items() if m.reserved is None]
        notes.append(f"reserved bytes unknown for {', '.join(unknown)}: no context figure")
    integration = sys.modules.get("gpukeeper.integrations.torch_allocator")
    try:
        if integration is not None and integration.is_active():
            notes.append("PyTorch allocates from a gpukeeper pool (use_torch_allocator)")
    except Exception:
        pass
    return framework_memory, reserved_known, peaks


def _nvml_handle(device: int, use_nvml: bool, notes: List[str]):
    nvml, nvml_reason = NVML.get() if use_nvml else (None, "disabled (use_nvml=False)")
    handle = None
    if nvml is not None:
        try:
            handle, how = device_handle(nvml, device)
            if how != "same index":
                notes.append(f"NVML device matched by {how}")
        except Exception as exc:
            notes.append(f"no NVML device matched CUDA device {device}: {error_text(exc)}")
    return nvml, nvml_reason, handle


def _device_memory(
    device: int,
    nvml,
    handle,
    notes: List[str],
    *,
    details: bool = True,
    list_processes: bool = True,
    sizes: bool = True,
):
    """The device's name, total and free bytes, where those came from, and NVML's
    process list. ``sizes=False`` (a rank's summary, which carries neither) leaves
    total and free unread, as 0: NVML's memory call is one more driver round trip on
    every rank of every summary, and ranks calling at once wait for each other in it."""
    name = f"CUDA device {device}"
    total = free = None
    source = "cudaMemGetInfo"
    processes: Optional[List[ProcessMemory]] = None
    if not sizes:
        total, free, source = 0, 0, "not read (a rank's summary carries no free or total)"
    if handle is not None:
        if details:
            try:
                name = text(nvml.nvmlDeviceGetName(handle))
            except Exception:
                pass
        if sizes:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle)
                total, free, source = int(info.total), int(info.free), "nvml"
            except Exception as exc:
                notes.append(f"nvmlDeviceGetMemoryInfo failed: {error_text(exc)}")
        if list_processes:
            processes = device_processes(
                nvml, handle, notes, names=details, wanted=None if details else os.getpid()
            )
    if total is None:
        # cudaMemGetInfo needs a context: this creates one on `device` if the process has
        # none yet (NVML avoids that, which is why it comes first).
        try:
            free, total = (int(x) for x in _core.device_memory_info(device))
        except DeviceError as exc:
            free, total, source = 0, 0, "unavailable"
            notes.append(f"free and total unknown (reported as 0): {exc}")
        if details and name == f"CUDA device {device}":
            name = frameworks.torch_device_name(device) or name
    return name, total, free, source, processes


def _this_process_reading(device: int, pid: int, processes, reserved_known, why: str):
    if processes is None:
        return None, "unknown: " + why, []
    mine = [p for p in processes if p.pid == pid]
    others = [p for p in processes if p.pid != pid]
    if mine and mine[0].used_bytes is not None and mine[0].used_bytes < (reserved_known or 0):
        # NVML counts every byte this process holds, so a smaller figure belongs to
        # someone else: a host PID that equals ours inside a container.
        process_bytes, others = None, processes
        this_process = (
            f"unknown: NVML lists pid {pid} with {fmt_bytes(mine[0].used_bytes)}, less than the "
            f"{fmt_bytes(reserved_known)} its frameworks reserved (another PID namespace's pid?)"
        )
    elif mine:
        process_bytes = mine[0].used_bytes
        this_process = f"found (pid {pid})"
        if process_bytes is None:
            this_process = f"found (pid {pid}), but NVML does not report its memory"
    elif (
        (reserved_known or 0) > 0
        or _holds_context(device)
        or any(process_name(p.pid) is None for p in others)
    ):
        # We have a context (we hold device memory, or the driver says so) yet are not
        # listed, or listed PIDs do not exist here: NVML's PIDs are another PID
        # namespace's (a container's).
        process_bytes = None
        this_process = (
            f"unknown: pid {pid} is not in NVML's list (a container's PID namespace "
            "may hide it); one of the listed processes may be this one"
        )
    else:
        process_bytes = 0
        this_process = "not listed: no CUDA context on this device"
    return process_bytes, this_process, others


def _holds_context(device: int) -> bool:
    """Whether this process has a CUDA context on ``device``, as far as can be told
    without creating one (frameworks.active_devices asks the driver, where it has it)."""
    active = getattr(frameworks, "active_devices", None)
    if active is None:
        return False
    try:
        return device in active()
    except Exception:
        return False


@overload
def memory_report(
    device: None = None, *, use_nvml: bool = True, scope: str = "visible", detail: str = "full"
) -> "DevicesReport": ...


@overload
def memory_report(
    device: Any, *, use_nvml: bool = True, scope: str = "visible", detail: str = "full"
) -> MemoryReport: ...


def memory_report(
    device: Any = None, *, use_nvml: bool = True, scope: str = "visible", detail: str = "full"
) -> "Union[MemoryReport, DevicesReport]":
    """Who holds the memory of every visible device, or of one.

    ``device=None``: a :class:`~gpukeeper.account.process_account.DevicesReport` of the whole
    process: one :class:`MemoryReport` per visible CUDA device, with totals (the single
    CPU-mode report without CUDA), tagged with the process's rank under torch.distributed
    or a launcher such as torchrun. Any other spelling gives the :class:`MemoryReport` of
    that one device: an index, ``"cuda:N"`` or a ``torch.device``; ``"cuda"`` or
    ``"auto"`` for the current device (PyTorch's current device once it has initialised
    CUDA, else CuPy's, else 0; the host without CUDA); ``"cpu"`` for a host-memory report
    (spellings: :mod:`gpukeeper.base.device_names`).

    ``use_nvml=False`` skips NVML (faster; no process split, no other processes).

    ``scope`` (with ``device=None`` only): ``"visible"`` (the default) covers every visible
    device. ``"rank"``, for one rank of a distributed job (a process group, or a
    launcher's RANK/WORLD_SIZE), covers only the device the rank drives (the current
    device), and the report's ``other_devices`` lists the other devices this process
    holds memory on (a primary context there, as the driver tells without creating one;
    NVML's process list where the driver cannot be asked; None when neither can tell).
    Outside a distributed job, or without CUDA, ``"rank"`` is ``"visible"``.

    ``detail``: how much is read (the report's ``detail`` keeps it). ``"full"`` (the
    default): everything above. ``"counters"``: each framework's allocated, reserved and
    peak bytes and the device's free and total; no NVML process list (this process's
    figure and the other processes are unknown), no device name, contexts or host
    section: what :func:`~gpukeeper.account.device_utils.get_gpu_memory_info` shows, at
    its cost. ``"device"``: the device's free and total alone (the frameworks are not
    read, and their sums are None): what ``GPUMemoryManager.get_memory_info`` shows.

    Raises ``InvalidInputError`` for a malformed or nonexistent device, a CUDA device
    where CUDA is unusable, or an unknown ``scope`` or ``detail``; a missing or failing
    NVML never raises (the ``nvml`` field says why), nor does a failing cudaMemGetInfo
    (free and total are then 0, ``memory_source`` is ``"unavailable"`` and a note says why).
    """
    check_choice(scope, "memory_report: scope", ("visible", "rank"))
    check_choice(detail, "memory_report: detail", DETAILS)
    if device is None:
        return _devices_report(use_nvml, scope, for_totals=False, detail=detail)
    spec = devices.resolve_device(device)
    if spec.index is None:
        return _cpu_report(spec.reason, use_nvml, detail)
    return _one_device(spec.index, use_nvml, detail)


def _one_device(device: int, use_nvml: bool, detail: str) -> MemoryReport:
    """The report of CUDA device ``device`` at ``detail``."""
    if detail == "full":
        return _cuda_report(device, use_nvml)
    return _lean_cuda_report(device, use_nvml, detail)


def rank_totals_report(
    use_nvml: bool, scope: str, process_reading: Optional[ProcessReadingSource] = None
) -> DevicesReport:
    """``memory_report(scope=scope)`` for a rank's summary: the same totals, read without
    what only a shown report needs: the host section, the device's name, its free and
    total bytes (0 here) and the other processes' names; each framework's counters and
    peak in one read where its adapter offers that.

    ``process_reading``: where this process's NVML figure on each device comes from
    (a ``device -> ProcessReading`` function, such as a reading kept by a background
    thread), instead of NVML's process list read now; the other processes are then not
    listed. Only with ``use_nvml``."""
    return _devices_report(use_nvml, scope, for_totals=True, process_reading=process_reading)


def _devices_report(
    use_nvml: bool,
    scope: str,
    *,
    for_totals: bool,
    process_reading: Optional[ProcessReadingSource] = None,
    detail: str = "full",
) -> DevicesReport:
    info = current_rank()
    others: Optional[List[int]] = None
    count = devices.cuda_status()[0] if scope == "rank" and info is not None else 0
    if count > 0:
        own = min(devices.current_cuda_index(), count - 1)
        if detail == "full":
            given = _given(process_reading)
            reports = [_cuda_report(own, use_nvml, for_totals=for_totals, **given)]
        else:
            reports = [_lean_cuda_report(own, use_nvml, detail)]
        others = _other_devices(own, count, use_nvml)
    else:
        reports = _every_device(
            use_nvml, for_totals=for_totals, process_reading=process_reading, detail=detail
        )
    return DevicesReport(
        devices=reports,
        rank=None if info is None else info.rank,
        world_size=None if info is None else info.world_size,
        other_devices=others,
    )


def memory_reports(*, use_nvml: bool = True) -> List[MemoryReport]:
    """Deprecated, removed in the next release: ``list(memory_report())`` is the same
    per-device list (one :class:`MemoryReport` per visible CUDA device, one CPU-mode
    report without CUDA). ``memory_report`` is the one entry point to device memory."""
    warnings.warn(
        "gpukeeper.memory_reports() is deprecated and goes in the next release: "
        "list(gpukeeper.memory_report()) gives the same per-device reports",
        DeprecationWarning,
        stacklevel=2,
    )
    return _every_device(use_nvml)


def _other_devices(own: int, count: int, use_nvml: bool) -> Optional[List[int]]:
    """The devices besides ``own`` on which this process holds memory, or None when that
    cannot be told. Holding memory on a device takes a context there, and the frameworks
    all use the primary one: the driver answers that in microseconds for every device,
    where NVML's process list takes tens to hundreds of microseconds a device (eight of
    them would be most of a rank's report), so NVML is asked only where the driver
    cannot be. A context that no framework made (``cuCtxCreate``) on another device is
    not seen here."""
    found = []
    for d in range(count):
        if d == own:
            continue
        active = frameworks.primary_context_active(d)
        if active is None:
            reading = this_process_memory(d) if use_nvml else None
            if reading is None or reading.listed is None:
                return None
            active = reading.listed
        if active:
            found.append(d)
    return found


def _every_device(
    use_nvml: bool,
    *,
    for_totals: bool = False,
    process_reading: Optional[ProcessReadingSource] = None,
    detail: str = "full",
) -> List[MemoryReport]:
    count, reason = devices.cuda_status()
    if count == 0:
        return [_cpu_report(f"CUDA unavailable: {reason}", use_nvml, detail)]
    if detail != "full":
        return [_lean_cuda_report(d, use_nvml, detail) for d in range(count)]
    given = _given(process_reading)
    return [_cuda_report(d, use_nvml, for_totals=for_totals, **given) for d in range(count)]


def _given(process_reading: Optional[ProcessReadingSource]) -> Dict[str, Any]:
    # Passed only when there is one: a report's builder keeps its plain call otherwise.
    return {} if process_reading is None else {"process_reading": process_reading}

"""Which devices this process holds CUDA contexts on, and the memory of contexts that no
framework made (an engine's, e.g. OpenMM's), all without creating a context."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from gpukeeper.base import nvml
from gpukeeper.frameworks import driver as cuda_driver
from gpukeeper.frameworks import registry
from gpukeeper.frameworks.adapter import FrameworkMemory

__all__ = [
    "ENGINE",
    "ContextCensus",
    "active_devices",
    "context_census",
    "context_devices",
    "engine_memory",
    "gpu_frameworks_loaded",
    "OUTSIDE",
    "outside_memory",
]

#: The name under which memory of CUDA contexts that no framework owns is counted.
ENGINE = "engine"
#: The name under which memory of this process that no loaded framework's counter
#: explains is counted: NVML's figure for the process less the frameworks' reserved bytes.
OUTSIDE = "outside frameworks"


def _cuda_maybe_in_use() -> bool:
    """Whether anything in the process could have made a CUDA context (cheap checks
    only: without this, asking the driver would initialise it for nothing)."""
    return any(fw.may_hold_context() for fw in registry.ADAPTERS.values())


def active_devices() -> List[int]:
    """CUDA devices on which this process holds a primary context, without creating one.

    Asks the driver (``cuDevicePrimaryCtxGetState`` through gpukeeper's core; every framework here
    uses the primary context). Without a reachable driver: the devices of gpukeeper's
    device pools and PyTorch's current device. Empty when no framework uses CUDA (see
    :func:`context_devices` for contexts that no framework made).
    """
    if not _cuda_maybe_in_use():
        return []
    count = cuda_driver.driver_device_count()
    if count is not None:
        return [d for d in range(count) if cuda_driver.primary_context_active(d)]
    devices = set()
    for fw in registry.ADAPTERS.values():
        devices.update(fw.context_devices())
    return sorted(devices)


def gpu_frameworks_loaded() -> List[str]:
    """The frameworks loaded in the process that run GPU work gpukeeper can see: PyTorch
    (imported, with usable CUDA), CuPy, JAX with a GPU, and gpukeeper's device pools."""
    return [name for name, fw in registry.ADAPTERS.items() if fw.gpu_loaded()]


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
    loaded = cuda_driver.libcuda_loaded()
    if reading is None:
        reading = (
            nvml.this_process_memory(device)
            if loaded is not False
            else nvml.ProcessReading(False, 0)
        )
    primary = True if primary_in_use else cuda_driver.primary_context_active(device)
    foreign = cuda_driver.current_context_foreign() if loaded is not False else None
    evidence = []
    other: Optional[int] = 0 if (primary is not None or reading.listed is not None) else None
    if foreign == device:
        other = 1
        evidence.append("a context other than the primary one is current on this thread")
    if reading.listed and primary is False:
        other = 1
        evidence.append(
            "NVML lists this process on the device and its primary context does not exist"
        )
    if loaded is False:
        evidence.append("the CUDA driver is not loaded in this process")
    elif primary is None:
        evidence.append("the driver cannot be asked about the primary context")
    else:
        evidence.append("primary context active" if primary else "no primary context")
    if reading.listed is None and reading.reason:
        evidence.append(f"NVML: {reading.reason}")
    return ContextCensus(
        device, primary, other, reading.listed, reading.used_bytes, "; ".join(evidence)
    )


def context_devices() -> List[int]:
    """CUDA devices on which this process holds any CUDA context: a framework's primary
    context or one an engine made for itself (``cuCtxCreate``: OpenMM), without
    creating one. NVML's per-process list where it can tell, else the driver's
    primary-context state. Empty when the CUDA driver is not loaded in the process."""
    if cuda_driver.libcuda_loaded() is False:
        return []
    found = []
    for device in range(cuda_driver.cuda_device_count()):
        reading = nvml.this_process_memory(device)
        if reading.listed:
            found.append(device)
        elif reading.listed is None and cuda_driver.primary_context_active(device):
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
    if gpu_frameworks_loaded() or cuda_driver.libcuda_loaded() is False:
        return None
    reading = nvml.this_process_memory(device)
    if not reading.listed or reading.used_bytes is None:
        return None
    return FrameworkMemory(ENGINE, reading.used_bytes, reading.used_bytes)


def outside_memory(device: int, reserved: int) -> Optional[FrameworkMemory]:
    """The device memory of this process beside the loaded frameworks': NVML's figure for
    the process on ``device`` less ``reserved`` (the bytes the frameworks hold there). It
    holds the CUDA context itself and whatever an engine or an extension in the process
    allocates past the frameworks' allocators (``cudaMalloc``, its own context); a change
    in it is theirs. None when no GPU framework is loaded (:func:`engine_memory` then
    counts all of it) or when NVML cannot tell. One NVML process list a read."""
    if not gpu_frameworks_loaded():
        return None
    key = (os.getpid(), device)  # a forked child lists under its own pid
    read = _OUTSIDE_READERS.get(key)
    if read is None:
        reading = nvml.this_process_memory(device)
        if not reading.listed or reading.used_bytes is None:
            return None  # not listed yet (no context), or NVML cannot tell: ask again later
        read, _why = nvml.process_memory_reader(device)
        if read is None:
            return None
        _OUTSIDE_READERS[key] = read
    try:
        outside = max(0, read() - reserved)
    except Exception:
        return None
    return FrameworkMemory(OUTSIDE, outside, outside)


#: NVML readers of this process's figure per (pid, device), kept: making one looks the
#: device up and lists every process once more.
_OUTSIDE_READERS: Dict[Tuple[int, int], Callable[[], int]] = {}

"""Measuring and releasing each framework's memory on the devices a cleanup looks at."""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional

from gpukeeper import frameworks
from gpukeeper.cleanup.cleanup_report import Snapshot
from gpukeeper.frameworks import OUTSIDE, FrameworkMemory

HOST = "host"

#: Growth of the memory outside every framework past this is said in a region's report:
#: NVML counts in pages of 2 MiB, and a library's small set-up (cuDNN's first convolution
#: took 8-10 MiB on an H100 and an H200) stays below it.
OUTSIDE_NOTE = 32 << 20
#: ... and past this it is held memory (a leak check fails). One region cannot tell a
#: library setting itself up once in the process from a leak: cuBLAS's first matmuls in a
#: test took 64-92 MiB outside PyTorch's allocator on an H200.
OUTSIDE_HELD = 256 << 20


def devices_in_use(fixed: Optional[List[int]]) -> List[int]:
    """The devices to look at now: those in use (never create a context to find nothing),
    restricted to ``fixed`` when the caller named devices. With no GPU framework loaded,
    the devices where an engine holds a CUDA context of its own (NVML) count too."""
    active = frameworks.active_devices()
    if not frameworks.gpu_frameworks_loaded():
        active = sorted(set(active) | set(frameworks.context_devices()))
    if fixed is None:
        return active
    return [d for d in fixed if d in active]


def measure(devices: Iterable[int], outside: bool = False) -> Snapshot:
    """Per location and framework, the bytes allocated and reserved now. ``outside``: on
    each device where a framework holds memory, also NVML's figure for this process less
    what the frameworks reserve (under ``OUTSIDE``): memory an engine or an extension
    allocates past them. It costs an NVML process list a device."""
    snap: Snapshot = {}
    for d in devices:
        per = frameworks.memory_by_framework(d)
        if not per:
            # No framework on the device: what the process holds there is an engine's
            # (its own CUDA context and buffers), read from NVML.
            engine = frameworks.engine_memory(d)
            if engine is not None:
                per = {engine.name: engine}
        elif outside:
            beside = frameworks.outside_memory(d, sum(m.reserved or 0 for m in per.values()))
            if beside is not None:
                per = {**per, OUTSIDE: beside}
        if per:
            snap[f"cuda:{d}"] = per
    host = frameworks.host_pool_memory()
    if host is not None:
        snap[HOST] = {host.name: host}
    return snap


def reset_peaks(devices: Iterable[int]) -> None:
    """Starts a new allocated-bytes peak, at the current level, in every framework that
    keeps one on ``devices`` and in gpukeeper's host pools."""
    for d in devices:
        frameworks.reset_peaks(d)
    frameworks.reset_host_pool_peak()


def peaks(devices: Iterable[int]) -> Dict[str, Dict[str, int]]:
    """Per location (as ``measure`` names them) and framework, the most bytes allocated
    since ``reset_peaks``; only the frameworks that keep such a peak."""
    found: Dict[str, Dict[str, int]] = {}
    for d in devices:
        per = frameworks.peak_by_framework(d)
        if per:
            found[f"cuda:{d}"] = per
    host = frameworks.host_pool_peak()
    if host is not None:
        found[HOST] = {"gpukeeper": host}
    return found


def level_of(mem: Optional[FrameworkMemory]) -> Optional[int]:
    if mem is None:
        return 0  # not loaded (or no context) at that time: it held nothing
    return mem.allocated if mem.allocated is not None else mem.reserved


def held_above(baseline: Optional[Snapshot], after: Snapshot) -> Dict[str, Dict[str, int]]:
    """Bytes allocated above the baseline (above zero without one), per location/framework."""
    held: Dict[str, Dict[str, int]] = {}
    for loc, per in after.items():
        base = baseline.get(loc, {}) if baseline is not None else {}
        for name, mem in per.items():
            now = level_of(mem)
            then = level_of(base.get(name)) if baseline is not None else 0
            if now is None or then is None:
                continue  # the framework cannot tell (JAX without memory stats)
            if name == OUTSIDE and (name not in base or now - then <= OUTSIDE_HELD):
                continue  # not read at the baseline (the context came after), or set-up
            if now > then:
                held.setdefault(loc, {})[name] = now - then
    return held


def outside_notes(baseline: Optional[Snapshot], after: Snapshot) -> List[str]:
    """What a region's report says of memory outside every framework that grew past
    :data:`OUTSIDE_NOTE` but not :data:`OUTSIDE_HELD` (past that it is held)."""
    notes = []
    for loc, per in after.items():
        then = (baseline or {}).get(loc, {}).get(OUTSIDE)
        now = per.get(OUTSIDE)
        if then is None or now is None or then.allocated is None or now.allocated is None:
            continue
        grew = now.allocated - then.allocated
        if OUTSIDE_NOTE < grew <= OUTSIDE_HELD:
            notes.append(
                f"{grew / (1 << 20):.1f} MiB appeared outside every framework on {loc} (NVML's "
                "figure for this process less the frameworks' reserved bytes) and stays: a "
                "library setting itself up once in the process (cuBLAS, cuDNN) or an engine or "
                "an extension allocating; a region that grows it again when run again leaks it "
                f"(held past {OUTSIDE_HELD >> 20} MiB)"
            )
    return notes


def release_caches(
    fixed: Optional[List[int]], devices: List[int], released: Dict[str, int]
) -> None:
    if fixed is None:
        got = frameworks.release_all_caches(None)
    else:
        got = {}
        for d in _framework_devices(devices):
            for name, n in frameworks.release_all_caches(d).items():
                got[name] = got.get(name, 0) + n
        # Host and pinned pools belong to no device: a named device must not keep them.
        for pool in frameworks.live_pools():
            if getattr(pool, "kind", "device") in ("host", "pinned"):
                got["gpukeeper"] = got.get("gpukeeper", 0) + int(pool.emergency_cleanup_all())
    for name, n in got.items():
        released[name] = released.get(name, 0) + int(n)


def synchronize_devices(fixed: Optional[List[int]], devices: List[int]) -> None:
    if fixed is None:
        frameworks.synchronize_all(None)
    else:
        for d in _framework_devices(devices):
            frameworks.synchronize_all(d)


def _framework_devices(devices: List[int]) -> List[int]:
    """The devices where a framework's primary context exists: asking a framework to
    synchronize or release on another device (one only an engine uses) would make it
    create a context there."""
    active = set(frameworks.active_devices())
    return [d for d in devices if d in active]

"""The adapter of gpukeeper's own pools: every live ``MemoryPool`` registry, its device
and host figures and its release."""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import gpukeeper._core as _core
from gpukeeper.frameworks.adapter import FrameworkAdapter, FrameworkMemory, StopRecording

__all__ = [
    "PoolsAdapter",
    "host_pool_memory",
    "host_pool_peak",
    "live_pools",
    "register_pool",
    "reset_host_pool_peak",
]

# Weak references keyed by id, and a tuple of them rebuilt only when a pool is registered
# or dies: live_pools() runs several times per leak check (every test of a suite under
# --gpu-leaks), and iterating a WeakSet costs microseconds each time. Nothing here may hold
# a pool strongly: a pool dropped by its owner must be able to die.
_refs: Dict[int, "weakref.ref[Any]"] = {}
_ref_tuple: Tuple["weakref.ref[Any]", ...] = ()

_DEVICE_KINDS = ("device", "async")
_HOST_KINDS = ("host", "pinned")


def _forget(key: int, ref: "weakref.ref[Any]") -> None:
    global _ref_tuple
    if _refs.get(key) is ref:
        del _refs[key]
    _ref_tuple = tuple(_refs.values())


def register_pool(pool: Any) -> None:
    """Counts a MemoryPool (anything with stats/devices/emergency_cleanup_all) in reports."""
    global _ref_tuple
    key = id(pool)
    known = _refs.get(key)
    if known is not None and known() is pool:
        return
    _refs[key] = weakref.ref(pool, partial(_forget, key))
    _ref_tuple = tuple(_refs.values())


def live_pools() -> List[Any]:
    """Every gpukeeper pool registry alive in the process, and every pool that outlived
    its ``MemoryPool`` because a buffer of it is still alive (an ``_Orphan`` each): the
    memory such a buffer holds stays in the account."""
    pools: List[Any] = [pool for pool in (ref() for ref in _ref_tuple) if pool is not None]
    orphans = _core._orphaned_pools()
    if orphans:
        pools += [_Orphan(p) for p in orphans]
    return pools


class _Orphan:
    """A pool whose ``MemoryPool`` is gone, read as a registry of one device."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.kind = pool.kind

    def devices(self) -> List[int]:
        return [self._pool.device]

    def stats(self, device: int) -> Any:
        return self._pool.stats() if device == self._pool.device else None

    def reset_peaks(self, device: int) -> None:
        if device == self._pool.device:
            self._pool.reset_peaks()

    def emergency_cleanup(self, device: int) -> int:
        return int(self._pool.emergency_cleanup()) if device == self._pool.device else 0

    def emergency_cleanup_all(self) -> int:
        return int(self._pool.emergency_cleanup())


def _figures(kinds: tuple, device: Optional[int]) -> Optional[FrameworkMemory]:
    allocated = reserved = 0
    found = False
    for pool in live_pools():
        if getattr(pool, "kind", "device") not in kinds:
            continue
        found = True
        for d in pool.devices() if device is None else [device]:
            if d not in pool.devices():
                continue
            stats = pool.stats(d)
            if stats is not None:
                allocated += stats.allocated_bytes
                reserved += stats.reserved_bytes
    return FrameworkMemory("gpukeeper", allocated, reserved) if found else None


def host_pool_memory() -> Optional[FrameworkMemory]:
    """Bytes gpukeeper's host and pinned pools hold (``None`` when there are none).

    Not part of ``memory_by_framework``, which counts device memory only; cleanup
    watches it too, as it is all there is to watch without a GPU.
    """
    return _figures(_HOST_KINDS, None)


def _pools_on(kinds: tuple, device: Optional[int]) -> List[Tuple[Any, int]]:
    """(pool, device) for each pool of ``kinds`` on ``device`` (every device when None)."""
    found = []
    for pool in live_pools():
        if getattr(pool, "kind", "device") in kinds:
            devices = pool.devices()
            found += [(pool, d) for d in (devices if device is None else [device]) if d in devices]
    return found


def _peak(kinds: tuple, device: Optional[int]) -> Optional[int]:
    pools = _pools_on(kinds, device)
    if not pools:
        return None
    # Per-pool peaks need not coincide in time: their sum bounds the joint peak from above.
    return sum(
        stats.peak_allocated_bytes for stats in (p.stats(d) for p, d in pools) if stats is not None
    )


def _reset_peak(kinds: tuple, device: Optional[int]) -> bool:
    pools = _pools_on(kinds, device)
    for pool, d in pools:
        pool.reset_peaks(d)
    return bool(pools)


def host_pool_peak() -> Optional[int]:
    """Most bytes allocated from gpukeeper's host and pinned pools since
    ``reset_host_pool_peak`` (the sum of each pool's peak); None without such pools."""
    return _peak(_HOST_KINDS, None)


def reset_host_pool_peak() -> bool:
    """Starts a new peak in every host and pinned pool; False when there are none."""
    return _reset_peak(_HOST_KINDS, None)


class PoolsAdapter(FrameworkAdapter):
    """gpukeeper's ``MemoryPool`` registries. Their pools synchronize the streams they
    use when they release memory, so ``synchronize`` has nothing to do."""

    name = "gpukeeper"
    display_name = "gpukeeper"
    whole_process = True  # a pool knows its devices: no context is created by asking

    def in_use(self) -> bool:
        return bool(live_pools())

    def gpu_loaded(self) -> bool:
        return any(getattr(p, "kind", "device") in _DEVICE_KINDS for p in live_pools())

    def may_hold_context(self) -> bool:
        return any(
            getattr(p, "kind", "device") in ("device", "async", "pinned") for p in live_pools()
        )

    def context_devices(self) -> List[int]:
        devices: List[int] = []
        for pool in live_pools():
            if getattr(pool, "kind", "device") in _DEVICE_KINDS:
                devices += pool.devices()
        return devices

    def record_allocations(
        self, on_alloc: Callable[[Sequence[int]], None]
    ) -> Optional[StopRecording]:
        # Called by the core with each new ManagedBuffer.
        _core._set_buffer_hook(lambda buffer: on_alloc((int(buffer.ptr),)))
        return lambda: _core._set_buffer_hook(None)

    def memory(self, device: int) -> Optional[FrameworkMemory]:
        if not live_pools():
            return None
        return _figures(_DEVICE_KINDS, device) or FrameworkMemory("gpukeeper", 0, 0)

    def reset_peak(self, device: int) -> bool:
        return _reset_peak(_DEVICE_KINDS, device)

    def peak(self, device: int) -> Optional[int]:
        return _peak(_DEVICE_KINDS, device)

    def release(self, devices: Optional[List[int]]) -> int:
        released = 0
        for pool in live_pools():
            if devices is None:
                released += pool.emergency_cleanup_all()
                continue
            for d in devices:
                if d in pool.devices():
                    released += pool.emergency_cleanup(d)
        return released

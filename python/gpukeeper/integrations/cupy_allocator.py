"""CuPy's device allocations on a gpukeeper pool: ``use_cupy_allocator()``.

>>> pool = gpukeeper.use_cupy_allocator()
>>> a = cupy.zeros(1 << 20)
>>> pool.stats(0).allocated_bytes
8388608

Each CuPy allocation is one ``ManagedBuffer`` on the current CuPy stream; it returns to
the pool when CuPy drops the memory. ``use_cupy_allocator(None)`` restores CuPy's own pool.
"""

from __future__ import annotations

from typing import Any, Optional, Set

from gpukeeper import frameworks
from gpukeeper.errors import GpuError
from gpukeeper.memory import MemoryPool, Precision

__all__ = ["use_cupy_allocator", "restore_cupy_allocator"]


def _import_cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise GpuError("use_cupy_allocator() needs CuPy, which is not installed") from exc
    return cupy


def use_cupy_allocator(pool: Optional[MemoryPool] = None) -> MemoryPool:
    """Routes CuPy's device allocations through ``pool`` (a new device pool by default).

    Returns the pool, whose statistics then count CuPy's arrays. When the pool runs out
    of memory it first asks the other frameworks in the process (PyTorch's cache, other
    gpukeeper pools) to release theirs, then retries.
    """
    cupy = _import_cupy()
    if pool is None:
        pool = MemoryPool("device")
    elif pool.kind not in ("device", "async"):
        raise GpuError(f"CuPy needs device memory; this pool holds {pool.kind!r} memory")
    hooked: Set[int] = set()

    def reclaim(needed: int) -> int:
        released = 0
        for name, amount in frameworks.release_all_caches(None).items():
            if name != "cupy":
                released += amount
        return released

    def allocate(size: int) -> Any:
        device = cupy.cuda.runtime.getDevice()
        if device not in hooked:
            pool.add_reclaim_callback(device, reclaim)
            hooked.add(device)
        stream = cupy.cuda.get_current_stream().ptr
        buf = pool.get_managed_buffer(device, size, Precision.Uint8, stream)
        # The buffer is the memory's owner: CuPy keeps it alive as long as the memory.
        memory = cupy.cuda.UnownedMemory(buf.ptr, size, buf, device)
        return cupy.cuda.MemoryPointer(memory, 0)

    cupy.cuda.set_allocator(allocate)
    return pool


def restore_cupy_allocator() -> None:
    """Gives CuPy its own default memory pool back."""
    cupy = _import_cupy()
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)

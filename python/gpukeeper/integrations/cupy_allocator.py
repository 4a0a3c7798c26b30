"""CuPy's device allocations on a gpukeeper pool: ``use_cupy_allocator()``.

>>> pool = gpukeeper.use_cupy_allocator()
>>> a = cupy.zeros(1 << 20)
>>> pool.stats(0).allocated_bytes
8388608

Each CuPy allocation is one ``ManagedBuffer`` on the current CuPy stream; it returns to
the pool when CuPy drops the memory. ``restore_cupy_allocator()`` gives CuPy its own pool
back.

Requests behave as with CuPy's own pool: sizes are rounded up to CuPy's 512-byte unit
(``mem.size`` says so); 0 bytes (``cupy.empty(0)``, cuFFT plans) get a null pointer and
no memory; a request that cannot be served raises
``cupy.cuda.memory.OutOfMemoryError`` (also gpukeeper's ``AllocationError``) carrying
gpukeeper's full message, so CuPy's own handlers (and users') catch it.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Set

from gpukeeper import frameworks
from gpukeeper.base.errors import AllocationError, GpuError, InvalidInputError
from gpukeeper.pool.memory_pool import MemoryPool, Precision

# Larger requests are refused by the pool as input errors; CuPy's own pool calls them an
# out-of-memory (cudaMalloc fails), and so does this hook.
_MAX_REQUEST = 1 << 50
_UNIT = 512  # CuPy's allocation unit (cupy.cuda.memory's _round_size)
_oom_types: Dict[type, type] = {}

__all__ = ["use_cupy_allocator", "restore_cupy_allocator"]


def _import_cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise GpuError("use_cupy_allocator() needs CuPy, which is not installed") from exc
    return cupy


def _oom_type(cupy: Any) -> type:
    """CuPy's OutOfMemoryError, that is also gpukeeper's AllocationError (made once)."""
    base = cupy.cuda.memory.OutOfMemoryError
    made = _oom_types.get(base)
    if made is None:

        class PoolOutOfMemoryError(base, AllocationError):  # type: ignore[misc, valid-type]
            """A CuPy request the gpukeeper pool could not serve."""

            def __init__(
                self, size: int, total: int = -1, limit: int = 0, message: Optional[str] = None
            ) -> None:
                base.__init__(self, size, total, limit)
                if message is not None:
                    self.args = (message,)

            def __str__(self) -> str:
                return str(self.args[0]) if self.args else base.__str__(self)

            def __reduce__(self) -> Any:
                return (type(self), (self._size, self._total, self._limit, str(self)))

        # Importable by name, so that the error pickles (to another process, a log).
        PoolOutOfMemoryError.__module__ = __name__
        PoolOutOfMemoryError.__qualname__ = "PoolOutOfMemoryError"
        made = _oom_types[base] = PoolOutOfMemoryError
        globals()["PoolOutOfMemoryError"] = made
    return made


def use_cupy_allocator(pool: Optional[MemoryPool] = None) -> MemoryPool:
    """Routes CuPy's device allocations through ``pool`` (a new device pool by default).

    Returns the pool, whose statistics then count CuPy's arrays. When the pool runs out
    of memory it first asks the other frameworks in the process (PyTorch's cache, other
    gpukeeper pools) to release theirs, then retries. Allocations made while the current
    stream captures a CUDA graph (``Stream.begin_capture``) come from a pool of that
    capture's own, kept from other work until the graph is destroyed
    (``pool.capture_pools(device)``).
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

    oom_type = _oom_type(cupy)
    memory_module = cupy.cuda.memory

    def allocate(size: int) -> Any:
        if size == 0:
            # CuPy's pool: no memory and a null pointer, on the current device.
            return memory_module.MemoryPointer(memory_module.Memory(0), 0)
        device = cupy.cuda.runtime.getDevice()
        if device not in hooked:
            pool.add_reclaim_callback(device, reclaim)
            hooked.add(device)
        stream = cupy.cuda.get_current_stream().ptr
        # CuPy's pool hands out whole 512-byte units and says so in mem.size; CuPy code
        # relies on it (its own tests fill the whole unit), so this hook does the same.
        rounded = (size + _UNIT - 1) // _UNIT * _UNIT
        try:
            buf = pool.get_managed_buffer(device, rounded, Precision.Uint8, stream)
        except AllocationError as exc:
            stats = pool.stats(device)
            assert stats is not None  # the pool has just refused a request on this device
            raise oom_type(size, stats.allocated_bytes, stats.limit_bytes, str(exc)) from None
        except InvalidInputError as exc:
            if size <= _MAX_REQUEST:
                raise
            raise oom_type(size, -1, 0, str(exc)) from None
        # The buffer is the memory's owner: CuPy keeps it alive as long as the memory.
        memory = cupy.cuda.UnownedMemory(buf.ptr, rounded, buf, device)
        return cupy.cuda.MemoryPointer(memory, 0)

    cupy.cuda.set_allocator(allocate)
    return pool


def restore_cupy_allocator() -> None:
    """Gives CuPy its own default memory pool back."""
    cupy = _import_cupy()
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)

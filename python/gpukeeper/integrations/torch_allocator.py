"""PyTorch's CUDA allocations on gpukeeper's pool: ``use_torch_allocator()``.

>>> import gpukeeper
>>> gpukeeper.use_torch_allocator()        # before the first CUDA tensor
>>> x = torch.randn(1024, 1024, device="cuda")
>>> gpukeeper.integrations.torch_allocator.stats(0).allocated_bytes
4194304

Under a pluggable allocator PyTorch's own ``memory_allocated()`` and ``memory_stats()``
report nothing; gpukeeper's statistics (``stats``), ``memory_report`` and ``GPUContext``
read this pool instead. ``torch.cuda.empty_cache()`` does not reach the pool either:
use ``release()`` (``cleanup_cuda`` and ``GPUContext`` do).
"""

from __future__ import annotations

import sys
from typing import Optional, Tuple

from gpukeeper import _core, frameworks
from gpukeeper._core import PoolStats
from gpukeeper.errors import GpuError

__all__ = ["use_torch_allocator", "is_active", "stats", "pool_usage", "release"]

_active = False


def _reclaim(needed: int) -> int:
    """Run when a torch pool is out of memory: other frameworks drop their caches."""
    released = 0
    for name, amount in frameworks.release_all_caches(None).items():
        if name != "torch":  # our own pool already released its cache before asking
            released += amount
    return released


def use_torch_allocator() -> None:
    """Routes PyTorch's CUDA allocations through gpukeeper's caching pool.

    Must run before PyTorch allocates CUDA memory (its allocator cannot be swapped once
    used): raises ``GpuError`` saying so otherwise, and when PyTorch has no CUDA. Calling
    it again once active does nothing.
    """
    global _active
    if _active:
        return
    import torch

    if not torch.cuda.is_available():
        raise GpuError("use_torch_allocator(): PyTorch sees no CUDA device "
                       f"(torch {torch.__version__}, CUDA build: {torch.version.cuda})")
    malloc_name, free_name = _core._torch_malloc_symbols()
    allocator = torch.cuda.memory.CUDAPluggableAllocator(_core.__file__, malloc_name, free_name)
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as exc:
        raise GpuError(
            "use_torch_allocator() must run before the first CUDA tensor is made: PyTorch's "
            f"caching allocator is already in use ({exc})"
        ) from exc
    _core._set_torch_reclaim(_reclaim)
    _active = True


def is_active() -> bool:
    """Whether PyTorch allocates through gpukeeper in this process."""
    return _active


def stats(device: int = 0) -> Optional[PoolStats]:
    """Statistics of the pool behind PyTorch on ``device`` (None before its first use)."""
    return _core._torch_pool_stats(device)


def pool_usage(device: int = 0) -> Tuple[int, int]:
    """(allocated, reserved) bytes of the pool behind PyTorch on ``device``."""
    s = stats(device)
    return (0, 0) if s is None else (s.allocated_bytes, s.reserved_bytes)


def release(device: Optional[int] = None) -> int:
    """Returns the cached memory of the pools behind PyTorch to the driver; bytes."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the pool also waits for its streams; this covers others
    return int(_core._torch_pool_cleanup(-1 if device is None else device))

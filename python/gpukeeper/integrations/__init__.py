"""gpukeeper inside other frameworks: PyTorch's and CuPy's allocations on the pool."""

from gpukeeper.integrations.cupy_allocator import restore_cupy_allocator, use_cupy_allocator
from gpukeeper.integrations.torch_allocator import use_torch_allocator

__all__ = ["use_torch_allocator", "use_cupy_allocator", "restore_cupy_allocator"]

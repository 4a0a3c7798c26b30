"""gpukeeper keeps GPU memory and GPU time honest.

A caching memory pool with RAII buffers, pressure handling and one account of the
device, usable from PyTorch and CuPy, and working (on host memory) without a GPU.
"""

__version__ = "0.1.0"

from gpukeeper.errors import AllocationError, DeviceError, GpuError, InvalidInputError
from gpukeeper.memory import BufferBatch, ManagedBuffer, MemoryPool, PoolStats, Precision
from gpukeeper.runtime import CudaAvailability, build_info, cuda_available

__all__ = [
    "__version__",
    "AllocationError",
    "BufferBatch",
    "CudaAvailability",
    "DeviceError",
    "GpuError",
    "InvalidInputError",
    "ManagedBuffer",
    "MemoryPool",
    "PoolStats",
    "Precision",
    "build_info",
    "cuda_available",
]

"""gpukeeper keeps GPU memory and GPU time honest.

A caching memory pool with RAII buffers, pressure handling and one account of the
device; cleanup that really returns memory; PyTorch and CuPy allocating on the pool.
Everything works (on host memory) without a GPU.
"""

__version__ = "0.1.0"

from gpukeeper.cleanup import (
    CleanupReport,
    GPUContext,
    cleanup_cuda,
    cleanup_models,
    install_exit_guard,
    uninstall_exit_guard,
)
from gpukeeper.errors import (
    AllocationError,
    DeviceError,
    EmptiedObjectError,
    GpuError,
    InvalidInputError,
    MemoryLeakError,
)
from gpukeeper.integrations import restore_cupy_allocator, use_cupy_allocator, use_torch_allocator
from gpukeeper.manager import (
    FaissUnavailableError,
    GPUMemoryManager,
    calculate_faiss_temp_memory,
    create_faiss_gpu_resources,
    create_faiss_index,
    get_gpu_memory_manager,
)
from gpukeeper.memory import BufferBatch, ManagedBuffer, MemoryPool, PoolStats, Precision
from gpukeeper.oom import retry_on_oom
from gpukeeper.report import MemoryReport, memory_report, memory_reports
from gpukeeper.runtime import CudaAvailability, build_info, cuda_available

__all__ = [
    "__version__",
    # memory (seed 001)
    "BufferBatch",
    "ManagedBuffer",
    "MemoryPool",
    "PoolStats",
    "Precision",
    # errors
    "AllocationError",
    "DeviceError",
    "EmptiedObjectError",
    "GpuError",
    "InvalidInputError",
    "MemoryLeakError",
    # cleanup (seed 000)
    "CleanupReport",
    "GPUContext",
    "cleanup_cuda",
    "cleanup_models",
    "install_exit_guard",
    "uninstall_exit_guard",
    # one account of the device (seeds 002, 003)
    "FaissUnavailableError",
    "GPUMemoryManager",
    "MemoryReport",
    "calculate_faiss_temp_memory",
    "create_faiss_gpu_resources",
    "create_faiss_index",
    "get_gpu_memory_manager",
    "memory_report",
    "memory_reports",
    "retry_on_oom",
    # frameworks on the pool
    "restore_cupy_allocator",
    "use_cupy_allocator",
    "use_torch_allocator",
    # build and run time
    "CudaAvailability",
    "build_info",
    "cuda_available",
]

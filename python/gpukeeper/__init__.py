"""gpukeeper keeps GPU memory and GPU time honest.

A caching memory pool with RAII buffers, pressure handling and one account of the
device; cleanup that really returns memory; PyTorch and CuPy allocating on the pool;
timing and benchmarking (down to MD trajectories) that are right on an asynchronous GPU.
Everything works (on host memory) without a GPU.
"""

__version__ = "0.1.0"

from typing import Any

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
from gpukeeper.device import (
    check_memory_leak,
    get_device,
    get_gpu_info,
    get_gpu_memory_info,
    warmup_cuda,
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
from gpukeeper.md import TrajectoryResult, benchmark_md_trajectory
from gpukeeper.memory import BufferBatch, ManagedBuffer, MemoryPool, PoolStats, Precision
from gpukeeper.oom import retry_on_oom
from gpukeeper.report import MemoryReport, memory_report, memory_reports
from gpukeeper.report_devices import DevicesReport
from gpukeeper.runtime import CudaAvailability, build_info, cuda_available
from gpukeeper.timing import (
    BenchmarkResult,
    CUDATimer,
    ImplementationComparison,
    ProfilerContext,
    benchmark_function,
    compare_implementations,
    print_comparison_table,
)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpukeeper``: registers ``%gpu_timeit``, ``%%gpu_memory`` and
    ``%gpu_report`` (see :mod:`gpukeeper.ipython`, imported only now)."""
    from gpukeeper.ipython import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext gpukeeper``: removes the magics again."""
    from gpukeeper.ipython import unload_ipython_extension as unload

    unload(ipython)


__all__ = [
    "__version__",
    # memory
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
    # cleanup
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
    "DevicesReport",
    "memory_report",
    "memory_reports",
    "retry_on_oom",
    # frameworks on the pool
    "restore_cupy_allocator",
    "use_cupy_allocator",
    "use_torch_allocator",
    # device utilities and timing (seeds 002, 004)
    "BenchmarkResult",
    "CUDATimer",
    "ImplementationComparison",
    "ProfilerContext",
    "TrajectoryResult",
    "benchmark_function",
    "benchmark_md_trajectory",
    "check_memory_leak",
    "compare_implementations",
    "get_device",
    "get_gpu_info",
    "get_gpu_memory_info",
    "print_comparison_table",
    "warmup_cuda",
    # build and run time
    "CudaAvailability",
    "build_info",
    "cuda_available",
]

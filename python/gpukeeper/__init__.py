"""gpukeeper keeps GPU memory and GPU time honest.

A caching memory pool with RAII buffers, pressure handling and one account of the
device; cleanup that really returns memory; PyTorch and CuPy allocating on the pool;
timing and benchmarking (down to MD trajectories) that are right on an asynchronous GPU.
Everything works (on host memory) without a GPU.
"""

import sys
from typing import Any

from gpukeeper.account import device_utils, faiss_helpers, memory_manager
from gpukeeper.account.account_reader import memory_report, memory_reports
from gpukeeper.account.device_account import MemoryReport
from gpukeeper.account.device_utils import (
    check_memory_leak,
    get_device,
    get_gpu_info,
    get_gpu_memory_info,
    warmup_cuda,
)
from gpukeeper.account.memory_manager import (
    FaissUnavailableError,
    GPUMemoryManager,
    calculate_faiss_temp_memory,
    create_faiss_gpu_resources,
    create_faiss_index,
    get_gpu_memory_manager,
)
from gpukeeper.account.process_account import DevicesReport
from gpukeeper.base.errors import (
    AllocationError,
    DeviceError,
    EmptiedObjectError,
    GpuError,
    InvalidInputError,
    MemoryLeakError,
)
from gpukeeper.base.runtime import CudaAvailability, __version__, build_info, cuda_available
from gpukeeper.cleanup import (
    CleanupReport,
    GPUContext,
    cleanup_cuda,
    cleanup_models,
    install_exit_guard,
    uninstall_exit_guard,
)
from gpukeeper.integrations import restore_cupy_allocator, use_cupy_allocator, use_torch_allocator
from gpukeeper.md import TrajectoryResult, benchmark_md_trajectory
from gpukeeper.pool import memory_pool, oom_retry
from gpukeeper.pool.memory_pool import BufferBatch, ManagedBuffer, MemoryPool, PoolStats, Precision
from gpukeeper.pool.oom_retry import retry_on_oom
from gpukeeper.timing import (
    BenchmarkResult,
    CUDATimer,
    ImplementationComparison,
    ProfilerContext,
    benchmark_function,
    compare_implementations,
    print_comparison_table,
)

# The helper modules' code that gpukeeper grew from imports these five paths (the table in
# docs/getting-started.md), so each stays importable as a name for the module that holds it.
for _old, _module in {
    "device": device_utils,
    "faiss_helpers": faiss_helpers,
    "manager": memory_manager,
    "memory": memory_pool,
    "oom": oom_retry,
}.items():
    sys.modules[f"{__name__}.{_old}"] = _module
    globals()[_old] = _module
del _old, _module


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
    # one account of the device
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
    # device utilities and timing
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

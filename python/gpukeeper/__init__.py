"""gpukeeper keeps GPU memory and GPU time honest.

A caching memory pool with RAII buffers, pressure handling and one account of the
device; cleanup that really returns memory; PyTorch and CuPy allocating on the pool;
timing and benchmarking (down to MD trajectories) that are right on an asynchronous GPU.
Everything works (on host memory) without a GPU.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from typing import Any

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

# Former module paths (before the package's layer folders): each still imports, as the
# module that holds its code now, with a DeprecationWarning naming that module, until the
# next release. The requirements import their names from `gpukeeper` and
# `gpukeeper.cleanup`, never through these paths.
_FORMER_PATHS = {
    "device": "gpukeeper.account.device_utils",
    "faiss_helpers": "gpukeeper.account.faiss_helpers",
    "manager": "gpukeeper.account.memory_manager",
    "memory": "gpukeeper.pool.memory_pool",
    "oom": "gpukeeper.pool.oom_retry",
}


def _former_path_warning(old: str) -> None:
    new = _FORMER_PATHS[old]
    warnings.warn(
        f"gpukeeper.{old} is deprecated and goes in the next release: import {new} "
        "(or the names from gpukeeper itself)",
        DeprecationWarning,
        stacklevel=3,
    )


class _FormerPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import gpukeeper.<former>``: warns, then hands the importer the moved module."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        package, _, old = fullname.rpartition(".")
        if package != __name__ or old not in _FORMER_PATHS:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> None:
        return None  # a placeholder, replaced in exec_module

    def exec_module(self, module: types.ModuleType) -> None:
        old = module.__name__.rpartition(".")[2]
        _former_path_warning(old)
        # The import system returns what sys.modules holds once this returns: the moved
        # module itself, so that both paths name one module object.
        sys.modules[module.__name__] = importlib.import_module(_FORMER_PATHS[old])


if not any(isinstance(f, _FormerPathFinder) for f in sys.meta_path):
    sys.meta_path.append(_FormerPathFinder())


def __getattr__(name: str) -> Any:
    """``gpukeeper.<former>`` as an attribute: warns, then gives the moved module."""
    if name in _FORMER_PATHS:
        _former_path_warning(name)
        return importlib.import_module(_FORMER_PATHS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

"""build_info() and cuda_available(): what was built and what the machine offers."""

from __future__ import annotations

import re

import pytest
from torch_cuda import torch_cuda

import gpukeeper
from gpukeeper import CudaAvailability, MemoryPool, build_info, cuda_available
from gpukeeper import _core


def test_public_names():
    for name in gpukeeper.__all__:
        assert hasattr(gpukeeper, name), name
    for name in (
        "MemoryPool",
        "ManagedBuffer",
        "BufferBatch",
        "Precision",
        "GpuError",
        "InvalidInputError",
        "AllocationError",
        "DeviceError",
        "build_info",
        "cuda_available",
    ):
        assert name in gpukeeper.__all__
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", gpukeeper.__version__)


def test_build_info_keys_and_types():
    info = build_info()
    assert isinstance(info["cuda"], bool)
    assert isinstance(info["static_cudart"], bool)
    assert isinstance(info["compiler"], str) and info["compiler"]
    assert isinstance(info["cxx_standard"], int) and info["cxx_standard"] >= 201703
    assert isinstance(info["build_type"], str) and info["build_type"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", info["pybind11_version"])
    assert info["version"] == gpukeeper.__version__
    if info["cuda"]:
        assert re.fullmatch(r"\d+\.\d+", info["cuda_version"])
    else:
        assert info["cuda_version"] is None
        assert info["static_cudart"] is False


def test_build_info_returns_a_fresh_dict():
    a = build_info()
    a["cuda"] = "changed"
    assert build_info()["cuda"] != "changed"


def test_cuda_available_is_consistent():
    status = cuda_available()
    assert isinstance(status, CudaAvailability)
    assert bool(status) is status.available
    assert isinstance(status.reason, str)
    assert status.device_count == _core.cuda_device_count()
    again = cuda_available()
    assert (again.available, again.device_count, again.reason) == (
        status.available,
        status.device_count,
        status.reason,
    )
    if status.available:
        assert status.device_count >= 1
        assert status.runtime_version > 0 and status.driver_version > 0
        assert "True" in repr(status)
        assert build_info()["cuda"] is True
    else:
        assert status.device_count == 0
        assert status.reason.strip(), "cuda_available() is False but gives no reason"
        assert status.reason in repr(status)
        assert "False" in repr(status)


def test_cuda_unavailable_reason_explains_cpu_build():
    status = cuda_available()
    if status:
        pytest.skip("CUDA is available")
    if not build_info()["cuda"]:
        assert "without CUDA" in status.reason, status.reason


def test_auto_pool_matches_availability():
    status = cuda_available()
    pool = MemoryPool()
    assert pool.kind == ("device" if status else "host")
    assert pool.device_count == (status.device_count if status else 1)


def test_host_memory_info():
    free, total = _core.host_memory_info()
    assert 0 < free <= total


def test_device_memory_info():
    if not cuda_available():
        with pytest.raises(gpukeeper.GpuError):
            _core.device_memory_info(0)
        return
    free, total = _core.device_memory_info(0)
    assert 0 < free <= total
    with pytest.raises(gpukeeper.GpuError):
        _core.device_memory_info(cuda_available().device_count + 5)


@pytest.mark.gpu
def test_device_memory_info_matches_torch():
    torch = torch_cuda()
    _, total = _core.device_memory_info(0)
    assert total == torch.cuda.mem_get_info(0)[1]

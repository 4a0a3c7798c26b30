"""Device utilities (the GPU fundamentals guide and the MLFF utilities): every function in CPU mode with real work; GPU
tests run only where CUDA is usable."""

from __future__ import annotations

import numpy as np
import pytest

import gpukeeper
from gpukeeper.account import device_utils as dev
from gpukeeper.base.errors import InvalidInputError

CUDA = gpukeeper.cuda_available()
gpu = pytest.mark.skipif(not CUDA, reason=f"no usable CUDA device: {CUDA.reason}")
cpu_only = pytest.mark.skipif(bool(CUDA), reason="CPU-mode behaviour")


@cpu_only
def test_get_device_falls_back_to_cpu() -> None:
    d = dev.get_device()
    assert str(d) == "cpu"


def test_get_device_is_torch_device_when_torch_loaded() -> None:
    torch = pytest.importorskip("torch")
    assert isinstance(dev.get_device(), torch.device)
    assert dev.get_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", 1.5, True, object()])
def test_get_device_rejects_malformed(bad: object) -> None:
    with pytest.raises(InvalidInputError):
        dev.get_device(bad)


@cpu_only
def test_cuda_device_without_cuda_is_typed_error() -> None:
    with pytest.raises(InvalidInputError, match="CUDA"):
        dev.get_device("cuda:0")


@cpu_only
def test_gpu_info_cpu_mode() -> None:
    info = dev.get_gpu_info()
    assert info["mode"] == "cpu" and info["cuda_available"] is False
    assert info["reason"]
    assert info["cpu_count"] >= 1 and info["total_memory_bytes"] > 0
    assert info["total_memory_gb"] == pytest.approx(info["total_memory_bytes"] / 2**30)


@cpu_only
def test_memory_info_cpu_mode_tracks_host_memory() -> None:
    before = dev.get_gpu_memory_info()
    for key in ("allocated", "reserved", "peak", "free", "total"):
        assert isinstance(before[key], float)
        assert before[f"{key}_bytes"] >= 0
        assert before[key] == pytest.approx(before[f"{key}_bytes"] / 2**30)
    assert before["mode"] == "cpu" and before["allocated_bytes"] > 0
    assert before["peak_bytes"] >= before["allocated_bytes"]
    assert before["total_bytes"] >= before["free_bytes"] > 0
    block = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, touched
    after = dev.get_gpu_memory_info()
    assert after["allocated_bytes"] - before["allocated_bytes"] > 48 << 20
    del block


@cpu_only
def test_check_memory_leak_cpu_mode() -> None:
    initial = dev.get_gpu_memory_info()["allocated"]
    # Clean work: temporaries freed each time.
    for _ in range(50):
        np.ones(1 << 18).sum()
    assert dev.check_memory_leak(initial, tolerance_mb=10.0) is True
    kept = [np.ones(1 << 20) for _ in range(5)]  # 40 MiB kept alive
    assert dev.check_memory_leak(initial, tolerance_mb=10.0) is False
    assert dev.check_memory_leak(initial, tolerance_mb=100.0) is True
    del kept


@pytest.mark.parametrize("bad", [("x", 10.0), (0.1, -1.0), (None, 1.0)])
def test_check_memory_leak_rejects_bad_input(bad: tuple) -> None:
    with pytest.raises(InvalidInputError):
        dev.check_memory_leak(*bad)


@cpu_only
def test_warmup_is_noop_on_cpu() -> None:
    assert dev.warmup_cuda() == 0.0
    with pytest.raises(InvalidInputError):
        dev.warmup_cuda(matmul_size=0)


def test_mlff_utilities_example() -> None:
    from gpukeeper.account.device_utils import get_device, get_gpu_memory_info, warmup_cuda

    get_device()
    warmup_cuda()
    mem_info = get_gpu_memory_info()
    assert f"GPU Memory: {mem_info['allocated']:.2f} GB".startswith("GPU Memory: ")


# --------------------------------------------------------------------- GPU


@gpu
def test_gpu_info_cuda() -> None:
    info = dev.get_gpu_info(0)
    assert info["mode"] == "cuda" and info["name"]
    assert info["total_memory_bytes"] > 0 and info["multiprocessors"] > 0
    assert info["compute_capability"] and "." in info["compute_capability"]
    assert info["driver_version"] and info["runtime_version"]


@gpu
def test_memory_info_and_leak_check_cuda() -> None:
    torch = pytest.importorskip("torch")
    assert dev.warmup_cuda() > 0.0
    initial = dev.get_gpu_memory_info()["allocated"]
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    info = dev.get_gpu_memory_info()
    assert info["mode"] == "cuda"
    assert info["allocated_bytes"] - int(initial * 2**30) >= 64 << 20
    assert info["reserved_bytes"] >= info["allocated_bytes"]
    assert info["total_bytes"] >= info["free_bytes"] > 0
    assert dev.check_memory_leak(initial, tolerance_mb=10.0) is False
    del x
    assert dev.check_memory_leak(initial, tolerance_mb=10.0) is True

"""One device vocabulary: every public entry point that takes a device treats a missing
device, a bad spelling and the CPU the same way (docs/architecture.md has the table)."""

from __future__ import annotations

from typing import Any, Callable, Dict

import pytest

import gpukeeper
from gpukeeper.base import device_names as devices
from gpukeeper.base.device_names import DeviceSpec, parse_device, resolve_device
from gpukeeper.base.errors import InvalidInputError

COUNT = devices.cuda_status()[0]
#: A CUDA device that is not there: device 0 without CUDA, one past the last with it.
MISSING = COUNT


def _step(x: Any) -> Any:
    return x


# Each public entry point that takes a device, called with just that device.
ENTRY_POINTS: Dict[str, Callable[[Any], Any]] = {
    "get_device": lambda d: gpukeeper.get_device(d),
    "get_gpu_info": lambda d: gpukeeper.get_gpu_info(d),
    "get_gpu_memory_info": lambda d: gpukeeper.get_gpu_memory_info(d),
    "check_memory_leak": lambda d: gpukeeper.check_memory_leak(0.0, device=d),
    "warmup_cuda": lambda d: gpukeeper.warmup_cuda(d, iterations=0),
    "memory_report": lambda d: gpukeeper.memory_report(d, use_nvml=False),
    "get_gpu_memory_manager": lambda d: gpukeeper.get_gpu_memory_manager(d),
    "GPUContext": lambda d: gpukeeper.GPUContext(device=d),
    "cleanup_cuda": lambda d: gpukeeper.cleanup_cuda(d),
    "CUDATimer": lambda d: gpukeeper.CUDATimer(device=d),
    "benchmark_function": lambda d: gpukeeper.benchmark_function(_step, 1, n_calls=2, warmup=0, device=d),
    "benchmark_md_trajectory": lambda d: gpukeeper.benchmark_md_trajectory(
        _step, [1, 2], n_steps=2, warmup_steps=0, device=d),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_a_missing_cuda_device_is_an_invalid_input_everywhere(name):
    with pytest.raises(InvalidInputError, match="CUDA is unusable|does not exist"):
        ENTRY_POINTS[name](MISSING)
    with pytest.raises(InvalidInputError, match="CUDA is unusable|does not exist"):
        ENTRY_POINTS[name](f"cuda:{MISSING}")


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("bad", [-1, True, 1.5, "gpu", "cuda:x", "cpu:0"])
def test_a_bad_spelling_is_an_invalid_input_everywhere(name, bad):
    with pytest.raises(InvalidInputError):
        ENTRY_POINTS[name](bad)


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_the_cpu_is_accepted_everywhere(name):
    ENTRY_POINTS[name]("cpu")


@pytest.mark.skipif(COUNT > 0, reason="checks the fallback of a machine without CUDA")
@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_none_falls_back_to_the_cpu_without_cuda(name):
    ENTRY_POINTS[name](None)


@pytest.mark.parametrize(
    "spelling, parsed",
    [(None, ("auto", None)), ("auto", ("auto", None)), ("cpu", ("cpu", None)), (" CPU ", ("cpu", None)),
     ("cuda", ("cuda", None)), ("cuda:3", ("cuda", 3)), (2, ("cuda", 2))],
)
def test_parse_device_reads_every_spelling(spelling, parsed):
    assert parse_device(spelling) == parsed


def test_parse_device_reads_torch_and_cupy_devices():
    torch = pytest.importorskip("torch")
    assert parse_device(torch.device("cpu")) == ("cpu", None)
    assert parse_device(torch.device("cuda", 1)) == ("cuda", 1)
    assert parse_device(torch.device("cuda")) == ("cuda", None)
    with pytest.raises(InvalidInputError, match="CUDA device or the CPU"):
        parse_device(torch.device("meta"))

    class CupyDevice:
        id = 3

    assert parse_device(CupyDevice()) == ("cuda", 3)


def test_resolution_on_a_faked_machine(monkeypatch):
    monkeypatch.setattr(devices, "cuda_status", lambda: (2, ""))
    monkeypatch.setattr(devices, "current_cuda_index", lambda: 1)
    assert resolve_device(None) == DeviceSpec("cuda", 1)
    assert resolve_device("cuda") == DeviceSpec("cuda", 1)
    assert resolve_device(0) == DeviceSpec("cuda", 0)
    assert resolve_device("cpu").kind == "cpu"
    assert resolve_device(None, auto_cuda=False).kind == "cpu"
    with pytest.raises(InvalidInputError, match=r"device 2 does not exist \(2 CUDA device"):
        resolve_device(2)
    monkeypatch.setattr(devices, "cuda_status", lambda: (0, "no driver"))
    spec = resolve_device(None)
    assert spec.kind == "cpu" and "no driver" in spec.reason
    with pytest.raises(InvalidInputError, match="no driver"):
        resolve_device(0)


def test_the_message_names_the_argument():
    with pytest.raises(InvalidInputError, match="GPUContext device"):
        gpukeeper.GPUContext(device="gpu")


def test_cpu_timing_names_the_missing_cuda_before_the_frameworks(monkeypatch) -> None:
    # Timing's "auto" where no framework uses CUDA: with no CUDA at all, that is the cause
    # to act on; with CUDA present, the frameworks are.
    monkeypatch.setattr(devices, "cuda_status", lambda: (0, "No NVIDIA driver found"))
    assert resolve_device(None, auto_cuda=False).reason == "CUDA unavailable: No NVIDIA driver found"
    monkeypatch.setattr(devices, "cuda_status", lambda: (1, ""))
    assert resolve_device(None, auto_cuda=False).reason == "no loaded framework uses CUDA"

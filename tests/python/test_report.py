"""memory_report: one account of the device.

CPU tests use real host pools and the real report; the CUDA branch (NVML's process list,
the context figure, hidden PIDs, NVML failures, device matching) is also exercised here
through a fake ``pynvml`` module, so that its logic is checked without a GPU. Tests
marked ``gpu`` check the real figures on a device (PyTorch, CuPy, NVML).
"""

from __future__ import annotations

import json
import os
import sys
import types
from typing import Any, Dict, List

import engine_fakes
import pytest
from engine_fakes import fresh_nvml, install_nvml, proc  # noqa: F401  (fresh_nvml: a fixture)
from torch_cuda import torch_cuda

import gpukeeper
from gpukeeper import _core, frameworks
from gpukeeper.base import device_names as devices
from gpukeeper.account import account_reader as report
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.frameworks import FrameworkMemory
from gpukeeper.account.account_reader import memory_report
from gpukeeper.account.device_account import MemoryReport

CUDA = gpukeeper.cuda_available()
MiB = 1 << 20
GiB = 1 << 30
gpu = pytest.mark.skipif(not CUDA, reason=f"no usable CUDA device: {CUDA.reason}")


pytestmark = pytest.mark.usefixtures("fresh_nvml")  # some tests swap pynvml for a fake


# --------------------------------------------------------------------- host (any machine)


def test_host_pool_allocation_shows_up_in_the_report(pools):
    pool = pools("host")
    before = memory_report("cpu")
    base = before.frameworks.get("gpukeeper", FrameworkMemory("gpukeeper", 0, 0))
    buf = pool.get_managed_buffer(0, 8 * MiB, "uint8")
    try:
        after = memory_report("cpu")
        stats = pool.stats(0)
        assert after.frameworks["gpukeeper"].allocated - base.allocated == stats.allocated_bytes
        assert after.frameworks["gpukeeper"].reserved - base.reserved == stats.reserved_bytes
        assert stats.allocated_bytes >= 8 * MiB
        assert after.host["gpukeeper_pools_allocated_bytes"] == after.frameworks["gpukeeper"].allocated
    finally:
        buf.release()
    released = memory_report("cpu")
    assert released.frameworks["gpukeeper"].allocated == base.allocated


def test_host_report_sums_add_up(pools):
    pool = pools("host")
    bufs = [pool.get_managed_buffer(0, n, "fp32") for n in (1000, 70_000, 1 << 20)]
    try:
        r = memory_report("cpu")
        assert r.mode == "cpu" and r.device is None and r.memory_source == "host"
        assert r.frameworks_allocated_bytes == sum(m.allocated for m in r.frameworks.values())
        assert r.frameworks_reserved_bytes == sum(m.reserved for m in r.frameworks.values())
        assert r.frameworks_allocated_bytes <= r.frameworks_reserved_bytes
        assert r.used_bytes == r.total_bytes - r.free_bytes
        assert 0 < r.free_bytes <= r.total_bytes
        assert r.total_bytes == _core.host_memory_info()[1]
        assert r.context_and_libraries_bytes is None  # no device, no context
        assert r.other_processes == [] and r.other_processes_bytes == 0
        assert r.process_bytes is None or r.process_bytes > 0
        d = r.to_dict()
        assert d["used_bytes"] + d["free_bytes"] == d["total_bytes"]
    finally:
        for b in bufs:
            b.release()


def test_json_round_trip(pools):
    pool = pools("host")
    with pool.get_managed_buffer(0, 4096, "fp64"):
        r = memory_report("cpu")
    text = r.to_json()
    data = json.loads(text)
    assert data == r.to_dict()
    back = MemoryReport.from_dict(data)
    assert back == r
    assert back.to_dict() == data
    assert json.loads(r.to_json(indent=None)) == data


def test_table_is_readable(pools):
    pool = pools("host")
    with pool.get_managed_buffer(0, 3 * MiB, "uint8"):
        r = memory_report("cpu")
        text = str(r)
    assert text == r.table()
    assert "CPU mode" in text
    assert "gpukeeper host pools" in text
    assert "available" in text and "total" in text
    assert "NVML:" in text
    assert "MiB" in text or "GiB" in text
    assert len(text.splitlines()) >= 7


@pytest.mark.skipif(bool(CUDA), reason="checks the CPU-mode report of a machine without CUDA")
def test_without_cuda_every_device_is_cpu_mode():
    everything = memory_report()
    assert everything.mode == "cpu" and len(everything) == 1
    r = memory_report("auto")  # the current device: the host here
    assert r.mode == "cpu"
    assert any("CPU mode" in n and "CUDA unavailable" in n for n in r.notes)
    with pytest.raises(InvalidInputError, match="CUDA is unusable"):
        memory_report(3)  # a named GPU that is not there is an error, not the host
    all_reports = list(memory_report())
    assert len(all_reports) == 1 and all_reports[0].mode == "cpu"


def test_missing_nvml_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    r = memory_report("cpu")
    assert r.nvml.startswith("unavailable:")
    assert "nvidia-ml-py" in r.nvml
    assert report.nvml_status() == r.nvml


def test_use_nvml_false_is_said():
    r = memory_report("cpu", use_nvml=False)
    assert r.nvml == "disabled (use_nvml=False)"


@pytest.mark.parametrize("bad", [-1, True, 1.5, "gpu", "cuda:x", "cuda:-1", [0]])
def test_bad_device_is_invalid_input(bad):
    with pytest.raises(InvalidInputError):
        memory_report(bad)


@gpu
def test_nonexistent_device_is_invalid_input():
    with pytest.raises(InvalidInputError, match="does not exist"):
        memory_report(CUDA.device_count)


# --------------------------------------------------------------------- CUDA branch, faked


def FakeNvml(processes: List[Any], **kw: Any) -> Any:  # noqa: N802
    """pynvml with two devices and this report's processes (old pynvml's bytes name)."""
    return engine_fakes.FakeNvml(processes, count=2, name=b"Fake GPU", **kw)


@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretends to have 2 CUDA devices with PyTorch and gpukeeper holding memory."""
    memory: Dict[str, FrameworkMemory] = {
        "torch": FrameworkMemory("torch", 300 * MiB, 512 * MiB),
        "gpukeeper": FrameworkMemory("gpukeeper", 64 * MiB, 128 * MiB),
    }
    monkeypatch.setattr(devices, "cuda_status", lambda: (2, ""))
    monkeypatch.setattr(devices, "current_cuda_index", lambda: 0)
    monkeypatch.setattr(report, "_holds_context", lambda device: False)
    monkeypatch.setattr(frameworks, "memory_by_framework", lambda device=0: dict(memory))
    monkeypatch.setattr(_core, "device_memory_info", lambda device: (50 * GiB, 79 * GiB), raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return memory


def test_context_is_process_memory_minus_frameworks_reserved(monkeypatch, fake_cuda):
    me = os.getpid()
    fake = install_nvml(monkeypatch, FakeNvml([proc(me, 1200 * MiB), proc(1, 5 * GiB)]))
    r = memory_report("cuda")  # the current device
    assert r.mode == "cuda" and r.device == 0 and r.name == "Fake GPU"
    assert r.nvml == "ok (driver 999.99)"
    assert (r.total_bytes, r.free_bytes, r.memory_source) == (fake.total, fake.free, "nvml")
    assert r.frameworks_reserved_bytes == 640 * MiB
    assert r.process_bytes == 1200 * MiB
    assert r.context_and_libraries_bytes == 1200 * MiB - 640 * MiB
    assert r.this_process == f"found (pid {me})"
    assert [p.pid for p in r.other_processes] == [1]
    assert r.other_processes_bytes == 5 * GiB
    table = str(r)
    assert "CUDA context + libraries" in table and "560.0 MiB" in table
    assert "pid 1 " in table
    assert MemoryReport.from_dict(json.loads(r.to_json())) == r


def test_hidden_pids_make_this_process_unknown(monkeypatch, fake_cuda):
    # In a container NVML lists host PIDs: ours is not among them, and theirs do not
    # exist here. The report must not guess which one is this process.
    install_nvml(monkeypatch, FakeNvml([proc(4_000_001, 900 * MiB), proc(4_000_002, 2 * GiB)]))
    r = memory_report(0)
    assert r.this_process.startswith("unknown")
    assert r.process_bytes is None
    assert r.context_and_libraries_bytes is None
    assert r.other_processes_bytes is None
    assert len(r.other_processes) == 2 and all(p.name is None for p in r.other_processes)
    assert "unknown" in str(r)


def test_pid_clash_across_namespaces_is_unknown(monkeypatch, fake_cuda):
    # Our container PID is listed, but with less than our frameworks reserved (640 MiB):
    # that entry is a host process that happens to have the same number.
    install_nvml(monkeypatch, FakeNvml([proc(os.getpid(), 100 * MiB)]))
    r = memory_report(0)
    assert r.this_process.startswith("unknown")
    assert r.process_bytes is None and r.context_and_libraries_bytes is None
    assert [p.used_bytes for p in r.other_processes] == [100 * MiB]  # listed, not hidden
    assert r.other_processes_bytes is None


def test_process_without_context_is_not_listed(monkeypatch, fake_cuda):
    fake_cuda["torch"] = FrameworkMemory("torch", 0, 0)
    fake_cuda["gpukeeper"] = FrameworkMemory("gpukeeper", 0, 0)
    install_nvml(monkeypatch, FakeNvml([proc(1, 3 * GiB)]))
    r = memory_report(0)
    assert r.process_bytes == 0
    assert r.this_process.startswith("not listed")
    assert r.other_processes_bytes == 3 * GiB


def test_context_without_memory_but_not_listed_is_unknown(monkeypatch, fake_cuda):
    fake_cuda["torch"] = FrameworkMemory("torch", 0, 0)
    fake_cuda["gpukeeper"] = FrameworkMemory("gpukeeper", 0, 0)
    monkeypatch.setattr(report, "_holds_context", lambda device: device == 0)
    install_nvml(monkeypatch, FakeNvml([proc(1, 3 * GiB)]))
    assert memory_report(0).this_process.startswith("unknown")
    assert memory_report(1).this_process.startswith("not listed")


def test_nvml_process_query_failure_is_a_note(monkeypatch, fake_cuda):
    fake = install_nvml(monkeypatch, FakeNvml([proc(os.getpid(), GiB)]))
    fake.fail_processes = True
    r = memory_report(0)
    assert r.memory_source == "nvml"  # memory info still works
    assert r.process_bytes is None and r.context_and_libraries_bytes is None
    assert any("nvmlDeviceGetComputeRunningProcesses failed" in n for n in r.notes)
    assert r.this_process.startswith("unknown")


def test_nvml_init_failure_falls_back_to_cuda_mem_get_info(monkeypatch, fake_cuda):
    fake = FakeNvml([])
    fake.fail_init = True
    install_nvml(monkeypatch, fake)
    r = memory_report(1)
    assert r.nvml.startswith("unavailable: nvmlInit failed")
    assert (r.free_bytes, r.total_bytes, r.memory_source) == (50 * GiB, 79 * GiB, "cudaMemGetInfo")
    assert r.frameworks_reserved_bytes == 640 * MiB  # the frameworks are still read
    assert r.process_bytes is None and r.other_processes == []


def test_nvml_missing_on_a_gpu_machine(monkeypatch, fake_cuda):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    r = memory_report(0)
    assert "nvidia-ml-py" in r.nvml
    assert r.memory_source == "cudaMemGetInfo"
    assert r.this_process.startswith("unknown")
    assert "nvidia-ml-py" in r.this_process


def test_nvml_unknown_process_memory(monkeypatch, fake_cuda):
    install_nvml(monkeypatch, FakeNvml([proc(os.getpid(), None)]))
    r = memory_report(0)
    assert r.process_bytes is None
    assert "does not report" in r.this_process
    assert r.context_and_libraries_bytes is None


def test_framework_without_reserved_figure(monkeypatch, fake_cuda):
    fake_cuda["jax"] = FrameworkMemory("jax", 10 * MiB, None)
    install_nvml(monkeypatch, FakeNvml([proc(os.getpid(), GiB)]))
    r = memory_report(0)
    assert r.frameworks_reserved_bytes is None
    assert r.context_and_libraries_bytes is None
    assert any("jax" in n for n in r.notes)


def test_cuda_visible_devices_maps_to_nvml_index(monkeypatch, fake_cuda):
    fake = install_nvml(monkeypatch, FakeNvml([proc(os.getpid(), GiB)]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    memory_report(0)
    assert fake.by_index == [1]
    memory_report(1)
    assert fake.by_index == [1, 0]


def test_cuda_visible_devices_uuid_prefix(monkeypatch, fake_cuda):
    install_nvml(monkeypatch, FakeNvml([proc(os.getpid(), GiB)]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-fake1")
    r = memory_report(0)
    assert any("GPU-fake1" in n for n in r.notes)


def test_compute_and_graphics_process_counted_once(monkeypatch, fake_cuda):
    me = os.getpid()
    fake = install_nvml(monkeypatch, FakeNvml([proc(me, GiB), proc(1, 2 * GiB)]))
    fake.graphics = [proc(1, 2 * GiB), proc(me, GiB)]
    r = memory_report(0)
    assert r.process_bytes == GiB
    assert [(p.pid, p.used_bytes) for p in r.other_processes] == [(1, 2 * GiB)]
    assert r.other_processes_bytes == 2 * GiB


def test_all_devices(monkeypatch, fake_cuda):
    install_nvml(monkeypatch, FakeNvml([proc(os.getpid(), GiB)]))
    reports = list(memory_report())
    assert [r.device for r in reports] == [0, 1]
    everything = memory_report()  # the same devices, with their totals
    assert [r.device for r in everything] == [0, 1] and everything.mode == "cuda"
    assert everything.process_bytes == 2 * GiB  # NVML's 1 GiB on each of the two devices


def test_device_spellings(monkeypatch, fake_cuda):
    install_nvml(monkeypatch, FakeNvml([]))
    assert memory_report("cuda:1").device == 1
    assert memory_report("cuda").device == 0
    assert memory_report(types.SimpleNamespace(type="cuda", index=1)).device == 1
    assert memory_report("cpu").mode == "cpu"
    with pytest.raises(InvalidInputError, match="does not exist"):
        memory_report(2)


# --------------------------------------------------------------------- real GPU


@gpu
def test_torch_tensor_shows_in_torch_allocated():
    torch = torch_cuda()
    torch.zeros(1, device="cuda:0")  # initialise torch's CUDA state first
    before = memory_report(0).frameworks["torch"]
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda:0")
    try:
        after = memory_report(0).frameworks["torch"]
        assert after.allocated - before.allocated == 64 * MiB
        assert after.reserved >= after.allocated
    finally:
        del x
    assert memory_report(0).frameworks["torch"].allocated == before.allocated


@gpu
def test_context_and_libraries_is_positive_and_plausible():
    torch = torch_cuda()
    x = torch.ones(1024, 1024, device="cuda:0")
    y = x @ x  # loads cuBLAS
    torch.cuda.synchronize()
    r = memory_report(0)
    if not r.nvml.startswith("ok"):
        pytest.skip(f"NVML: {r.nvml}")
    if r.this_process.startswith("unknown"):
        pytest.skip(f"this process is not in NVML's list: {r.this_process}")
    assert r.process_bytes is not None and r.process_bytes >= r.frameworks_reserved_bytes
    ctx = r.context_and_libraries_bytes
    assert ctx is not None and 0 < ctx < 2 * GiB, str(r)
    del x, y


@gpu
def test_free_used_total_are_consistent():
    r = memory_report(0)
    assert r.mode == "cuda"
    assert 0 < r.free_bytes <= r.total_bytes
    assert r.free_bytes + r.used_bytes == r.total_bytes
    free, total = _core.device_memory_info(r.device)
    # NVML counts the whole board, cudaMemGetInfo what CUDA can use: within a few %.
    assert abs(total - r.total_bytes) <= 0.05 * total
    assert MemoryReport.from_dict(json.loads(r.to_json())) == r


@gpu
def test_gpukeeper_device_pool_shows_up(pools):
    pool = pools("device")
    before = memory_report(0).frameworks.get("gpukeeper", FrameworkMemory("gpukeeper", 0, 0))
    buf = pool.get_managed_buffer(0, 32 * MiB, "uint8")
    try:
        after = memory_report(0).frameworks["gpukeeper"]
        assert after.allocated - before.allocated == pool.stats(0).allocated_bytes >= 32 * MiB
    finally:
        buf.release()


@gpu
def test_cupy_array_shows_in_cupy_allocated():
    cupy = pytest.importorskip("cupy")
    with cupy.cuda.Device(0):
        cupy.zeros(1, dtype=cupy.uint8)
        before = memory_report(0).frameworks["cupy"]
        a = cupy.empty(16 * MiB, dtype=cupy.uint8)
        after = memory_report(0).frameworks["cupy"]
        assert after.allocated - before.allocated == 16 * MiB
        del a
        cupy.get_default_memory_pool().free_all_blocks()


@gpu
def test_without_nvml_on_gpu_fills_what_it_can():
    r = memory_report(0, use_nvml=False)
    assert r.mode == "cuda" and r.memory_source == "cudaMemGetInfo"
    assert r.process_bytes is None and r.context_and_libraries_bytes is None
    assert r.nvml == "disabled (use_nvml=False)"
    assert 0 < r.free_bytes <= r.total_bytes

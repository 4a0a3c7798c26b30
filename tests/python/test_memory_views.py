"""get_gpu_memory_info and GPUMemoryManager.get_memory_info as views of memory_report: the
same figures, on the host and on a faked CUDA device, and memory_report's lean details."""

from __future__ import annotations

import sys
import types

import engine_fakes
import pytest
from engine_fakes import GiB, MiB, fresh_nvml  # noqa: F401 (a fixture)

import gpukeeper
from gpukeeper import _core, frameworks
from gpukeeper.account.device_account import MemoryReport
from gpukeeper.account.memory_manager import GPUMemoryManager
from gpukeeper.base import host_memory
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.frameworks import pools_adapter


@pytest.fixture
def still_host(monkeypatch):
    """The host's figures held still, so that two reads give the same numbers."""
    monkeypatch.setattr(_core, "host_memory_info", lambda: (6 * GiB, 16 * GiB))
    monkeypatch.setattr(host_memory, "current_rss_bytes", lambda: 300 * MiB)
    monkeypatch.setattr(host_memory, "malloc_in_use_bytes", lambda: 120 * MiB)
    monkeypatch.setattr(host_memory, "peak_rss_bytes", lambda: 500 * MiB)


@pytest.fixture
def faked_device(monkeypatch, fresh_nvml):  # noqa: F811
    """CUDA device 0 faked: PyTorch holds 4 MiB (20 MiB reserved, a peak of 20 MiB),
    NVML gives 60 of 80 GiB free; no gpukeeper pool."""
    monkeypatch.setitem(sys.modules, "torch", engine_fakes.FakeTorch(4 * MiB, 20 * MiB))
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    monkeypatch.setattr(pools_adapter, "live_pools", lambda: [])
    engine_fakes.install_driver(monkeypatch, engine_fakes.FakeDriver({0: True}))
    engine_fakes.install_nvml(monkeypatch, engine_fakes.FakeNvml(used=GiB))


def test_host_view_is_the_counters_report(still_host) -> None:
    info = gpukeeper.get_gpu_memory_info("cpu")
    report = gpukeeper.memory_report("cpu", detail="counters")
    assert report.detail == "counters" and report.mode == "cpu"
    assert info["allocated_bytes"] == report.host["malloc_in_use_bytes"] == 120 * MiB
    assert info["reserved_bytes"] == report.process_bytes == 300 * MiB
    assert info["peak_bytes"] == report.host["peak_rss_bytes"] == 500 * MiB
    assert (info["free_bytes"], info["total_bytes"]) == (report.free_bytes, report.total_bytes)
    assert info["host_pools_allocated_bytes"] == report.host["gpukeeper_pools_allocated_bytes"]
    assert info["source"] == "malloc_in_use" and info["allocated"] == 120 * MiB / GiB


def test_host_view_falls_back_to_the_resident_set(still_host, monkeypatch) -> None:
    monkeypatch.setattr(host_memory, "malloc_in_use_bytes", lambda: None)
    info = gpukeeper.get_gpu_memory_info("cpu")
    assert info["source"] == "process_rss" and info["allocated_bytes"] == 300 * MiB


def test_cpu_manager_view_is_the_device_report(still_host) -> None:
    manager = GPUMemoryManager(None, "test")
    used, available, total = manager.get_memory_info()
    report = manager.report(detail="device")
    assert (available, total) == (report.free_bytes / GiB, report.total_bytes / GiB) == (6, 16)
    assert used == report.used_bytes / GiB == 10
    assert manager.get_used_memory() == used and manager.get_total_memory() == total


def test_device_view_is_the_counters_report(faked_device) -> None:
    info = gpukeeper.get_gpu_memory_info(0)
    report = gpukeeper.memory_report(0, detail="counters")
    full = gpukeeper.memory_report(0)
    assert info["mode"] == "cuda" and info["device"] == 0
    assert info["allocated_bytes"] == report.frameworks_allocated_bytes == 4 * MiB
    assert info["reserved_bytes"] == report.frameworks_reserved_bytes == 20 * MiB
    assert info["peak_bytes"] == report.peak_allocated_bytes == 20 * MiB
    assert (info["free_bytes"], info["total_bytes"]) == (60 * GiB, 80 * GiB)
    assert info["free_total_source"] == report.memory_source == "nvml"
    assert info["frameworks"] == frameworks.memory_dict(report.frameworks)
    # The full report reads the same figures, and more.
    assert full.frameworks == report.frameworks and full.peaks == report.peaks
    assert (full.free_bytes, full.total_bytes) == (report.free_bytes, report.total_bytes)
    assert full.process_bytes == GiB and report.process_bytes is None
    assert report.this_process.startswith("unknown") and report.other_processes_bytes is None


def test_device_manager_view_is_the_device_report(faked_device) -> None:
    manager = GPUMemoryManager(0)
    used, available, total = manager.get_memory_info()
    report = gpukeeper.memory_report(0, detail="device")
    assert (used, available, total) == (20, 60, 80)
    assert (report.used_bytes, report.free_bytes, report.total_bytes) == (
        20 * GiB,
        60 * GiB,
        80 * GiB,
    )
    # Nothing of the frameworks was read: their sums are unknown, not zero.
    assert report.frameworks == {} and report.frameworks_allocated_bytes is None
    assert report.frameworks_reserved_bytes is None and "not read" in report.table()


def test_a_lean_detail_round_trips_and_a_bad_one_is_refused(faked_device) -> None:
    report = gpukeeper.memory_report(0, detail="device")
    again = MemoryReport.from_dict(report.to_dict())
    assert again.detail == "device" and again.frameworks_allocated_bytes is None
    old = report.to_dict()
    del old["detail"]  # a report written before the key existed
    assert MemoryReport.from_dict(old).detail == "full"
    every = gpukeeper.memory_report(detail="counters")
    assert [r.detail for r in every] == ["counters"]
    with pytest.raises(InvalidInputError, match="detail"):
        gpukeeper.memory_report(0, detail="some")


def test_torch_on_gpukeepers_pool_has_the_pools_peak(faked_device, monkeypatch) -> None:
    resets = []
    pool = types.SimpleNamespace(
        allocated_bytes=3 * MiB, reserved_bytes=8 * MiB, peak_allocated_bytes=7 * MiB
    )
    integration = types.ModuleType("gpukeeper.integrations.torch_allocator")
    integration.is_active = lambda: True  # type: ignore[attr-defined]
    integration.pool_usage = lambda d: (pool.allocated_bytes, pool.reserved_bytes)  # type: ignore[attr-defined]
    integration.peak_allocated = lambda d: pool.peak_allocated_bytes  # type: ignore[attr-defined]
    integration.reset_peak = lambda d: resets.append(d) or True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, integration.__name__, integration)
    info = gpukeeper.get_gpu_memory_info(0)
    report = gpukeeper.memory_report(0, detail="counters")
    assert report.peaks == {"torch": 7 * MiB}
    assert info["allocated_bytes"] == 3 * MiB and info["peak_bytes"] == 7 * MiB
    assert frameworks.reset_peaks(0) == ["torch"] and resets == [0]

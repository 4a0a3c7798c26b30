"""A framework is its adapter: one registered at run time (here a lazily evaluated one,
as MLX is, faked as ``lazyfw`` in ``sys.modules``) is timed, stepped, cleaned up, listed
and tracked with no change outside its adapter."""

from __future__ import annotations

import sys
import types
from typing import Any, Callable, List, Optional, Sequence, Tuple

from gpukeeper import benchmark_function, benchmark_md_trajectory, frameworks
from gpukeeper.base import device_names as devices
from gpukeeper.cleanup import GPUContext
from gpukeeper.cleanup.tracking import AllocationTracker
from gpukeeper.frameworks.adapter import (
    DeviceFilter,
    FrameworkAdapter,
    FrameworkMemory,
    InUseReader,
    LiveArray,
    StopRecording,
)

MiB = 1 << 20


class LazyArray:
    def __init__(self, value: Any, nbytes: int = 4 * MiB) -> None:
        self.value, self.nbytes = value, nbytes


def fake_module() -> types.ModuleType:
    """A lazily evaluating framework with one GPU: ``eval`` computes (here: counts)."""
    fw = types.ModuleType("lazyfw")
    fw.state = {"active": 10 * MiB, "cache": 100 * MiB, "evals": 0, "syncs": 0}  # type: ignore[attr-defined]
    fw.array = LazyArray  # type: ignore[attr-defined]
    fw.hooks = []  # type: ignore[attr-defined]
    return fw


class LazyAdapter(FrameworkAdapter):
    """What an adapter of a lazily evaluated framework writes (the defaults do the rest)."""

    name = "lazyfw"
    display_name = "LazyFW"
    waits_on_result = True
    result_wait = "lazyfw.eval"

    def _fw(self) -> Any:
        return sys.modules.get("lazyfw")

    def in_use(self) -> bool:
        return self._fw() is not None

    def memory(self, device: int) -> Optional[FrameworkMemory]:
        fw = self._fw()
        if fw is None or device != 0:
            return None
        s = fw.state
        return FrameworkMemory(self.name, s["active"], s["active"] + s["cache"])

    def release(self, devices: Optional[List[int]]) -> int:
        fw = self._fw()
        released, fw.state["cache"] = fw.state["cache"], 0
        return released

    def synchronize(self, devices: Optional[List[int]]) -> None:
        self._fw().state["syncs"] += 1

    def gpu_device_ids(self) -> List[int]:
        return [0] if self.in_use() else []

    def holds_arrays(self, value: Any) -> bool:
        return isinstance(value, LazyArray)

    def result_device(self, value: Any) -> Optional[int]:
        return 0

    def block_until_ready(self, value: Any) -> Any:
        self._fw().state["evals"] += 1
        return value

    def in_use_reader(self, device: int) -> Optional[InUseReader]:
        state = self._fw().state
        return (lambda: state["active"]), (lambda: None)

    def array_type(self) -> Optional[type]:
        return LazyArray if self.in_use() else None

    def describe_array(self, obj: Any, wanted: DeviceFilter) -> Optional[Tuple[int, LiveArray]]:
        if not wanted("cuda", 0):
            return None
        return obj.nbytes, LiveArray(self.name, "cuda:0", "LazyArray", (), "f32", obj.nbytes, id(obj))

    def holds_device_memory(self, obj: Any) -> bool:
        return True

    def record_allocations(self, on_alloc: Callable[[Sequence[int]], None]) -> Optional[StopRecording]:
        hooks = self._fw().hooks
        hooks.append(on_alloc)
        return lambda: hooks.remove(on_alloc)


def install(monkeypatch: Any) -> Any:
    fw = fake_module()
    monkeypatch.setitem(sys.modules, "lazyfw", fw)
    monkeypatch.setitem(frameworks.ADAPTERS, "lazyfw", LazyAdapter())
    return fw


def test_benchmark_function_blocks_on_its_results(monkeypatch):
    fw = install(monkeypatch)
    r = benchmark_function(lambda: LazyArray(1.0), n_calls=20, warmup=2)
    assert r.work == "gpu" and r.timing == "host" and r.backend == "lazyfw" and r.device == "cuda:0"
    assert "LazyFW work: host clock around lazyfw.eval on the result" in r.timing_method
    assert r.memory_source == "lazyfw" and r.memory_before_bytes == 10 * MiB
    assert fw.state["evals"] >= 22


def test_a_plain_result_is_cpu_work(monkeypatch):
    install(monkeypatch)
    r = benchmark_function(lambda: 1.0, n_calls=5, warmup=1, device="cpu")
    assert r.work == "cpu" and r.backend == "cpu"


def test_md_trajectory_blocks_on_each_step(monkeypatch):
    fw = install(monkeypatch)
    r = benchmark_md_trajectory(lambda x: LazyArray(x), [1.0, 2.0], n_steps=20, warmup_steps=2)
    assert r.work == "gpu" and r.device == "cuda:0" and r.timing_source == "host"
    assert r.memory_source == "lazyfw" and r.memory_leak is False
    assert fw.state["evals"] >= 20 and "lazyfw.eval on each step's result" in r.timing_method


def test_cleanup_releases_it_and_lists_its_arrays(monkeypatch):
    fw = install(monkeypatch)
    monkeypatch.setattr(frameworks, "active_devices", lambda: [0])
    monkeypatch.setattr(devices, "cuda_status", lambda: (1, ""))
    kept = LazyArray(1.0, nbytes=8 * MiB)
    listed = frameworks.live_arrays(0)
    assert any(a.framework == "lazyfw" and a.data_ptr == id(kept) for a in listed)
    assert "lazyfw" in frameworks.array_frameworks()
    with GPUContext(device=0):
        pass
    assert fw.state["cache"] == 0 and fw.state["syncs"] >= 1


def test_the_tracker_records_its_allocations(monkeypatch):
    fw = install(monkeypatch)
    tracker = AllocationTracker(4)
    tracker.start()
    try:
        for hook in fw.hooks:
            hook((1234,))
    finally:
        tracker.stop()
    assert "lazyfw" in tracker.frameworks and fw.hooks == []
    assert ("lazyfw", 1234) in tracker.sites

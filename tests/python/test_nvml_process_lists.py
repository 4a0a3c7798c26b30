"""NVML's process lists read in one driver call (``nvml.running_processes``), against a
fake of pynvml's function table: the figures match the wrapper's, and the wrapper is used
where the table is missing or the buffer too small."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, List

import engine_fakes
import pytest
from engine_fakes import NOT_AVAILABLE

from gpukeeper.base import nvml


def FakeNvml(processes: List[Any]) -> Any:  # noqa: N802
    """pynvml's function table and list wrapper over ``processes``, (pid, bytes) pairs."""
    return engine_fakes.FakeNvml(processes, function_table=True)


GETTER = "nvmlDeviceGetComputeRunningProcesses"


def _figures(infos: List[Any]) -> List[Any]:
    return [(i.pid, i.usedGpuMemory) for i in infos]


def test_one_driver_call_reads_the_list_as_the_wrapper_does():
    fake = FakeNvml([(101, 1 << 30), (202, NOT_AVAILABLE)])
    got = nvml.running_processes(fake, None, GETTER)
    assert fake.driver_calls == 1 and fake.wrapper_calls == 0
    assert _figures(got) == [(101, 1 << 30), (202, None)]
    assert _figures(got) == _figures(fake.nvmlDeviceGetComputeRunningProcesses(None))


def test_an_empty_list_is_one_call_too():
    fake = FakeNvml([])
    assert nvml.running_processes(fake, None, GETTER) == []
    assert fake.driver_calls == 1


def test_more_processes_than_the_buffer_take_the_wrapper():
    fake = FakeNvml([(p, p) for p in range(nvml._LISTED + 3)])
    got = nvml.running_processes(fake, None, GETTER)
    assert fake.wrapper_calls == 1 and len(got) == nvml._LISTED + 3


def test_without_the_function_table_the_wrapper_answers():
    fake = FakeNvml([(7, 70)])
    fake._nvmlGetFunctionPointer = None  # an older pynvml
    assert _figures(nvml.running_processes(fake, None, GETTER)) == [(7, 70)]
    assert fake.wrapper_calls == 1


def test_a_driver_error_is_raised_as_nvmls():
    fake = FakeNvml([(7, 70)])
    fake._nvmlGetFunctionPointer = lambda name: lambda handle, count, entries: 999
    with pytest.raises(engine_fakes.FakeNvml.NVMLError):
        nvml.running_processes(fake, None, GETTER)


@pytest.mark.skipif(nvml.NVML.get()[0] is None, reason="needs NVML")
def test_the_real_nvml_gives_the_wrappers_list():
    lib = nvml.NVML.get()[0]
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    fast = nvml.running_processes(lib, handle, GETTER)
    slow = lib.nvmlDeviceGetComputeRunningProcesses(handle)
    assert sorted(i.pid for i in fast) == sorted(i.pid for i in slow)


class TwoLists:
    """pynvml's two list wrappers alone (no function table), counting their calls."""

    def __init__(self, compute: List[Any], graphics: List[Any]) -> None:
        self.lists = {"compute": compute, "graphics": graphics}
        self.calls: List[str] = []

    def _read(self, which: str) -> List[Any]:
        self.calls.append(which)
        return [SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in self.lists[which]]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> List[Any]:
        return self._read("compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> List[Any]:
        return self._read("graphics")


def _by_pid(processes: Any) -> dict:
    return {p.pid: p.used_bytes for p in processes}


def test_a_wanted_process_found_in_the_compute_list_skips_the_graphics_list():
    fake = TwoLists([(10, 5 << 20), (11, 7 << 20)], [(12, 1 << 20), (10, 5 << 20)])
    got = nvml.device_processes(fake, None, [], names=False, wanted=10)
    assert fake.calls == ["compute"] and _by_pid(got) == {10: 5 << 20, 11: 7 << 20}
    # without a wanted pid both lists are read, and a process in both counts once
    fake.calls.clear()
    got = nvml.device_processes(fake, None, [], names=False)
    assert fake.calls == ["compute", "graphics"]
    assert _by_pid(got) == {10: 5 << 20, 11: 7 << 20, 12: 1 << 20}


def test_a_wanted_process_not_in_the_compute_list_or_without_a_figure_reads_both():
    fake = TwoLists([(11, 7 << 20)], [(10, 3 << 20)])
    got = nvml.device_processes(fake, None, [], names=False, wanted=10)
    assert fake.calls == ["compute", "graphics"] and _by_pid(got)[10] == 3 << 20
    fake = TwoLists([(10, None)], [(10, 3 << 20)])
    got = nvml.device_processes(fake, None, [], names=False, wanted=10)
    assert fake.calls == ["compute", "graphics"] and _by_pid(got) == {10: 3 << 20}


def test_the_per_sample_reader_makes_one_driver_call_a_read(monkeypatch):
    import os

    fake = FakeNvml([(1, 1 << 20), (os.getpid(), 3 << 30)])
    monkeypatch.setattr(nvml.NVML, "get", lambda: (fake, ""))
    monkeypatch.setattr(nvml, "device_handle", lambda lib, device: (None, "same index"))
    read, why = nvml.process_memory_reader(0)
    assert why == "" and read is not None
    before = fake.driver_calls
    assert read() == 3 << 30 and read() == 3 << 30
    assert fake.driver_calls - before == 2 and fake.wrapper_calls == 0
    fake.processes = [(1, 1 << 20)]  # no longer listed
    assert read() == 0

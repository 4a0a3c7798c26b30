"""NVML's process lists read in one driver call (``nvml.running_processes``), against a
fake of pynvml's function table: the figures match the wrapper's, and the wrapper is used
where the table is missing or the buffer too small."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any, List

import pytest

from gpukeeper.base import nvml

NOT_AVAILABLE = ctypes.c_ulonglong(-1).value


class Entry(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class FakeNvml:
    """pynvml's pieces that running_processes uses, over a list of (pid, bytes)."""

    NVML_SUCCESS = 0
    NVML_ERROR_INSUFFICIENT_SIZE = 7
    NVML_VALUE_NOT_AVAILABLE_ulonglong = ctypes.c_ulonglong(-1)
    c_nvmlProcessInfo_v3_t = Entry

    class NVMLError(Exception):
        pass

    def __init__(self, processes: List[Any]) -> None:
        self.processes = processes
        self.driver_calls = 0
        self.wrapper_calls = 0

    def _nvmlGetFunctionPointer(self, name: str):
        assert name == "nvmlDeviceGetComputeRunningProcesses_v3"

        def fn(handle, count_ref, entries):
            self.driver_calls += 1
            count = ctypes.cast(count_ref, ctypes.POINTER(ctypes.c_uint)).contents
            if entries is None or count.value < len(self.processes):
                count.value = len(self.processes)
                return self.NVML_ERROR_INSUFFICIENT_SIZE if self.processes else self.NVML_SUCCESS
            for i, (pid, used) in enumerate(self.processes):
                entries[i].pid, entries[i].usedGpuMemory = pid, used
            count.value = len(self.processes)
            return self.NVML_SUCCESS

        return fn

    @staticmethod
    def nvmlStructToFriendlyObject(entry: Entry) -> Any:
        return SimpleNamespace(pid=entry.pid, usedGpuMemory=entry.usedGpuMemory)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> List[Any]:
        self.wrapper_calls += 1
        return [
            SimpleNamespace(pid=p, usedGpuMemory=None if u == NOT_AVAILABLE else u)
            for p, u in self.processes
        ]


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
    with pytest.raises(FakeNvml.NVMLError):
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

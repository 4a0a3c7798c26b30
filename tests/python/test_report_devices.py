"""DevicesReport: memory_report() without a device covers every visible device.

The CPU tests use the real CPU-mode report (host pools). The many-device tests fake the
machine: ``devices.cuda_status`` says there are two CUDA devices and ``report._cuda_report``
(the per-device builder that ``memory_report`` calls) returns made-up CUDA reports, so
the totals, the ``None`` rule and the text are checked against known figures. One test
runs the real per-device builder with faked frameworks to check the per-framework peaks.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional

import pytest
from engine_fakes import fresh_nvml  # noqa: F401  (a fixture)

import gpukeeper
from gpukeeper import _core, frameworks
from gpukeeper.base import device_names as devices
from gpukeeper.account import account_reader as report
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.frameworks import FrameworkMemory, host_pool_peak
from gpukeeper.base.nvml import ProcessMemory
from gpukeeper.account.account_reader import memory_report, memory_reports
from gpukeeper.account.device_account import MemoryReport
from gpukeeper.account.process_account import DevicesReport

MiB = 1 << 20
GiB = 1 << 30
CUDA = gpukeeper.cuda_available()
cpu_only = pytest.mark.skipif(bool(CUDA), reason="checks the CPU-mode report of a machine without CUDA")


pytestmark = pytest.mark.usefixtures("fresh_nvml")  # some tests swap pynvml for a fake


# --------------------------------------------------------------------- CPU mode


@cpu_only
def test_cpu_mode_is_one_section_whose_figures_are_the_totals(pools):
    pool = pools("host")
    with pool.get_managed_buffer(0, 2 * MiB, "uint8"):
        everything = memory_report()
    assert isinstance(everything, DevicesReport) and everything.mode == "cpu"
    assert len(everything) == 1
    host = everything[0]
    assert host.mode == "cpu" and host.device is None
    for name in ("total_bytes", "free_bytes", "used_bytes", "process_bytes", "frameworks_allocated_bytes",
                 "frameworks_reserved_bytes", "peak_allocated_bytes", "context_and_libraries_bytes",
                 "other_processes_bytes", "unaccounted_bytes"):
        assert getattr(everything, name) == getattr(host, name), name
    assert everything.frameworks_allocated_bytes >= 2 * MiB
    assert everything.peak_allocated_bytes >= 2 * MiB  # the host pool's peak
    assert everything.context_and_libraries_bytes is None  # no device, no context
    assert everything.frameworks["gpukeeper"] == host.frameworks["gpukeeper"]


def test_memory_report_of_one_device_stays_a_memory_report():
    assert type(memory_report("cpu")) is MemoryReport
    assert gpukeeper.DevicesReport is DevicesReport and "DevicesReport" in gpukeeper.__all__


@cpu_only
def test_memory_reports_is_the_per_device_list_and_warns():
    with pytest.warns(DeprecationWarning, match=r"list\(gpukeeper.memory_report\(\)\)"):
        reports = memory_reports(use_nvml=False)
    everything = memory_report(use_nvml=False)
    assert [type(r) for r in reports] == [MemoryReport]
    assert [(r.mode, r.device) for r in reports] == [(r.mode, r.device) for r in everything]


def test_host_pool_peak_is_in_the_cpu_report(pools):
    pool = pools("host")
    with pool.get_managed_buffer(0, 3 * MiB, "uint8"):
        pass  # released: allocated falls back, the peak stays
    r = memory_report("cpu")
    # The sum over every live host pool: pools other tests left alive count too.
    assert r.peaks["gpukeeper"] == host_pool_peak() >= pool.stats(0).peak_allocated_bytes >= 3 * MiB
    assert r.peak_allocated_bytes == r.peaks["gpukeeper"]
    assert "peak allocated (gpukeeper)" in r.table()
    assert r.to_dict()["peaks"] == r.peaks and r.to_dict()["peak_allocated_bytes"] == r.peak_allocated_bytes


def test_round_trip_through_dict_and_json(pools):
    pool = pools("host")
    with pool.get_managed_buffer(0, MiB, "uint8"):
        everything = memory_report(use_nvml=False)
    data = everything.to_dict()
    assert set(data) == {"rank", "world_size", "hostname", "pid", "timestamp", "mode", "devices", "total"}
    assert data["devices"] == [r.to_dict() for r in everything]
    assert data["total"]["frameworks_reserved_bytes"] == everything.frameworks_reserved_bytes
    assert data["total"]["peak_allocated_bytes"] == everything.peak_allocated_bytes
    back = DevicesReport.from_dict(data)
    assert back == everything
    assert back.to_dict() == data
    assert DevicesReport.from_dict(json.loads(everything.to_json())) == everything
    assert json.loads(everything.to_json(indent=None)) == data


def test_old_memory_report_dicts_without_peaks_still_read():
    data = memory_report("cpu").to_dict()
    del data["peaks"], data["peak_allocated_bytes"]
    back = MemoryReport.from_dict(data)
    assert back.peaks == {} and back.peak_allocated_bytes is None


@pytest.mark.parametrize("key", ["devices", "hostname", "pid", "timestamp"])
def test_from_dict_names_the_missing_key(key):
    data = memory_report(use_nvml=False).to_dict()
    del data[key]
    with pytest.raises(InvalidInputError, match=key):
        DevicesReport.from_dict(data)


def test_from_dict_names_a_bad_device_entry():
    data = memory_report(use_nvml=False).to_dict()
    del data["devices"][0]["total_bytes"]
    with pytest.raises(InvalidInputError, match=r"devices\[0\].*total_bytes"):
        DevicesReport.from_dict(data)
    data["devices"] = [42]
    with pytest.raises(InvalidInputError, match=r"devices\[0\].*dict"):
        DevicesReport.from_dict(data)
    data["devices"] = {"0": {}}
    with pytest.raises(InvalidInputError, match="'devices' must be a list"):
        DevicesReport.from_dict(data)
    with pytest.raises(InvalidInputError, match="takes a dict"):
        DevicesReport.from_dict([])  # type: ignore[arg-type]


def test_text_has_the_sections_and_the_total():
    everything = memory_report(use_nvml=False)
    text = str(everything)
    assert text == everything.table()
    assert text.startswith("gpukeeper memory report of the process: host ")
    assert f"pid {everything.pid}" in text.splitlines()[0]
    sections = text.split("\n\n")
    assert len(sections) == 1 + len(everything) + 1  # title, each device, the total
    assert sections[-1].startswith(("total over CUDA device", "total (CPU mode"))
    assert "rank" not in sections[0]


def test_rank_and_world_size_are_shown_and_kept():
    host = memory_report("cpu", use_nvml=False)
    ranked = DevicesReport(devices=[host], rank=3, world_size=8)
    assert "rank 3 of 8" in ranked.table().splitlines()[0]
    data = ranked.to_dict()
    assert (data["rank"], data["world_size"]) == (3, 8)
    assert DevicesReport.from_dict(data) == ranked
    assert "rank 3 of 8" in ranked._repr_html_()
    assert "rank 5," in DevicesReport(devices=[host], rank=5).table()


@pytest.mark.parametrize("rank, world_size, what", [
    (8, 8, "rank 8 is not below"), (-1, None, "rank"), (True, None, "rank"), (None, 0, "world_size"),
    ("3", None, "rank"),
])
def test_bad_rank_or_world_size_is_invalid_input(rank, world_size, what):
    host = memory_report("cpu", use_nvml=False)
    with pytest.raises(InvalidInputError, match=what):
        DevicesReport(devices=[host], rank=rank, world_size=world_size)


def test_devices_must_be_memory_reports():
    with pytest.raises(InvalidInputError, match="list of MemoryReport"):
        DevicesReport(devices=[{"mode": "cpu"}])  # type: ignore[list-item]


@cpu_only
def test_for_device_in_cpu_mode():
    everything = memory_report(use_nvml=False)
    assert everything.for_device("cpu") is everything[0]
    with pytest.raises(InvalidInputError, match="no device 0 .*host"):
        everything.for_device(0)
    with pytest.raises(InvalidInputError, match="particular device"):
        everything.for_device("cuda")
    with pytest.raises(InvalidInputError, match="gpu"):
        everything.for_device("gpu")


def test_sequence_protocol():
    host = memory_report("cpu", use_nvml=False)
    other = memory_report("cpu", use_nvml=False)
    pair = DevicesReport(devices=[host, other])
    assert len(pair) == 2
    assert list(pair) == [host, other] and pair[0] is host and pair[-1] is other
    assert pair[0:1] == [host]
    with pytest.raises(IndexError):
        pair[2]


# --------------------------------------------------------------------- many devices, faked


def fake_cuda_report(device: int, *, torch_reserved: Optional[int] = 512 * MiB,
                     process: Optional[int] = GiB, peak: Optional[int] = 400 * MiB) -> MemoryReport:
    """A CUDA report of made-up figures: 80 GiB of which 20 GiB free, PyTorch holding
    ``torch_reserved`` (None: unknown), this process ``process`` bytes (NVML), one other
    process with 2 GiB, and PyTorch's ``peak`` (None: no framework keeps a peak)."""
    return MemoryReport(
        mode="cuda", device=device, name=f"Fake GPU {device}",
        total_bytes=80 * GiB, free_bytes=20 * GiB, memory_source="nvml",
        frameworks={"torch": FrameworkMemory("torch", 300 * MiB, torch_reserved)},
        process_bytes=process, process_source="nvml", this_process="found (pid 1)",
        other_processes=[ProcessMemory(4242, "other", 2 * GiB)], nvml="ok (driver 999.99)",
        host={}, primary_context=True, other_contexts=0, contexts_how="primary context active",
        peaks={} if peak is None else {"torch": peak},
    )


class TwoDevices:
    """The faked machine: ``figures[device]`` are ``fake_cuda_report``'s keyword
    arguments for that device; ``asked`` the devices whose report was built."""

    def __init__(self) -> None:
        self.figures: Dict[int, Dict[str, Any]] = {0: {}, 1: {}}
        self.asked: List[int] = []

    def build(self, device: int, use_nvml: bool, *, for_totals: bool = False) -> MemoryReport:
        self.asked.append(device)
        return fake_cuda_report(device, **self.figures[device])


@pytest.fixture
def two_devices(monkeypatch) -> TwoDevices:
    machine = TwoDevices()
    monkeypatch.setattr(devices, "cuda_status", lambda: (2, ""))
    monkeypatch.setattr(report, "_cuda_report", machine.build)
    return machine


def test_two_devices_total_their_figures(two_devices):
    two_devices.figures[1].update(torch_reserved=GiB, process=3 * GiB, peak=700 * MiB)
    everything = memory_report()
    assert two_devices.asked == [0, 1]
    assert [r.device for r in everything] == [0, 1] and everything.mode == "cuda"
    assert everything.total_bytes == 160 * GiB and everything.free_bytes == 40 * GiB
    assert everything.used_bytes == 120 * GiB
    assert everything.frameworks_allocated_bytes == 600 * MiB
    assert everything.frameworks_reserved_bytes == 512 * MiB + GiB
    assert everything.frameworks["torch"] == FrameworkMemory("torch", 600 * MiB, 512 * MiB + GiB)
    assert everything.process_bytes == 4 * GiB
    assert everything.peak_allocated_bytes == 1100 * MiB
    assert everything.context_and_libraries_bytes == (GiB - 512 * MiB) + (3 * GiB - GiB)
    assert everything.unaccounted_bytes == everything.context_and_libraries_bytes  # no other context
    assert everything.other_processes_bytes == 4 * GiB
    total = everything.to_dict()["total"]
    assert total["process_bytes"] == 4 * GiB and total["frameworks"]["torch"]["reserved_bytes"] == 512 * MiB + GiB
    assert DevicesReport.from_dict(everything.to_dict()) == everything


def test_one_unknown_figure_makes_its_total_unknown(two_devices):
    two_devices.figures[1].update(torch_reserved=None, process=None, peak=None)
    everything = memory_report()
    assert everything.frameworks_reserved_bytes is None
    assert everything.frameworks["torch"].reserved is None
    assert everything.process_bytes is None
    assert everything.peak_allocated_bytes is None
    assert everything.context_and_libraries_bytes is None
    assert everything.frameworks_allocated_bytes == 600 * MiB  # known on both: still summed
    assert everything.total_bytes == 160 * GiB
    total = everything.table().split("\n\n")[-1]
    assert "unknown" in total and "peak allocated" not in total


def test_two_devices_text_has_a_section_each_and_the_total(two_devices):
    text = memory_report().table()
    sections = text.split("\n\n")
    assert len(sections) == 4
    assert sections[0].endswith("2 CUDA devices")
    assert sections[1].startswith("gpukeeper memory report: CUDA device 0 (Fake GPU 0)")
    assert sections[2].startswith("gpukeeper memory report: CUDA device 1 (Fake GPU 1)")
    assert sections[3].startswith("total over CUDA device 0, CUDA device 1")
    cells = [re.split(r"\s{2,}", line.strip()) for line in sections[3].splitlines()[2:]]
    total_rows = {row[0]: row[1:] for row in cells}
    assert total_rows["total"] == ["160.0 GiB"]
    assert total_rows["frameworks"] == ["600.0 MiB", "1.0 GiB"]
    assert total_rows["peak allocated"] == ["800.0 MiB"]
    assert total_rows["other processes"] == ["4.0 GiB"]
    assert total_rows["this process (NVML)"] == ["2.0 GiB"]


def test_two_devices_html(two_devices):
    everything = memory_report()
    everything.hostname = "<b>x</b>"
    html = everything._repr_html_()
    assert "CUDA device 0 (Fake GPU 0)" in html and "CUDA device 1 (Fake GPU 1)" in html
    assert "total over CUDA device 0, CUDA device 1" in html and "160.0 GiB" in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html


def test_for_device_with_two_devices(two_devices):
    everything = memory_report()
    assert everything.for_device(1) is everything[1]
    assert everything.for_device("cuda:0") is everything[0]
    with pytest.raises(InvalidInputError, match=r"no device 2 \(it has: CUDA device 0, CUDA device 1\)"):
        everything.for_device(2)
    with pytest.raises(InvalidInputError, match="no device 'cpu'"):
        everything.for_device("cpu")


def test_one_named_device_is_not_a_devices_report(two_devices):
    one = memory_report(1)
    assert type(one) is MemoryReport and one.device == 1
    assert two_devices.asked == [1]


def test_cuda_report_reads_each_frameworks_peak(monkeypatch):
    """The real per-device builder, with the frameworks and the device faked."""
    monkeypatch.setattr(devices, "cuda_status", lambda: (2, ""))
    monkeypatch.setattr(report, "_holds_context", lambda device: False)
    monkeypatch.setattr(_core, "device_memory_info", lambda d: (50 * GiB, 79 * GiB), raising=False)
    monkeypatch.setattr(frameworks, "memory_by_framework",
                        lambda device=0: {"torch": FrameworkMemory("torch", 100 * MiB, 256 * MiB)})
    peaks = {0: {"torch": 200 * MiB, "gpukeeper": 8 * MiB}, 1: {}}
    monkeypatch.setattr(frameworks, "peak_by_framework", lambda device: dict(peaks[device]))
    everything = memory_report(use_nvml=False)
    assert everything[0].peaks == peaks[0] and everything[0].peak_allocated_bytes == 208 * MiB
    assert "peak allocated (torch, gpukeeper)" in everything[0].table()
    assert everything[1].peaks == {} and everything[1].peak_allocated_bytes is None
    assert "peak allocated" not in everything[1].table()
    assert everything.peak_allocated_bytes is None  # device 1 keeps no peak
    assert MemoryReport.from_dict(everything[0].to_dict()) == everything[0]


def test_memory_report_from_dict_names_the_missing_key():
    data = memory_report("cpu").to_dict()
    del data["nvml"]
    with pytest.raises(InvalidInputError, match="nvml"):
        MemoryReport.from_dict(data)


def test_a_rank_summary_reads_the_same_totals_as_a_full_report():
    """The summary's lean reading (no host section, names) keeps every total it carries."""
    torch = pytest.importorskip("torch") if CUDA else None
    held = torch.ones(1 << 20, device="cuda") if torch is not None else None
    full = memory_report()
    lean = report.rank_totals_report(True, "visible")
    fields = ["frameworks_allocated_bytes", "frameworks_reserved_bytes", "peak_allocated_bytes"]
    if CUDA:  # NVML's figure of the process; in CPU mode it is the RSS, which moves
        fields += ["process_bytes", "context_and_libraries_bytes"]
    for field in fields:
        assert getattr(lean, field) == getattr(full, field), field
    assert [d.device for d in lean.devices] == [d.device for d in full.devices]
    if CUDA:
        assert all(d.host == {} for d in lean.devices)  # what the summary leaves unread
    del held

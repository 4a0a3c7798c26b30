"""One measurement core for benchmark_function and benchmark_md_trajectory, on a machine
without a GPU: the same memory source, the same plan for the same situation, the same
engine warning, the same statistics, and framework reads only through the adapters."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpukeeper
from engine_fakes import (
    MD_STEPS,
    fresh_nvml,  # noqa: F401  (a fixture)
    md_step,
    GiB,
    MiB,
    FakeDriver,
    FakeNvml,
    FakeTorch,
    counter,
    hide_frameworks,
    install_driver,
    install_engine,
    install_nvml,
)
from gpukeeper.frameworks import driver as cuda_driver
from gpukeeper.md import LatencyStats, benchmark_md_trajectory, latency_stats
from gpukeeper.timing import SampleStats, benchmark_function, summarize
from gpukeeper.timing.memory_readers import MemorySeries, memory_series, reads_nvml
from gpukeeper.timing.plans import choose_plan, unsynchronized_warning
from gpukeeper.timing.sampling import MemorySampler, sample_period
from gpukeeper.timing.timer import timing_device

fake_machine = pytest.mark.skipif(
    bool(gpukeeper.cuda_available()), reason="fakes a GPU-less process's CUDA state; run on a CPU machine"
)

PACKAGE = Path(gpukeeper.__file__).resolve().parent
pytestmark = pytest.mark.usefixtures("fresh_nvml")  # every test here fakes NVML


def _engine_beside_torch(monkeypatch: Any, reserved: int, process_bytes: Any = GiB) -> FakeTorch:
    """An engine holding ``process_bytes`` of device memory in this process (NVML's
    figure), with PyTorch imported beside it holding ``reserved`` bytes."""
    hide_frameworks(monkeypatch)
    torch = FakeTorch(reserved // 2, reserved)
    monkeypatch.setitem(sys.modules, "torch", torch)
    install_driver(monkeypatch, FakeDriver({0: True}))
    install_nvml(monkeypatch, FakeNvml(used=process_bytes))
    monkeypatch.setattr(cuda_driver, "cuda_device_count", lambda: 1)
    return torch


# --------------------------------------------------------------------- the memory source


def test_the_rule() -> None:
    assert reads_nvml("engine", None, 20 * MiB, GiB)
    assert reads_nvml("events", lambda: None, 20 * MiB, GiB)  # synchronize= says: an engine's
    assert reads_nvml("framework", None, 0, GiB)  # the counters see nothing, NVML does
    assert not reads_nvml("events", None, 20 * MiB, GiB)
    assert not reads_nvml("events", None, 0, 0)


@pytest.mark.quiet_machine
def test_short_steps_are_sampled_less_often() -> None:
    # A read of at least 20 us: within 0.4 us a step when steps take 10 ms (a read every
    # 50 steps or so), within 0.1 % of a step when they take 25 us (every 800 at least).
    def read() -> int:
        end = time.perf_counter_ns() + 20_000
        while time.perf_counter_ns() < end:
            pass
        return 0

    series = [MemorySeries("slow_counter", read, True)]
    short = sample_period(series, "auto", 16_000, [25_000] * 9)
    long = sample_period(series, "auto", 16_000, [10_000_000] * 9)
    assert short >= 800 and 50 <= long < 1000
    assert sample_period(series, "auto", 160, [25_000] * 9) == 10  # 16 samples at least
    assert sample_period(series, 7, 16_000, [25_000] * 9) == 7  # a period given is kept


@fake_machine
def test_engine_memory_with_torch_imported_is_nvml_in_both(monkeypatch) -> None:
    _engine_beside_torch(monkeypatch, reserved=20 * MiB)
    sync = counter()
    r = benchmark_function(lambda: None, n_calls=10, warmup=1, synchronize=sync)
    assert r.work == "gpu" and r.backend == "engine"
    assert r.memory_source == "nvml_process" and r.memory_before_bytes == GiB
    t = benchmark_md_trajectory(md_step, MD_STEPS, n_steps=40, warmup_steps=1, synchronize=sync)
    assert t.work == "gpu" and t.memory_source == "nvml_process" and t.memory_leak_source == "nvml_process"
    assert t.memory_initial_bytes == GiB


@fake_machine
def test_counters_that_see_nothing_give_way_to_nvml(monkeypatch) -> None:
    # No synchronize: PyTorch's events would time the work, but its counters hold nothing
    # on the device while NVML sees this process holding 1 GiB there: not torch's work.
    _engine_beside_torch(monkeypatch, reserved=0)
    notes: list = []
    series, cross = memory_series("events", 0, None, notes)
    assert [s.name for s in series] == ["nvml_process"] and cross is None
    sampler = MemorySampler("events", 0)  # what benchmark_function reads around its calls
    sampler.start()
    sampler.stop()
    assert sampler.source == "nvml_process" and sampler.before == GiB
    t = benchmark_md_trajectory(md_step, MD_STEPS, n_steps=40, warmup_steps=1, timing="host")
    assert t.work == "gpu" and t.memory_source == "nvml_process"


@fake_machine
def test_counters_that_hold_memory_stay_the_source(monkeypatch) -> None:
    torch = _engine_beside_torch(monkeypatch, reserved=20 * MiB)
    series, cross = memory_series("events", 0, None, [])
    assert [s.name for s in series] == ["torch"] and cross is not None and cross.name == "nvml_process"
    sampler = MemorySampler("events", 0)
    sampler.start()
    sampler.stop()
    assert sampler.source == "torch" and sampler.before == 10 * MiB and sampler.peak == 20 * MiB
    assert torch.peak_resets == 1


@fake_machine
def test_cpu_work_reads_the_host_under_the_names_each_result_uses(monkeypatch) -> None:
    hide_frameworks(monkeypatch)
    r = benchmark_function(lambda: None, n_calls=5, warmup=1, device="cpu")
    t = benchmark_md_trajectory(md_step, MD_STEPS, n_steps=16, warmup_steps=1, device="cpu")
    assert r.memory_source == "host_rss" and t.memory_source == "process_rss"


# --------------------------------------------------------------------- the plan


def _situation(monkeypatch: Any, name: str) -> None:
    hide_frameworks(monkeypatch)
    if name == "torch without CUDA":  # a CPU build of torch on a machine with a GPU
        monkeypatch.setitem(sys.modules, "torch", FakeTorch(0, 0, available=False))
        install_driver(monkeypatch, FakeDriver({0: False}))
        install_nvml(monkeypatch, FakeNvml(used=None))
    elif name == "engine alone":
        install_engine(monkeypatch, used=800 * MiB)
    elif name == "torch with CUDA":
        monkeypatch.setitem(sys.modules, "torch", FakeTorch(10 * MiB, 20 * MiB))
        install_driver(monkeypatch, FakeDriver({0: True}))
        install_nvml(monkeypatch, FakeNvml(used=GiB))
    else:
        install_driver(monkeypatch, FakeDriver({0: False}))
        install_nvml(monkeypatch, FakeNvml(used=None))
    monkeypatch.setattr(cuda_driver, "cuda_device_count", lambda: 1)


@fake_machine
@pytest.mark.parametrize("name, device, work", [
    ("torch without CUDA", "cpu", "cpu"),
    ("engine alone", "cuda:0", "gpu"),
    ("nothing", "cpu", "cpu"),
])
def test_both_entry_points_decide_alike(monkeypatch, name: str, device: str, work: str) -> None:
    _situation(monkeypatch, name)
    sync = lambda: None  # noqa: E731
    r = benchmark_function(lambda: None, n_calls=5, warmup=1, synchronize=sync)
    t = benchmark_md_trajectory(md_step, MD_STEPS, n_steps=16, warmup_steps=1, synchronize=sync)
    assert (r.device, r.work) == (t.device, t.work) == (device, work)


@fake_machine
@pytest.mark.parametrize("name, kind", [
    ("torch without CUDA", "cpu"), ("engine alone", "engine"), ("torch with CUDA", "events"), ("nothing", "cpu"),
])
def test_one_plan_rule(monkeypatch, name: str, kind: str) -> None:
    _situation(monkeypatch, name)
    for per_call in (True, False):
        assert choose_plan(None, timing_device(None), None, per_call=per_call).kind == kind
    # Saying where the work is (synchronize=) makes GPU work an engine's, never events.
    with_sync = choose_plan(None, timing_device(None), lambda: None)
    assert with_sync.kind == ("cpu" if kind == "cpu" else "engine")


@fake_machine
def test_one_engine_warning(monkeypatch) -> None:
    _situation(monkeypatch, "engine alone")
    r = benchmark_function(lambda: None, n_calls=5, warmup=1)
    t = benchmark_md_trajectory(md_step, MD_STEPS, n_steps=16, warmup_steps=1)
    assert unsynchronized_warning(per_call=True) in r.warnings
    assert unsynchronized_warning(per_call=False) in t.warnings
    assert r.synchronized is False and t.synchronized is False


# --------------------------------------------------------------------- statistics


def test_latency_stats_are_sample_stats_and_more() -> None:
    x = [float(v) for v in np.random.default_rng(3).gamma(4.0, 0.25, size=301)]
    s = latency_stats(x)
    assert isinstance(s, LatencyStats) and isinstance(s.sample, SampleStats)
    assert s.sample == summarize(x)
    assert (s.n, s.mean_ms, s.median_ms, s.std_ms, s.p99_ms) == (
        s.sample.count, s.sample.mean, s.sample.median, s.sample.std, s.sample.p99)
    keys = {"n", "mean_ms", "median_ms", "std_ms", "min_ms", "max_ms", "p5_ms", "p95_ms", "p99_ms",
            "jitter_ms", "drift_ms", "drift_pct", "mad_ms", "outlier_threshold_ms", "outlier_steps"}
    assert keys <= set(s.to_dict())


# --------------------------------------------------------------------- framework reads


# A framework imported or looked up by name; the adapters in frameworks/ are the one way
# the measuring code reaches one.
_DIRECT = re.compile(
    r"""^\s*(import|from)\s+(torch|cupy)\b"""
    r"""|sys\.modules(\.get\()?\s*\[?\s*["'](torch|cupy)["']"""
    r"""|["'](torch|cupy)["']\s+(not\s+)?in\s+sys\.modules""")
# The PyTorch profiler imports PyTorch because that is what its caller asked for.
_ALLOWED = {("timing/profiler.py", "import torch")}


def test_measuring_code_reads_frameworks_through_the_adapters() -> None:
    found = []
    for folder in ("timing", "md"):
        for path in sorted((PACKAGE / folder).glob("*.py")):
            rel = f"{folder}/{path.name}"
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if _DIRECT.search(line) and (rel, line.strip()) not in _ALLOWED:
                    found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_grep_sees_what_it_looks_for() -> None:
    for line in ('torch = sys.modules["torch"]', "import cupy", 'if "cupy" in sys.modules:',
                 'sys.modules.get("torch")', "from torch import nn"):
        assert _DIRECT.search(line), line
    assert not _DIRECT.search('sys.modules.get("torch._dynamo.utils")')

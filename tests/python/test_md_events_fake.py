"""benchmark_md_trajectory's GPU-event path on a fake GPU: marks every k-th step, the
choice of k, intervals broken by host work, the ring, and what ``gpu_times_ms`` then
holds. The device is a clock (``FakeGpu``): each step queues work on it, each mark is
stamped with the time the device reaches it. The real device: test_md_trajectory.py."""

from __future__ import annotations

import math
import sys
import time
import types
from typing import Any, List, Optional

import pytest

from gpukeeper import frameworks
from gpukeeper.base import device_names as devices
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.md import benchmark_md_trajectory
from gpukeeper.md import events as md_events
from gpukeeper.timing.timer import TimerBackend

US = 1000  # ns


class FakeGpu:
    """One stream. ``ahead=True``: the device is always busy (its clock starts far ahead
    of the host, so marks are stamped by the queued work alone and every time is exact);
    ``ahead=False``: the device follows the host (it idles until work is launched), and
    ``synchronize`` waits for it."""

    def __init__(self, ahead: bool = True, event_ns: int = 0) -> None:
        self.ahead = ahead
        self.clock = time.perf_counter_ns() + (10**10 if ahead else 0)
        self.event_ns = event_ns  # what a record costs the device
        self.records = 0

    def _now(self) -> int:
        return self.clock if self.ahead else max(self.clock, time.perf_counter_ns())

    def launch(self, work_ns: int) -> None:
        self.clock = self._now() + work_ns

    def stamp(self, event: List[int]) -> None:
        self.records += 1
        self.clock = self._now() + self.event_ns
        event[0] = self.clock

    def wait(self) -> None:
        if not self.ahead:
            while time.perf_counter_ns() < self.clock:
                pass


class FakeBackend(TimerBackend):
    name = "fake-gpu"
    is_gpu = True

    def __init__(self, gpu: FakeGpu) -> None:
        super().__init__(devices.DeviceSpec("cuda", 0))
        self.gpu = gpu

    def current_stream(self) -> Any:
        return "stream"

    def new_event(self) -> List[int]:
        return [0]

    def record(self, event: List[int], stream: Any) -> None:
        self.gpu.stamp(event)

    def elapsed_ms(self, start: List[int], end: List[int]) -> float:
        return (end[0] - start[0]) / 1e6

    def query(self, event: List[int]) -> bool:
        return (not self.gpu.ahead) and event[0] <= time.perf_counter_ns()

    def synchronize(self) -> None:
        self.gpu.wait()


def _fake_torch(gpu: FakeGpu, read_delay_s: float = 0.0) -> types.ModuleType:
    torch = types.ModuleType("torch")

    def stats(device: int) -> dict:
        if read_delay_s:
            time.sleep(read_delay_s)
        return {"allocated_bytes": {"all": {"current": 4 << 20}},
                "reserved_bytes": {"all": {"current": 20 << 20}}}

    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: 1,
        current_device=lambda: 0, synchronize=lambda d=None: gpu.wait(),
        memory=types.SimpleNamespace(memory_stats_as_nested_dict=stats),
    )
    torch._C = types.SimpleNamespace()  # type: ignore[attr-defined]
    torch.Tensor = type("Tensor", (), {})  # type: ignore[attr-defined]
    return torch


@pytest.fixture
def fake_gpu(monkeypatch):
    """Installs a fake device 0 with PyTorch "using" it; returns a function that makes
    the FakeGpu (and the torch fake around it)."""
    for name in ("torch", "cupy", "jax"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: the torch counters decide
    # No gpukeeper pools on the fake machine, whatever earlier tests left alive: the
    # adapter reads its own module's registry, so both names are replaced.
    monkeypatch.setattr(frameworks, "live_pools", lambda: [])
    monkeypatch.setattr(frameworks.pools_adapter, "live_pools", lambda: [])
    monkeypatch.setattr(devices, "cuda_status", lambda: (1, ""))
    monkeypatch.setattr(devices, "current_cuda_index", lambda: 0)

    def make(ahead: bool = True, event_ns: int = 0, read_delay_s: float = 0.0) -> FakeGpu:
        gpu = FakeGpu(ahead, event_ns)
        monkeypatch.setitem(sys.modules, "torch", _fake_torch(gpu, read_delay_s))
        monkeypatch.setattr(md_events, "event_backend", lambda index: FakeBackend(gpu))
        return gpu

    return make


def _work(n: int) -> List[int]:
    """Per-step device work (ns): 100 us, with a few distinct steps."""
    w = [100 * US + (i % 7) * US for i in range(n)]
    w[37] = 1100 * US
    return w


def _stepper(gpu: FakeGpu, work: List[int], host_ns: int = 0):
    def step(i: int) -> int:
        if host_ns:  # the host's part of the step, then the launch
            end = time.perf_counter_ns() + host_ns
            while time.perf_counter_ns() < end:
                pass
        gpu.launch(work[i])
        return i

    return step


def _interval_means(work: List[int], ends: List[int]) -> List[float]:
    """Per-step ms: each interval's work divided over its steps (``ends``: the last step
    of each interval)."""
    out: List[float] = []
    start = 0
    for e in ends:
        steps = e - start + 1
        out += [sum(work[start:e + 1]) / steps / 1e6] * steps
        start = e + 1
    return out


# --------------------------------------------------------------------- choice of k


def test_choose_event_every_keeps_device_and_host_cost_in_budget():
    choose = md_events.choose_event_every
    # 100 us steps, 1 us of host per mark: the device's 2 us a mark needs k=4 for 0.5%,
    # the host's 0.1 % of a step (100 ns) k=10.
    assert choose(100_000, 1_000, 10_000) == 10
    assert choose(1_000_000, 300, 10_000) == 1
    # The host's 400 ns budget decides when marks are dear on the host and steps long.
    assert choose(10_000_000, 3_000, 10_000) == math.ceil(3_000 / md_events.HOST_BUDGET_NS)
    # 25 us steps: the host's share decides (within 0.1 % of the step).
    assert choose(25_000, 2_000, 10**6) == 80
    # Long steps: every step has its own mark.
    assert choose(10_000_000, 100, 10_000) == 1
    # Short steps: many steps per mark, but at least MIN_INTERVALS intervals.
    assert choose(1_000, 100, 100_000) == 400
    assert choose(1_000, 100, 3_200) == 3_200 // md_events.MIN_INTERVALS
    assert choose(1_000, 100, 20) == 1
    # No step time measured: the host's budget alone.
    assert choose(0, 1_000, 10_000) == 3
    for step_ns in (20_000, 100_000, 400_000):
        k = choose(step_ns, 1_500, 10**6)
        assert md_events.EVENT_DEVICE_NS / k <= md_events.DEVICE_SHARE * step_ns * 1.0001
        assert 1_500 / k <= md_events.HOST_SHARE * step_ns * 1.0001


# --------------------------------------------------------------------- what the GPU times hold


def test_event_every_1_gives_each_step_its_own_gpu_time(fake_gpu):
    gpu = fake_gpu()
    n = 100
    work = _work(n)
    r = benchmark_md_trajectory(_stepper(gpu, work), list(range(n)), warmup_steps=0, device=0,
                                event_every=1, check_memory_leak=False)
    assert r.timing_source == "gpu" and r.event_every == 1 and "one per step" in r.timing_method
    assert r.gpu_times_ms == pytest.approx([w / 1e6 for w in work])
    assert r.gpu.max_ms == pytest.approx(1.1) and r.gpu.outlier_steps == (37,)
    assert r.to_dict()["event_every"] == 1
    assert gpu.records == 1 + n  # the origin, then one mark per step


def test_event_every_k_divides_each_interval_over_its_steps(fake_gpu):
    gpu = fake_gpu()
    n = 102  # not a multiple of k: the last interval ends at the last step
    work = _work(n)
    r = benchmark_md_trajectory(_stepper(gpu, work), list(range(n)), warmup_steps=0, device=0,
                                event_every=4, check_memory_leak=False)
    ends = [i for i in range(n) if (i + 1) % 4 == 0] + [n - 1]
    assert r.event_every == 4 and len(r.gpu_times_ms) == n
    assert r.gpu_times_ms == pytest.approx(_interval_means(work, ends))
    # The mean (and the events' total) is exact; the slow step 37 is diluted over 36..39.
    assert r.gpu.mean_ms == pytest.approx(sum(work) / n / 1e6)
    assert r.gpu_times_ms[37] == pytest.approx(sum(work[36:40]) / 4 / 1e6)
    assert gpu.records == 1 + len(ends)
    assert "one after every 4 steps" in r.timing_method and "events every 4 steps" in r.summary()
    assert r.to_dict()["event_every"] == 4 and len(r.host_times_ms) == n


def test_memory_samples_end_an_interval_and_restart_the_next(fake_gpu):
    gpu = fake_gpu()
    n = 60
    work = _work(n)
    r = benchmark_md_trajectory(_stepper(gpu, work), list(range(n)), warmup_steps=0, device=0,
                                event_every=4, memory_sample_every=10)
    ends = sorted({i for i in range(n) if (i + 1) % 4 == 0 or (i + 1) % 10 == 0} | {n - 1})
    assert r.memory_source == "torch" and r.memory_sample_every == 10
    assert r.gpu_times_ms == pytest.approx(_interval_means(work, ends))
    # One mark per interval, a fresh origin after each of the 6 samples, the first origin.
    assert gpu.records == 1 + len(ends) + 6


def test_a_full_ring_loses_no_step(fake_gpu):
    n = 200
    work = _work(n)
    times = []
    for ring in (4096, 5, 1):
        gpu = fake_gpu()
        r = benchmark_md_trajectory(_stepper(gpu, work), list(range(n)), warmup_steps=0, device=0,
                                    event_every=3, memory_sample_every=25, event_ring=ring)
        times.append(r.gpu_times_ms)
    assert times[1] == pytest.approx(times[0]) and times[2] == pytest.approx(times[0])
    assert sum(times[0]) == pytest.approx(sum(work) / 1e6)


def test_sync_every_with_marks_every_k(fake_gpu):
    gpu = fake_gpu()
    n = 40
    work = _work(n)
    synced = []
    r = benchmark_md_trajectory(_stepper(gpu, work), list(range(n)), warmup_steps=0, device=0,
                                event_every=4, sync_every=5, check_memory_leak=False,
                                synchronize=lambda: synced.append(1), timing="gpu")
    assert r.timing_source == "gpu" and len(r.gpu_times_ms) == n
    assert len(synced) == 1 + n // 5 + 1  # after the warm-up, every 5th step, at the end
    ends = [i for i in range(n) if (i + 1) % 4 == 0]
    assert r.gpu_times_ms == pytest.approx(_interval_means(work, ends))


@pytest.mark.quiet_machine
def test_host_work_between_steps_is_in_no_interval(fake_gpu):
    # A launch-bound loop (the host takes 150 us a step, the device 100 us, so the device
    # idles between launches) with a memory reader that takes 5 ms: every 8th step.
    gpu = fake_gpu(ahead=False, read_delay_s=0.005)
    n = 96
    work = [100 * US] * n
    r = benchmark_md_trajectory(_stepper(gpu, work, host_ns=150 * US), list(range(n)),
                                warmup_steps=0, device=0, event_every=4, memory_sample_every=8)
    assert r.event_every == 4 and r.timing_source == "gpu"
    # Each step's time is the host's 150 us (launch-bound), not 150 us + 5 ms / 4 in the
    # half of the intervals that follow a sample (a few may be, when the busy host is
    # preempted).
    slow = [t for t in r.gpu_times_ms if t > 0.9]
    assert len(slow) <= n // 8, r.gpu_times_ms
    assert 0.14 <= r.gpu.median_ms < 0.3 and min(r.gpu_times_ms) >= 0.1


def test_auto_event_every_from_the_warm_up(fake_gpu):
    # A 100 us step (device and host alike) and marks that cost the device 2 us: "auto"
    # puts ~4 steps in an interval, so the marks cost the device <= ~0.5% of the run.
    gpu = fake_gpu(ahead=False, event_ns=2 * US)
    n = 400
    step = _stepper(gpu, [100 * US] * n, host_ns=100 * US)
    r = benchmark_md_trajectory(step, list(range(n)), warmup_steps=10, device=0,
                                check_memory_leak=False)
    assert r.timing_source == "gpu" and r.event_every is not None
    # The device's budget asks for k >= 4 (2 us / 0.5% of ~100 us; less if a busy machine
    # stretched the warm-up); the host's cost of a fake mark (Python, machine-dependent)
    # may ask for more, never past n // 32.
    assert 2 <= r.event_every <= n // md_events.MIN_INTERVALS, r.event_every
    # Marks in the loop: the origin and one every k steps (9 more measured their cost).
    assert gpu.records - 9 <= 1 + math.ceil(n / r.event_every)
    assert f"one after every {r.event_every} steps" in r.timing_method


def test_event_every_is_checked():
    for bad in (0, -1, True, "every", 1.5):
        with pytest.raises(InvalidInputError, match="event_every"):
            benchmark_md_trajectory(lambda x: x, [1, 2], device="cpu", event_every=bad)


def test_without_events_event_every_is_none():
    r = benchmark_md_trajectory(lambda x: x, [1, 2, 3], device="cpu", event_every=4,
                                check_memory_leak=False)
    assert r.event_every is None and r.to_dict()["event_every"] is None

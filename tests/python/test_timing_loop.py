"""Loop time beside device time: the headline, the speedups and the verdict on what bounds a
call, on a simulated GPU whose device and launch costs are known (tests/python/sim_device.py)."""

from __future__ import annotations

import types
from typing import Any, Iterator, List

import pytest
from torch_cuda import torch_cuda

from gpukeeper import benchmark_function, compare_implementations
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.timing import BenchmarkResult, register_backend
from gpukeeper.timing import loop_time as loop_time_module
from gpukeeper.timing import throttle as throttle_module
from gpukeeper.timing import timer as timer_module

from sim_device import SimBackend, SimDevice, SimGates, now_ms


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimDevice]:
    """A simulated GPU chosen for every device, with its gates in place of ``_core``'s."""
    device = SimDevice()
    monkeypatch.setattr(timer_module, "gates", lambda: SimGates(device))
    monkeypatch.setattr(throttle_module, "nvml_sample", lambda index: (None, "unavailable: simulated GPU"))
    register_backend("simgpu", lambda spec: SimBackend(spec, device), lambda spec: True, priority=2000)
    try:
        yield device
    finally:
        del timer_module._BACKENDS["simgpu"]


def _bench(fn: Any, **kw: Any) -> BenchmarkResult:
    kw.setdefault("n_calls", 20)
    kw.setdefault("warmup", 3)
    return benchmark_function(fn, device="cpu", **kw)


@pytest.mark.quiet_machine
def test_launch_bound_call_leads_with_the_loop_time(sim: SimDevice) -> None:
    # 20 kernels of 5 us behind 40 us launches: the device works 0.1 ms of each 0.8 ms.
    def small_kernels() -> None:
        for _ in range(20):
            sim.kernel(0.005, 0.04)

    # The simulated device runs on the host's clock: a busy machine can only make the loop
    # slower (a descheduled host launches nothing), never faster than its 0.8 ms of launches.
    r = _bench(small_kernels)
    assert r.measure == "loop" and r.work == "gpu" and r.launch_latency == "hidden"
    assert r.device_median_ms == pytest.approx(0.1, rel=0.3)
    assert 0.78 <= r.loop_median_ms < 3.0
    assert r.median_ms == r.loop_median_ms  # the headline is the loop's
    assert r.bound == "launch" and r.device_busy is not None and r.device_busy < 0.3
    assert r.loop_calls >= 2 and r.n_calls >= 6 and r.times_ms == r.loop_times_ms  # six batches at least
    assert "loop time per call" in r.summary() and "host's launches" in r.summary()
    # asked for, the device time leads
    d = _bench(small_kernels, measure="device")
    assert d.measure == "device" and d.median_ms == pytest.approx(0.1, rel=0.3)
    assert 0.78 <= d.loop_median_ms < 3.0 and d.bound == "launch"


@pytest.mark.quiet_machine
def test_device_bound_call_reads_the_same_both_ways(sim: SimDevice) -> None:
    def one_long_kernel() -> None:
        sim.kernel(0.5, 0.01)

    r = _bench(one_long_kernel)
    assert r.bound == "device" and r.device_busy is not None and r.device_busy > 0.85
    assert r.device_median_ms == pytest.approx(0.5, rel=0.05)
    assert r.device_median_ms * 0.99 <= r.loop_median_ms <= r.device_median_ms * 1.15
    assert "bound by: the device" in r.summary()


def test_a_call_that_waits_inside_is_sync_bound(sim: SimDevice) -> None:
    def waits() -> None:
        sim.kernel(0.1, 0.01)
        sim.sync()

    r = _bench(waits)
    assert r.bound == "sync" and r.launch_latency == "included"
    assert any(w.startswith("launch latency included") for w in r.warnings)


@pytest.mark.quiet_machine
def test_speedup_is_a_ratio_of_loop_times(sim: SimDevice) -> None:
    # "eager": 20 launches of 40 us for 0.1 ms of device work; "graph": one 10 us launch
    # for the same device work. The loop sees ~8x; the device sees the same work.
    def eager() -> None:
        for _ in range(20):
            sim.kernel(0.005, 0.04)

    def graph() -> None:
        sim.kernel(0.1, 0.01)

    loop = compare_implementations({"eager": eager, "graph": graph}, n_calls=20, warmup=3, device="cpu")
    assert loop["graph"].speedup is not None and loop["graph"].speedup > 2.5
    device = compare_implementations({"eager": eager, "graph": graph}, n_calls=20, warmup=3, device="cpu",
                                     measure="device")
    assert device["graph"].speedup == pytest.approx(1.0, rel=0.3)


@pytest.mark.quiet_machine
def test_batches_last_about_the_target(sim: SimDevice) -> None:
    def call() -> None:
        sim.kernel(0.2, 0.01)

    r = _bench(call, n_calls=10)
    # 25 ms batches of 0.2 ms calls
    assert 25 <= r.loop_calls <= 175
    assert r.loop_issue_ms is not None and len(r.loop_issue_ms) == len(r.loop_times_ms or [])


@pytest.mark.quiet_machine
def test_loop_time_is_the_wall_clock_of_a_plain_loop(sim: SimDevice) -> None:
    def call() -> None:
        for _ in range(4):
            sim.kernel(0.02, 0.03)

    def plain_loop() -> float:
        sim.busy_until = now_ms()
        t0 = now_ms()
        for _ in range(200):
            call()
        while now_ms() < sim.busy_until:
            pass
        return (now_ms() - t0) / 200

    # Held to the plain loops run right before and after it (a busy machine moves both).
    for _ in range(3):
        before = plain_loop()
        headline = _bench(call).median_ms
        after = plain_loop()
        if min(before, after) * 0.9 <= headline <= max(before, after) * 1.1:
            break
    assert min(before, after) * 0.9 <= headline <= max(before, after) * 1.1, (before, headline, after)


def test_cpu_work_loop_and_device_are_the_host_time() -> None:
    r = benchmark_function(lambda: sum(range(200)), n_calls=15, warmup=2, device="cpu")
    assert r.work == "cpu" and r.bound == "host" and r.device_busy is None
    assert r.loop_times_ms == r.host_times_ms == r.times_ms and r.n_calls == 15
    assert r.loop_median_ms == r.device_median_ms == r.median_ms
    d = benchmark_function(lambda: sum(range(200)), n_calls=15, warmup=2, device="cpu", measure="device")
    assert d.measure == "device" and d.n_calls == 15


@pytest.mark.parametrize("bad", ["wall", "", None, 1, "Loop"])
def test_measure_is_checked(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="measure must be one of 'loop', 'device'"):
        benchmark_function(lambda: None, n_calls=2, warmup=0, device="cpu", measure=bad)


def test_results_round_trip_and_old_files_read_as_device_time() -> None:
    r = BenchmarkResult(name="x", times_ms=[1.0, 1.2], gpu_times_ms=[0.4, 0.5], timing="gpu", work="gpu",
                        loop_times_ms=[1.0, 1.2], loop_calls=7, bound="launch", device_busy=0.4,
                        measure="loop")
    back = BenchmarkResult.from_json(r.to_json())
    assert back.measure == "loop" and back.loop_calls == 7 and back.bound == "launch"
    assert back.to_dict()["loop_median_ms"] == pytest.approx(1.1)
    assert back.to_dict()["device_median_ms"] == pytest.approx(0.45)
    old = r.to_dict()
    for key in ("measure", "loop_times_ms", "loop_calls", "loop_issue_ms", "bound", "device_busy"):
        old.pop(key)
    legacy = BenchmarkResult.from_dict(old)
    assert legacy.measure == "device" and legacy.loop_median_ms is None
    with pytest.raises(InvalidInputError, match="measure"):
        BenchmarkResult(name="x", times_ms=[1.0], measure="wall")


def test_bound_verdict_rules() -> None:
    verdict = loop_time_module.bound_verdict
    assert verdict(1.0, 0.95, 0.3, False, True, 0.9) == ("device", 0.95)
    assert verdict(1.0, 0.2, 0.9, False, True, 0.9) == ("launch", 0.2)
    assert verdict(1.0, 0.2, 0.9, True, True, 0.9) == ("sync", 0.2)
    # the host had slack: the device's per-launch gaps, not the host, set the pace
    assert verdict(1.0, 0.2, 0.1, False, True, 0.9) == ("device", 0.2)
    assert verdict(1.0, 0.85, 0.3, False, True, 0.9) == ("device", 0.85)
    assert verdict(1.0, None, None, False, True, 0.9) == (None, None)
    assert verdict(1.0, 1.0, None, False, False, 0.9) == ("host", None)
    assert verdict(1.0, 1.3, 0.1, False, True, 0.9) == ("device", 1.0)  # capped


def test_batch_calls() -> None:
    rc = loop_time_module.batch_calls
    assert rc(0.1, 10.0, 1000) == 100
    assert rc(50.0, 10.0, 1000) == 1
    assert rc(1e-6, 10.0, 1000) == 1000
    assert rc(0.0, 10.0, 1000) == 1000
    assert rc(float("nan"), 10.0, 1000) == 1


def test_ranks_agree_on_the_round_size(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list = []

    class Ranks:
        world_size = 2

        def agree_max(self, value: int) -> int:
            seen.append(value)
            return value * 3  # the other rank wants more

        def __init__(self) -> None:
            self.steps = 0

        def step(self, done: bool) -> bool:
            self.steps += 1
            return done

    calls = types.SimpleNamespace(n=0)

    def fn() -> None:
        calls.n += 1

    ranks = Ranks()
    out = loop_time_module.run_batches(fn, (), {}, lambda last: None, 5.0, 4, None, None, [], ranks,
                                   target_ms=10.0, min_batches=3)
    assert seen == [2, out.calls // 3] and out.calls % 3 == 0
    assert len(out.per_call) == 3 and ranks.steps == 4  # 3 batches, then the step that ends them


# ===================================================================== GPU (torch)


def _wall_per_call(torch: Any, fn: Any, n: int, repeats: int = 5) -> float:
    """The truth the loop time is held to: n back-to-back calls between two
    synchronisations, by the wall clock, per call (median of ``repeats``)."""
    import statistics
    import time

    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3 / n)
    return statistics.median(out)


def _small_kernels(x: Any, n: int) -> Any:
    """A launch-bound region: ``n`` pairs of tiny elementwise kernels."""

    def region() -> Any:
        y = x
        for _ in range(n):
            y = y * 1.0001 + 0.0001
        return y

    return region


def _within_the_truth(torch: Any, measure: Any, fn: Any, n: int, rel: float) -> List[Any]:
    """(gpukeeper's value, the truths taken just before and just after it) for up to three
    attempts, stopping at the first whose value lies within ``rel`` of the truths' range.
    The host of a shared machine changes speed in phases of about a second: a value is
    held only to the truth measured next to it, and a bias shows in every attempt."""
    attempts = []
    for _ in range(3):
        before = _wall_per_call(torch, fn, n)
        value = measure()
        after = _wall_per_call(torch, fn, n)
        attempts.append((value, before, after))
        if min(before, after) * (1 - rel) <= value <= max(before, after) * (1 + rel):
            break
    return attempts


def _held(attempts: List[Any], rel: float) -> bool:
    value, before, after = attempts[-1]
    return min(before, after) * (1 - rel) <= value <= max(before, after) * (1 + rel)


@pytest.mark.quiet_machine
@pytest.mark.gpu
def test_gpu_launch_bound_region_matches_the_loops_wall_clock() -> None:
    torch = torch_cuda()
    small_kernels = _small_kernels(torch.randn(256, device="cuda"), 20)
    results: List[BenchmarkResult] = []

    def measure() -> float:
        results.append(benchmark_function(small_kernels, n_calls=100, warmup=20))
        return results[-1].median_ms

    attempts = _within_the_truth(torch, measure, small_kernels, 300, 0.05)
    assert _held(attempts, 0.05), attempts
    r = results[-1]
    assert r.measure == "loop" and r.bound == "launch"
    assert r.device_median_ms is not None and r.device_median_ms < 0.7 * r.median_ms


@pytest.mark.gpu
def test_gpu_device_bound_matmul_reads_the_same_both_ways() -> None:
    torch = torch_cuda()
    a = torch.randn(4096, 4096, device="cuda")
    results: List[BenchmarkResult] = []

    def measure() -> float:
        results.append(benchmark_function(lambda: a @ a, n_calls=50, warmup=5))
        return results[-1].median_ms

    attempts = _within_the_truth(torch, measure, lambda: a @ a, 100, 0.02)
    assert _held(attempts, 0.02), attempts
    r = results[-1]
    assert r.bound == "device" and r.device_busy is not None and r.device_busy > 0.95
    assert r.device_median_ms == pytest.approx(r.loop_median_ms, rel=0.03)


@pytest.mark.gpu
def test_gpu_graph_speedup_is_the_loops() -> None:
    torch = torch_cuda()
    eager = _small_kernels(torch.randn(256, device="cuda"), 30)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            eager()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        eager()
    speedups: List[float] = []

    def measure() -> float:
        results = compare_implementations({"eager": eager, "graph": graph.replay}, n_calls=100, warmup=20)
        assert results["eager"].bound == "launch"
        speedups.append(float(results["graph"].speedup or 0.0))
        return speedups[-1]

    attempts = []
    for _ in range(3):
        before = _wall_per_call(torch, eager, 300) / _wall_per_call(torch, graph.replay, 300)
        value = measure()
        after = _wall_per_call(torch, eager, 300) / _wall_per_call(torch, graph.replay, 300)
        attempts.append((value, before, after))
        if _held(attempts, 0.10):
            break
    assert _held(attempts, 0.10), attempts


def test_slow_calls_take_a_quarter_of_n_calls_in_batches() -> None:
    import time as _time

    out = loop_time_module.run_batches(lambda: _time.sleep(0.015), (), {}, lambda last: None, 15.0, 48, None,
                                       None, [], None, target_ms=10.0, min_batches=10)
    assert out.calls == 1 and len(out.per_call) == 12  # 48 / 4 batches of one 15 ms call
    fast = loop_time_module.run_batches(lambda: None, (), {}, lambda last: None, 0.001, 48, None, None, [],
                                        None, target_ms=1.0, min_batches=10)
    assert fast.calls > 48 and len(fast.per_call) == 10  # at least min_batches

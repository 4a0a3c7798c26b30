"""CUDATimer, benchmark_function, compare_implementations, print_comparison_table,
ProfilerContext and BenchmarkResult: on the CPU everywhere, on the GPU where there is one.

Work of known duration is a busy loop on the steady clock (time.sleep overshoots by a
scheduler tick on loaded machines); tolerances allow for a busy CI host.
"""

from __future__ import annotations

import io
import json
import math
import statistics
import sys
import time
import types
from typing import Any, Dict, List

import pytest
from torch_cuda import torch_cuda

import gpukeeper
from gpukeeper import GpuError, InvalidInputError
from gpukeeper.timing import (
    BenchmarkResult,
    CUDATimer,
    ProfilerContext,
    TimerBackend,
    benchmark_function,
    compare_implementations,
    format_comparison_table,
    print_comparison_table,
    register_backend,
    timing_device,
    select_backend,
)
from gpukeeper.timing import benchmark as timing_benchmark
from gpukeeper.frameworks import torch_adapter
from gpukeeper.timing import timer as timer_module
from gpukeeper.timing.throttle import throttle_verdict

CUDA = bool(gpukeeper.cuda_available())


def busy(ms: float) -> None:
    """Spins for ``ms`` milliseconds of host time."""
    end = time.perf_counter_ns() + int(ms * 1e6)
    while time.perf_counter_ns() < end:
        pass


# --------------------------------------------------------------------- CUDATimer (CPU)


@pytest.mark.quiet_machine
def test_timer_context_manager_on_cpu() -> None:
    with CUDATimer("block", device="cpu") as t:
        busy(5)
    assert t.backend == "cpu" and not t.is_gpu
    assert 4.9 <= t.elapsed_ms < 15.0
    assert t.elapsed_s == pytest.approx(t.elapsed_ms / 1e3)
    assert t.host_ms == pytest.approx(t.elapsed_ms, abs=1.0)
    assert "block" in repr(t) and "ms" in repr(t)


@pytest.mark.quiet_machine
def test_timer_start_stop_and_reuse() -> None:
    t = CUDATimer(device="cpu")
    for ms in (2, 6):
        assert t.start() is t and t.running
        busy(ms)
        t.stop()
        assert t.ready()
        assert ms - 0.1 <= t.elapsed_ms < ms + 10
    assert t.elapsed_ms == t.elapsed_ms  # read twice: same value, cached


def test_timer_misuse_is_a_gpu_error() -> None:
    t = CUDATimer(device="cpu")
    with pytest.raises(GpuError, match="never started"):
        _ = t.elapsed_ms
    with pytest.raises(GpuError, match="not started"):
        t.stop()
    t.start()
    with pytest.raises(GpuError, match="already running"):
        t.start()
    with pytest.raises(GpuError, match="still running"):
        _ = t.elapsed_ms
    t.stop()


@pytest.mark.quiet_machine
def test_timer_stops_when_the_body_raises() -> None:
    t = CUDATimer(device="cpu")
    with pytest.raises(KeyError):
        with t:
            busy(3)
            raise KeyError("boom")
    assert not t.running
    assert 3.0 <= t.elapsed_ms < 100.0  # stopped on the way out, not left running


@pytest.mark.skipif(CUDA, reason="checks the CPU fallback")
def test_default_device_without_cuda_is_cpu() -> None:
    assert timing_device(None).kind == "cpu"
    assert CUDATimer().backend == "cpu"
    with pytest.raises(InvalidInputError, match="CUDA"):
        timing_device("cuda")
    with pytest.raises(InvalidInputError):
        select_backend("cpu", backend="torch")


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cpu:1", 3.5, True, object()])
def test_bad_device(device: Any) -> None:
    with pytest.raises(InvalidInputError):
        timing_device(device)


def test_bad_timer_arguments() -> None:
    with pytest.raises(InvalidInputError):
        CUDATimer(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="unknown timer backend"):
        CUDATimer(device="cpu", backend="nope")


def test_registered_backend_is_preferred() -> None:
    """The plug-in point for the compiled timer: a registered backend with a higher
    priority is what CUDATimer and benchmark_function use, without other changes."""

    class FakeClock(TimerBackend):
        name = "fake"
        is_gpu = False
        ticks = 0

        def new_event(self) -> List[float]:
            return [0.0]

        def record(self, event: List[float], stream: Any) -> None:
            FakeClock.ticks += 1
            event[0] = FakeClock.ticks * 1.5  # each mark 1.5 ms after the last

        def elapsed_ms(self, start: List[float], end: List[float]) -> float:
            return end[0] - start[0]

    register_backend("fake", FakeClock, lambda d: True, priority=100)
    try:
        t = CUDATimer(device="cpu")
        assert t.backend == "fake"
        with t:
            pass
        assert t.elapsed_ms == 1.5
    finally:
        del timer_module._BACKENDS["fake"]
    assert CUDATimer(device="cpu").backend == "cpu"


@pytest.mark.quiet_machine
def test_time_call_on_cpu() -> None:
    t = CUDATimer("call", device="cpu")
    took = t.time_call(busy, (3.0,))
    assert 3.0 <= took.elapsed_ms < 100.0
    assert took.launch_hidden is None and took.result is None
    # host time: from before the start mark to after the wait for the stop mark
    assert took.elapsed_ms <= took.host_ms < took.elapsed_ms + 50.0
    assert t.elapsed_ms == t.raw_elapsed_ms == took.elapsed_ms and t.host_ms == took.host_ms
    assert not t.running and t.launch_hidden is None
    # arguments in, result out; prepare runs first, with the stream (None on the CPU)
    seen: List[Any] = []
    took = t.time_call(lambda x, y=0: seen.append("call") or x + y, (2,), {"y": 3},
                       prepare=lambda stream: seen.append(("prepare", stream)))
    assert took.result == 5 and seen == [("prepare", None), "call"]


def test_time_call_lets_exceptions_through() -> None:
    t = CUDATimer(device="cpu")
    t.time_call(busy, (1.0,))

    def broken() -> None:
        raise ZeroDivisionError("inside fn")

    with pytest.raises(ZeroDivisionError):
        t.time_call(broken)
    assert not t.running
    with pytest.raises(GpuError, match="never started"):  # no half measurement left
        _ = t.elapsed_ms
    t.start()
    with pytest.raises(GpuError, match="already running"):
        t.time_call(busy, (1.0,))
    t.stop()


def test_timer_on_a_backend_instance() -> None:
    backend = select_backend("cpu")
    t = CUDATimer(backend=backend)
    assert t.backend == "cpu" and t.device.kind == "cpu"
    with pytest.raises(InvalidInputError, match="not both"):
        CUDATimer(device="cpu", backend=backend)


# --------------------------------------------------------------------- benchmark_function


@pytest.mark.quiet_machine
def test_benchmark_known_duration() -> None:
    calls: List[Any] = []

    def work(ms: float, tag: str = "") -> None:
        calls.append(tag)
        busy(ms)

    r = benchmark_function(work, 2.0, tag="t", n_calls=20, warmup=3, device="cpu", name="busy 2 ms")
    assert len(calls) == 23 and set(calls) == {"t"}  # warm-up + measured, kwargs passed
    assert r.name == "busy 2 ms" and r.n_calls == 20 and len(r.times_ms) == 20
    assert r.timing == "host" and r.device == "cpu" and r.gpu_times_ms is None
    assert 2.0 <= r.median_ms < 3.0
    assert 2.0 <= r.min_ms <= r.p5_ms <= r.p25_ms <= r.median_ms <= r.p75_ms <= r.p95_ms <= r.p99_ms <= r.max_ms
    assert r.calls_per_s == pytest.approx(1e3 / r.host_mean_ms)
    assert r.stop_reason == "n_calls" and r.warmup == 3
    assert r.host_times_ms == r.times_ms  # CPU work: the times are the host's
    # the MLFF utilities' names, against the samples themselves (sample std, numpy's ddof=1)
    assert r.mean_ms == pytest.approx(statistics.fmean(r.times_ms))
    assert r.median_ms == pytest.approx(statistics.median(r.times_ms))
    assert r.std_ms == pytest.approx(statistics.stdev(r.times_ms))
    assert r.p95_ms <= r.p99_ms <= r.max_ms == max(r.times_ms)
    # the loop's wall time holds every measured call, and not much else
    assert sum(r.times_ms) / 1e3 <= r.total_time_s < sum(r.times_ms) / 1e3 + 5.0
    if sys.platform.startswith("linux"):  # RSS is read from /proc
        assert r.memory_source == "host_rss"
        assert r.memory_before_bytes > 1 << 20 and r.memory_after_bytes > 1 << 20
        assert r.memory_delta_gb == pytest.approx((r.memory_after_bytes - r.memory_before_bytes) / 2**30)
    else:
        assert r.memory_source in ("host_rss", None)
    assert r.throttled is None and r.recompiles == 0
    assert "busy 2 ms" in r.summary() and "p99" in r.summary()


def test_benchmark_stops_early_when_quiet() -> None:
    r = benchmark_function(busy, 0.3, n_calls=5000, warmup=2, device="cpu", max_noise=0.2)
    assert r.stop_reason in ("max_noise", "noise_converged")
    assert 10 <= r.n_calls < 5000


@pytest.mark.quiet_machine
def test_benchmark_min_time_extends_the_run() -> None:
    r = benchmark_function(busy, 2.0, n_calls=2, warmup=0, device="cpu", min_time_s=0.03)
    assert r.n_calls > 2 and sum(r.times_ms) >= 30.0  # preemption may make calls longer, not fewer ms
    assert r.stop_reason == "min_time_s"


@pytest.mark.quiet_machine
def test_stop_rule() -> None:
    from gpukeeper.timing.stopping import StopRule

    w: List[str] = []
    rule = StopRule(3, None, None, w)
    assert [rule.add(1.0) for _ in range(3)] == [None, None, "n_calls"]
    # min_time_s: past n_calls until the measured time adds up (5 ms of 2 ms calls: 3 calls)
    rule = StopRule(2, 0.005, None, w)
    assert [rule.add(2.0) for _ in range(3)] == [None, None, "min_time_s"]
    assert StopRule(2, 0.004, None, w).add(4.0) is None
    rule = StopRule(2, 0.004, None, w)
    assert [rule.add(2.0), rule.add(2.0)] == [None, "n_calls"]  # reached with n_calls itself
    # max_noise: identical calls stop at the criterion's minimum of 10, long before n_calls
    rule = StopRule(1000, None, 0.01, w)
    reasons = [rule.add(1.0) for _ in range(10)]
    assert reasons[:9] == [None] * 9 and reasons[9] in ("max_noise", "noise_converged")
    assert w == []
    # the safety stop
    rule = StopRule(1, 10.0, None, w)
    assert rule.wall_limit_ns == pytest.approx(101e9)  # 10 x min_time_s + 1 s
    rule.wall_limit_ns = 0
    assert rule.add(1.0) == "timeout"
    assert len(w) == 1 and w[0].startswith("min_time_s=10.0 not reached")
    assert 0.0 <= rule.wall_s() < 5.0


def test_benchmark_flags_noise() -> None:
    state = {"i": 0}

    def jumpy() -> None:
        state["i"] += 1
        busy(0.2 if state["i"] % 2 else 2.0)

    r = benchmark_function(jumpy, n_calls=20, warmup=0, device="cpu")
    assert r.noisy and any(w.startswith("noisy") for w in r.warnings)
    assert "noisy" in repr(r)


def test_l2_flush_on_cpu_is_ignored_with_a_warning() -> None:
    r = benchmark_function(busy, 0.05, n_calls=3, warmup=0, device="cpu", l2_flush=True)
    assert not r.l2_flush and any("l2_flush" in w for w in r.warnings)


def test_recompiles_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for torch._dynamo.utils.counters (importing dynamo costs seconds). Not put
    # into sys.modules: torch code that imports dynamo meanwhile would get the stand-in and
    # fail halfway, leaving half-registered operator libraries behind.
    fake = types.SimpleNamespace(counters={"frames": {"total": 4}})
    monkeypatch.setattr(torch_adapter, "_dynamo_utils", lambda: fake)
    n = {"calls": 0}

    def recompiling() -> None:
        n["calls"] += 1
        if n["calls"] > 2:  # after the warm-up
            fake.counters["frames"]["total"] += 1

    r = benchmark_function(recompiling, n_calls=5, warmup=2, device="cpu")
    assert r.recompiles == 5
    assert any(w.startswith("recompiles seen") for w in r.warnings)


def testthrottle_verdict() -> None:
    calm = {"sm_clock_mhz": 1980, "reasons": 0x1}
    assert throttle_verdict(calm, {"sm_clock_mhz": 1980, "reasons": 0}) == (False, [])
    hot, why = throttle_verdict(calm, {"sm_clock_mhz": 1400, "reasons": 0x20})
    assert hot and any("thermal" in w for w in why) and any("1400" in w for w in why)


def test_fn_exceptions_propagate() -> None:
    def broken() -> None:
        raise ZeroDivisionError("inside fn")

    with pytest.raises(ZeroDivisionError):
        benchmark_function(broken, n_calls=2, warmup=0, device="cpu")


@pytest.mark.parametrize(
    "kw",
    [
        {"n_calls": 0},
        {"n_calls": -3},
        {"n_calls": 2.5},
        {"n_calls": True},
        {"warmup": -1},
        {"min_time_s": 0},
        {"min_time_s": float("inf")},
        {"max_noise": -0.1},
        {"max_noise": "low"},
        {"name": 7},
        {"l2_flush": "yes"},
        {"device": "tpu"},
    ],
)
def test_benchmark_bad_input(kw: Dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        benchmark_function(busy, 0.01, **{"warmup": 0, "device": "cpu", **kw})


def test_benchmark_needs_a_callable() -> None:
    with pytest.raises(InvalidInputError, match="callable"):
        benchmark_function(42)  # type: ignore[arg-type]
    assert issubclass(InvalidInputError, ValueError)


# --------------------------------------------------------------------- comparison


def test_compare_implementations_speedups() -> None:
    results = compare_implementations(
        {"slow": lambda ms: busy(4 * ms), "fast": lambda ms: busy(ms)}, 1.0, n_calls=15, warmup=1, device="cpu"
    )
    assert list(results) == ["slow", "fast"]
    assert results["slow"].speedup == 1.0
    # 4x in theory; a loaded CI host preempts the longer busy loop more often
    assert 3.0 < results["fast"].speedup < 8.0
    assert results["fast"].name == "fast"


@pytest.mark.parametrize(
    "impls, kw",
    [({}, {}), ({"a": 1}, {}), ({1: busy}, {}), ([busy], {}), ({"a": busy}, {"name": "x"})],
)
def test_compare_bad_input(impls: Any, kw: Dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        compare_implementations(impls, 0.01, n_calls=2, warmup=0, device="cpu", **kw)


def _result(name: str, times: List[float]) -> BenchmarkResult:
    return BenchmarkResult(name=name, times_ms=times, host_times_ms=times)


def test_comparison_table_marks_differences_within_noise() -> None:
    base = _result("base", [1.0, 1.1, 1.2, 1.3, 1.4])
    close = _result("close", [1.05, 1.15, 1.25, 1.35, 1.45])  # IQRs overlap
    far = _result("far", [0.1, 0.11, 0.12, 0.13, 0.14])
    out = io.StringIO()
    text = print_comparison_table({"base": base, "close": close, "far": far}, file=out)
    assert out.getvalue() == text
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["Implementation", "Loop", "median", "ms"]
    row = {line.split()[0]: line for line in lines[2:5]}
    assert "1.00x (baseline)" in row["base"]
    assert "~0.96x" in row["close"]
    assert "10.00x" in row["far"] and "~" not in row["far"]
    assert "within the noise" in lines[-1]
    # without overlapping rows there is no footnote
    assert "~" not in format_comparison_table([base, far])


def test_comparison_table_refuses_loop_and_device_times_side_by_side() -> None:
    loop = _result("loop", [1.0, 1.1, 1.2])
    device = BenchmarkResult(name="device", times_ms=[0.5, 0.6], gpu_times_ms=[0.5, 0.6], timing="gpu",
                             work="gpu", measure="device")
    with pytest.raises(InvalidInputError, match="time different things"):
        format_comparison_table([loop, device])


def test_comparison_table_prints_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    print_comparison_table([_result("only", [1.0, 2.0])])
    assert "only" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [{}, [], {"x": 1.0}, "table", None])
def test_comparison_table_bad_input(bad: Any) -> None:
    with pytest.raises(InvalidInputError):
        format_comparison_table(bad)


# --------------------------------------------------------------------- BenchmarkResult


def test_result_round_trip() -> None:
    r = benchmark_function(busy, 0.2, n_calls=8, warmup=1, device="cpu", name="rt")
    r.speedup = 1.5
    data = r.to_dict()
    assert data["median_ms"] == r.median_ms and data["n_calls"] == 8
    text = r.to_json()
    assert json.loads(text)["name"] == "rt"
    back = BenchmarkResult.from_json(text)
    assert back.times_ms == r.times_ms and back.host_times_ms == r.host_times_ms
    assert back.to_dict() == data
    assert BenchmarkResult.from_dict(data).p99_ms == r.p99_ms


def test_result_with_one_call_serialises_nan_as_null() -> None:
    r = _result("one", [2.5])
    assert math.isnan(r.std_ms)
    data = json.loads(r.to_json())
    assert data["std_ms"] is None and data["relative_noise"] is None
    assert BenchmarkResult.from_json(r.to_json()).median_ms == 2.5


def test_result_memory_delta() -> None:
    r = BenchmarkResult("m", [1.0], memory_before_bytes=1 << 30, memory_after_bytes=(1 << 30) + (10 << 20))
    assert r.memory_delta_bytes == 10 << 20
    assert r.memory_delta_gb * 1024 == pytest.approx(10.0)  # the MLFF utilities: MB = delta_gb * 1024


@pytest.mark.parametrize("bad", ["{", "[]", '{"times_ms": [1.0]}'])
def test_result_bad_json(bad: str) -> None:
    with pytest.raises(InvalidInputError):
        BenchmarkResult.from_json(bad)


def test_result_needs_times() -> None:
    with pytest.raises(InvalidInputError):
        BenchmarkResult("empty", [])


# --------------------------------------------------------------------- ProfilerContext


def test_profiler_writes_a_chrome_trace(tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "sub" / "trace.json"
    a = torch.randn(64, 64)
    with ProfilerContext(path, activities=["cpu"], row_limit=5) as prof:
        for _ in range(3):
            a = a @ a.T / 64
    assert path.exists()
    trace = json.loads(path.read_text())
    assert trace["traceEvents"]
    assert "aten::mm" in prof.table or "aten::matmul" in prof.table
    assert prof.sort_by == "cpu_time_total"
    assert len(prof.key_averages()) > 0
    assert "done" in repr(prof)


def test_profiler_defaults_follow_cuda() -> None:
    torch = pytest.importorskip("torch")
    prof = ProfilerContext()
    assert prof.uses_cuda == torch.cuda.is_available()
    assert prof.trace_path is None


def test_profiler_bad_input() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(InvalidInputError):
        ProfilerContext(activities=["gpu"])
    with pytest.raises(InvalidInputError):
        ProfilerContext(activities=[])
    with pytest.raises(InvalidInputError):
        ProfilerContext(row_limit=0)
    if not torch.cuda.is_available():
        with pytest.raises(InvalidInputError, match="CUDA"):
            ProfilerContext(activities=["cuda"])


def test_profiler_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(GpuError, match="needs PyTorch"):
        ProfilerContext()


# --------------------------------------------------------------------- GPU


@pytest.mark.quiet_machine
@pytest.mark.skipif(not CUDA, reason="needs a usable CUDA device")
def test_timer_follows_torchs_current_stream() -> None:
    torch = torch_cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    ref_start = torch.cuda.Event(enable_timing=True)
    ref_end = torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000  # ~10 ms at 2 GHz
    with torch.cuda.stream(side):
        timer = CUDATimer()
        assert timer.backend == "torch" and timer.is_gpu
        # The reference brackets the same work: a cycle-counted sleep lasts longer while
        # clocks ramp up, so two separate sleeps need not match (seen on an H200:
        # 16.8 ms for the first, 10.1 ms for the second).
        ref_start.record(side)
        with timer:
            torch.cuda._sleep(cycles)
        ref_end.record(side)
    assert timer.stream == side
    ref_end.synchronize()
    ref = ref_start.elapsed_time(ref_end)
    # Events on the default stream would have read ~0 ms: the work is on `side`.
    assert 0.95 * ref <= timer.elapsed_ms <= ref * 1.0001 + 0.01
    assert timer.elapsed_ms > 1.0


@pytest.mark.skipif(not CUDA, reason="needs a usable CUDA device")
def test_l2_flush_buffer_is_exactly_l2() -> None:
    torch = torch_cuda()
    from gpukeeper.timing import L2Flusher, l2_cache_size

    backend = select_backend("cuda")
    flusher = L2Flusher(backend)
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    assert flusher.nbytes == l2 == l2_cache_size("cuda")
    buffer = flusher.scratch.array
    assert flusher.backend == "torch" and buffer.numel() * buffer.element_size() == l2
    flusher.flush()
    torch.cuda.synchronize()
    assert int(buffer.max()) == 0


@pytest.mark.quiet_machine
@pytest.mark.skipif(not CUDA, reason="needs a usable CUDA device")
def test_benchmark_on_gpu_uses_events() -> None:
    torch = torch_cuda()
    x = torch.randn(256, 256, device="cuda")
    r = benchmark_function(torch.mm, x, x, n_calls=20, warmup=3, l2_flush=True)
    assert r.timing == "gpu" and r.backend == "torch" and r.device.startswith("cuda")
    assert r.gpu_times_ms is not None and len(r.gpu_times_ms) == 20
    # PyTorch's counters when it is the one framework in the process; earlier tests may
    # have loaded another (CuPy, gpukeeper's own pools), and then the sum over all is read.
    from gpukeeper import frameworks
    alone = frameworks.loaded_frameworks() == ["torch"]
    assert r.l2_flush and r.memory_source == ("torch" if alone else "frameworks")
    if alone:
        # the peak counter was reset at the start: it holds at least one 256 x 256 fp32 output
        assert r.memory_peak_bytes >= r.memory_before_bytes + 256 * 256 * 4
    else:
        # a sum over frameworks keeps no peak, and none is made up
        assert r.memory_peak_bytes is None
    # the host sees at least the GPU time of each call (it waited for it)
    assert r.host_median_ms >= r.median_ms * 0.9


def test_the_printed_table_is_not_shown_again_as_a_cells_value() -> None:
    from gpukeeper.timing.implementations import PrintedText

    out = io.StringIO()
    text = print_comparison_table([_result("only", [1.0, 2.0])], file=out)
    assert isinstance(text, str) and text == out.getvalue()
    assert isinstance(text, PrintedText) and text._ipython_display_() is None


def test_a_result_is_named_as_the_user_calls_the_function() -> None:
    import functools

    from gpukeeper.timing.benchmark import callable_name

    class _Private:
        @staticmethod
        def matmul() -> None:
            pass

    _Private.matmul.__module__ = "torch"
    assert callable_name(_Private.matmul) == "torch.matmul"  # as torch.matmul's own name reads
    assert callable_name(sorted) == "sorted"
    assert callable_name(functools.partial(sorted, [1])) == "partial(sorted)"

    def outer() -> None:
        pass

    assert callable_name(outer).endswith("outer")
    torch = pytest.importorskip("torch")
    assert callable_name(torch.matmul) == "torch.matmul"


def test_a_long_run_off_a_terminal_says_once_how_long_it_will_take() -> None:
    import subprocess
    import sys

    code = ("import time, gpukeeper\n"
            "gpukeeper.benchmark_function(lambda: time.sleep(0.002), n_calls=10**6, warmup=1, "
            "device='cpu', name='slow')\n")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("GPUKEEPER_PROGRESS",)}
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed after the first 16 calls, not at the end
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert "gpukeeper: benchmark 'slow': 1,000,000 calls at about" in line
    assert "will take about" in line and (" min more" in line or " h more" in line)


def test_an_interrupted_bar_stops_where_the_run_did() -> None:
    import io

    from gpukeeper.base.progress import ProgressBar

    out = io.StringIO()
    bar = ProgressBar(1000, "benchmark", "calls", stream=out)
    bar.update(120)
    bar.close(137)
    assert "137/1000" in out.getvalue() and "1000/1000" not in out.getvalue()

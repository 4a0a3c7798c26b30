"""Launch-latency gates: ``_core.StreamGate``, ``_core.Event``, ``_core.synchronize``,
``CUDATimer(hide_launch_latency=...)``, the ``"gpukeeper"`` timer backend and
``benchmark_function(hide_launch_latency=..., gate_timeout_ms=...)``.

Three groups:

- argument checks and the CPU / no-GPU behaviour, run everywhere;
- the gate logic of ``CUDATimer`` and ``benchmark_function`` (gate closed before the
  start mark and opened after the stop mark, timeouts reported, fallback to ungated
  timing), run everywhere against a fake GPU backend and a fake gate module;
- the real thing on a GPU (marked ``gpu``; PyTorch with CUDA and the gate kernel
  needed), using ``_core.spin_kernel`` with ``out=`` for the kernel's own duration.

GPU tolerances compare medians of several readings (one reading can catch a
preemption or a clock change) and follow tests/cpp/test_stream_gate.cpp.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import time
import types
import warnings
from typing import Any, Dict, List, Optional

import pytest
from torch_cuda import torch_cuda

import gpukeeper
from gpukeeper import GpuError, InvalidInputError, _core
from gpukeeper.base.errors import DeviceError, TimingWarning
from gpukeeper.timing import (
    BenchmarkResult,
    CUDATimer,
    DeviceSpec,
    TimerBackend,
    available_backends,
    benchmark_function,
    register_backend,
    select_backend,
)
from gpukeeper.timing import throttle as throttle_module
from gpukeeper.timing import timer as timer_module
from gpukeeper.timing.timer import CoreBackend, check_gate_timeout

CUDA = bool(gpukeeper.cuda_available())
NO_GPU_ONLY = pytest.mark.skipif(CUDA, reason="checks the behaviour without a usable GPU")

BAD_TIMEOUTS = [0, 0.0, -1, -0.5, math.nan, math.inf, 3.6e6 + 1, True, False, "10", None, [5]]


def _noop() -> None:
    pass


def _busy(ms: float) -> None:
    """Spins for ``ms`` milliseconds of host time."""
    end = time.perf_counter_ns() + int(ms * 1e6)
    while time.perf_counter_ns() < end:
        pass


# ===================================================================== argument checks


@pytest.mark.parametrize("value", BAD_TIMEOUTS)
def test_check_gate_timeout_rejects(value: Any) -> None:
    with pytest.raises(InvalidInputError, match="gate_timeout_ms"):
        check_gate_timeout(value)


@pytest.mark.parametrize("value, expected", [(5, 5.0), (0.001, 0.001), (1000.0, 1000.0), (3.6e6, 3.6e6)])
def test_check_gate_timeout_accepts(value: Any, expected: float) -> None:
    got = check_gate_timeout(value)
    assert isinstance(got, float) and got == expected


@pytest.mark.parametrize("value", ["yes", 1, 0, None, 1.0])
def test_timer_hide_flag_must_be_a_bool(value: Any) -> None:
    with pytest.raises(InvalidInputError, match="hide_launch_latency"):
        CUDATimer(device="cpu", hide_launch_latency=value)


@pytest.mark.parametrize("value", BAD_TIMEOUTS)
def test_timer_rejects_bad_gate_timeouts(value: Any) -> None:
    with pytest.raises(InvalidInputError, match="gate_timeout_ms"):
        CUDATimer(device="cpu", gate_timeout_ms=value)
    with pytest.raises(InvalidInputError):  # checked whether or not latency is hidden
        CUDATimer(device="cpu", hide_launch_latency=True, gate_timeout_ms=value)


@pytest.mark.parametrize("value", ["yes", 1, 0, 1.0, "False"])
def test_benchmark_hide_flag_must_be_a_bool_or_none(value: Any) -> None:
    with pytest.raises(InvalidInputError, match="hide_launch_latency"):
        benchmark_function(_noop, n_calls=2, warmup=0, device="cpu", hide_launch_latency=value)


@pytest.mark.parametrize("value", [v for v in BAD_TIMEOUTS if v is not None])
def test_benchmark_rejects_bad_gate_timeouts(value: Any) -> None:
    with pytest.raises(InvalidInputError, match="gate_timeout_ms"):
        benchmark_function(_noop, n_calls=2, warmup=0, device="cpu", gate_timeout_ms=value)


@pytest.mark.parametrize("timeout_ms", [0, -1, math.nan, math.inf, True, "10", 3.6e6 + 1])
def test_stream_gate_rejects_bad_timeouts(timeout_ms: Any) -> None:
    # Checked before any device is touched: the same error with or without a GPU.
    with pytest.raises(InvalidInputError):
        _core.StreamGate(0, 0, timeout_ms)
    with pytest.raises(InvalidInputError):
        _core.StreamGate(timeout_ms=timeout_ms)


@pytest.mark.parametrize("kw", [{"device": -1}, {"device": -2}, {"device": True}, {"device": "0"},
                                {"device": 1.5}, {"stream": "default"}, {"stream": 1.5},
                                {"stream": True}, {"stream": object()}])
def test_stream_gate_rejects_bad_devices_and_streams(kw: Dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        _core.StreamGate(**kw)


@pytest.mark.parametrize("device", [-1, -2, True, "0", 1.5])
def test_event_and_synchronize_reject_bad_devices(device: Any) -> None:
    with pytest.raises(InvalidInputError):
        _core.Event(device)
    with pytest.raises(InvalidInputError):
        _core.synchronize(device)


@pytest.mark.quiet_machine
def test_core_timer_hide_flag_on_the_cpu_is_moot() -> None:
    t = _core.Timer(-1, 0, hide_launch_latency=True)
    assert not t.is_gpu and not t.hides_launch_latency
    t.start()
    time.sleep(0.01)
    t.stop()
    assert t.launch_hidden() is False
    assert 9.5 <= t.elapsed_ms() < 500.0  # the steady clock, nothing hidden or subtracted
    with pytest.raises(InvalidInputError):
        _core.Timer(-1, 0, hide_launch_latency=True, gate_timeout_ms=0)


def test_timing_warning_is_a_user_warning() -> None:
    assert issubclass(TimingWarning, UserWarning)
    assert not issubclass(TimingWarning, GpuError)


# ===================================================================== the CPU


@pytest.mark.quiet_machine
def test_cpu_timer_with_hide_flag_is_moot() -> None:
    t = CUDATimer("host", device="cpu", hide_launch_latency=True, gate_timeout_ms=5)
    assert t.backend == "cpu" and not t.is_gpu
    assert t.hides_launch_latency is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no TimingWarning on the host clock
        with t:
            time.sleep(0.002)
        assert 1.9 <= t.elapsed_ms < 250.0
        assert t.raw_elapsed_ms == t.elapsed_ms and t.floor_ms == 0.0
        assert t.launch_hidden is None
    assert "launch latency hidden" not in repr(t)
    # the plain timer says the same
    plain = CUDATimer(device="cpu")
    assert plain.hides_launch_latency is False and plain.launch_hidden is None


@pytest.mark.parametrize("hide", [None, True, False])
def test_cpu_benchmark_launch_latency_is_na(hide: Optional[bool]) -> None:
    r = benchmark_function(_noop, n_calls=5, warmup=2, device="cpu", hide_launch_latency=hide,
                           gate_timeout_ms=10.0)
    assert r.timing == "host" and r.backend == "cpu"
    assert r.launch_latency == "n/a"
    assert r.n_calls == 5
    assert not any(w.startswith("launch latency") for w in r.warnings)


def test_cpu_benchmark_launch_latency_round_trips() -> None:
    r = benchmark_function(_noop, n_calls=4, warmup=0, device="cpu", hide_launch_latency=True)
    data = r.to_dict()
    assert data["launch_latency"] == "n/a"
    assert BenchmarkResult.from_dict(data).launch_latency == "n/a"
    assert json.loads(r.to_json())["launch_latency"] == "n/a"
    assert BenchmarkResult.from_json(r.to_json()).to_dict() == data


@pytest.mark.parametrize("value", ["hidden", "included", "n/a"])
def test_result_launch_latency_round_trips(value: str) -> None:
    r = BenchmarkResult("k", [0.01, 0.012], host_times_ms=[0.02, 0.025], gpu_times_ms=[0.01, 0.012],
                        timing="gpu", device="cuda:0", backend="torch", launch_latency=value)
    data = r.to_dict()
    assert data["launch_latency"] == value
    back = BenchmarkResult.from_dict(data)
    assert back.launch_latency == value
    assert BenchmarkResult.from_json(r.to_json()).launch_latency == value
    assert back.to_dict() == data
    assert f"launch latency {value} in the GPU times" in r.summary()


def test_result_without_launch_latency_field_reads_as_na() -> None:
    # A dict written before the field existed.
    data = BenchmarkResult("old", [1.0, 2.0]).to_dict()
    del data["launch_latency"]
    assert BenchmarkResult.from_dict(data).launch_latency == "n/a"


@NO_GPU_ONLY
def test_no_gpu_stream_gates_are_unavailable() -> None:
    assert _core.stream_gates_available() is False
    assert timer_module.gates() is None


@NO_GPU_ONLY
@pytest.mark.parametrize("kw", [{}, {"stream": 0, "device": 0}, {"timeout_ms": 5.0}])
def test_no_gpu_stream_gate_raises_a_gpu_error(kw: Dict[str, Any]) -> None:
    with pytest.raises(GpuError) as info:
        _core.StreamGate(**kw)
    assert isinstance(info.value, DeviceError)


@NO_GPU_ONLY
def test_no_gpu_event_synchronize_and_slot_stats_raise_gpu_errors() -> None:
    with pytest.raises(GpuError):
        _core.Event()
    with pytest.raises(GpuError):
        _core.Event(0)
    with pytest.raises(GpuError):
        _core.synchronize()
    with pytest.raises(GpuError):
        _core.synchronize(0)
    with pytest.raises(GpuError):
        _core.gate_slot_stats(0)


@NO_GPU_ONLY
def test_no_gpu_cuda_timing_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="CUDA"):
        select_backend("cuda")
    with pytest.raises(InvalidInputError):
        select_backend("cuda:0", backend="gpukeeper")
    with pytest.raises(InvalidInputError):
        CUDATimer(device="cuda", hide_launch_latency=True)
    with pytest.raises(InvalidInputError):
        benchmark_function(_noop, n_calls=2, warmup=0, device="cuda", hide_launch_latency=True)
    with pytest.raises(InvalidInputError, match="gpukeeper"):
        CoreBackend(DeviceSpec("cuda", 0))
    assert "gpukeeper" not in available_backends("cpu")


def test_gpukeeper_backend_cannot_time_the_cpu() -> None:
    with pytest.raises(InvalidInputError, match="gpukeeper"):
        select_backend("cpu", backend="gpukeeper")
    with pytest.raises(InvalidInputError):
        CUDATimer(device="cpu", backend="gpukeeper")
    with pytest.raises(InvalidInputError):
        CoreBackend(DeviceSpec("cpu"))


# ===================================================================== gate logic (fake GPU)


class FakeGate:
    """A gate of ``FakeGates``: times out when the timed code waited behind it."""

    def __init__(self, owner: "FakeGates", stream: Any, device: int, timeout_ms: float) -> None:
        self.owner = owner
        self.stream = stream
        self.device = device
        self.timeout_ms = timeout_ms
        self.is_open = False
        self.waited = False
        self.outcome = "pending"

    def open(self) -> None:
        if self.is_open:
            return
        self.is_open = True
        self.outcome = "timed_out" if self.waited else "opened"
        self.owner.log.append("open")


class FakeGates:
    """Stands in for ``_core``'s gate API (what ``timer.gates()`` returns)."""

    def __init__(self, log: List[str], floor_ms: float = 0.0) -> None:
        self.log = log
        self.made: List[FakeGate] = []
        self.floor_ms = floor_ms

    def launch_floor_ms(self, device: int = 0, refresh: bool = False) -> float:
        return self.floor_ms

    def StreamGate(self, stream: Any, device: int, timeout_ms: float) -> FakeGate:  # noqa: N802
        gate = FakeGate(self, stream, device, timeout_ms)
        self.made.append(gate)
        self.log.append("close")
        return gate

    def host_waits(self) -> None:
        """What a synchronize inside the timed code does to every closed gate."""
        for gate in self.made:
            if not gate.is_open:
                gate.waited = True


class FakeGpuBackend(TimerBackend):
    """``is_gpu`` marks on the host clock, logging what happens on the fake stream."""

    name = "fakegpu"
    is_gpu = True
    STREAM = "fake-stream"

    def __init__(self, device: DeviceSpec, state: types.SimpleNamespace) -> None:
        super().__init__(device)
        self.state = state

    def current_stream(self) -> Any:
        return self.STREAM

    def new_event(self) -> List[float]:
        return [0.0]

    def record(self, event: List[float], stream: Any) -> None:
        if self.state.fail_record:
            raise RuntimeError("record failed")
        self.state.log.append("record")
        event[0] = time.perf_counter_ns() / 1e6

    def elapsed_ms(self, start: List[float], end: List[float]) -> float:
        return end[0] - start[0]


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):
    """A registered GPU-like backend (chosen for every device) and fake gates in place
    of ``_core``'s where every timer (and so benchmark_function) takes them."""
    log: List[str] = []
    state = types.SimpleNamespace(log=log, gates=FakeGates(log), no_gates=False, fail_record=False)

    def gates() -> Any:
        return None if state.no_gates else state.gates

    monkeypatch.setattr(timer_module, "gates", gates)
    monkeypatch.setattr(throttle_module, "nvml_sample", lambda index: (None, "unavailable: fake GPU"))
    register_backend("fakegpu", lambda spec: FakeGpuBackend(spec, state), lambda spec: True, priority=1000)
    try:
        yield state
    finally:
        del timer_module._BACKENDS["fakegpu"]


def _fake_timer(**kw: Any) -> CUDATimer:
    return CUDATimer("fake", device="cpu", backend="fakegpu", **kw)


@pytest.mark.quiet_machine
def test_fake_timer_gates_the_interval(fake_gpu: types.SimpleNamespace) -> None:
    t = _fake_timer(hide_launch_latency=True, gate_timeout_ms=12.5)
    assert t.is_gpu and t.hides_launch_latency
    assert fake_gpu.log == []  # nothing is closed before start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with t:
            assert fake_gpu.log == ["close", "record"]  # gate first, then the start mark
            gate = fake_gpu.gates.made[-1]
            assert not gate.is_open
            _busy(2)
        assert fake_gpu.log == ["close", "record", "record", "open"]  # stop mark, then open
        assert 2.0 <= t.elapsed_ms < 100.0
        assert t.launch_hidden is True
    assert gate.timeout_ms == 12.5
    assert gate.stream == FakeGpuBackend.STREAM and gate.device == 0
    assert "launch latency hidden" in repr(t)


@pytest.mark.quiet_machine
def test_fake_timer_warns_when_the_gate_times_out(fake_gpu: types.SimpleNamespace) -> None:
    fake_gpu.gates.floor_ms = 0.25
    t = _fake_timer(hide_launch_latency=True, gate_timeout_ms=20)
    with t:
        _busy(2)
        fake_gpu.gates.host_waits()  # e.g. torch.cuda.synchronize() inside the region
    with pytest.warns(TimingWarning, match="launch latency was not hidden"):
        ms = t.elapsed_ms
    # a timed-out reading holds the wait: the floor is not subtracted from it
    assert ms == t.raw_elapsed_ms and 2.0 <= ms < 100.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning comes once per measurement
        assert t.launch_hidden is False
        assert t.elapsed_ms == ms
    # The next measurement gets a new gate; one that opens in time reads as hidden again.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with t:
            pass
        assert t.launch_hidden is True
    assert len(fake_gpu.gates.made) == 2


def test_fake_timer_launch_hidden_warns_when_read_first(fake_gpu: types.SimpleNamespace) -> None:
    t = _fake_timer(hide_launch_latency=True)
    with t:
        fake_gpu.gates.host_waits()
    with pytest.warns(TimingWarning):
        assert t.launch_hidden is False


def test_fake_timer_opens_the_gate_when_things_go_wrong(fake_gpu: types.SimpleNamespace) -> None:
    t = _fake_timer(hide_launch_latency=True)
    with pytest.raises(KeyError):
        with t:
            raise KeyError("body failed")
    assert fake_gpu.gates.made[-1].is_open and not t.running
    fake_gpu.fail_record = True
    with pytest.raises(RuntimeError, match="record failed"):
        t.start()
    assert fake_gpu.gates.made[-1].is_open  # never leaves the stream held
    assert not t.running


def test_fake_timer_without_the_flag_closes_no_gate(fake_gpu: types.SimpleNamespace) -> None:
    t = _fake_timer()
    assert not t.hides_launch_latency
    with t:
        pass
    assert t.launch_hidden is None
    assert fake_gpu.gates.made == [] and fake_gpu.log == ["record", "record"]


def test_fake_timer_without_a_gate_kernel_is_a_gpu_error(fake_gpu: types.SimpleNamespace) -> None:
    fake_gpu.no_gates = True
    with pytest.raises(GpuError, match="gate kernel"):
        _fake_timer(hide_launch_latency=True)
    assert _fake_timer().launch_hidden is None  # without the flag nothing is needed


@pytest.mark.quiet_machine
def test_fake_time_call_gates_and_subtracts_the_floor(fake_gpu: types.SimpleNamespace) -> None:
    fake_gpu.gates.floor_ms = 0.5
    t = _fake_timer(hide_launch_latency=True, gate_timeout_ms=9.0)

    def flush(stream: Any) -> None:
        fake_gpu.log.append(f"prepare {stream}")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        took = t.time_call(_busy, (2,), prepare=flush)
    # gate, then what prepare queues, then the bracket; the gate opens after the stop mark
    assert fake_gpu.log == ["close", f"prepare {FakeGpuBackend.STREAM}", "record", "record", "open"]
    assert fake_gpu.gates.made[-1].timeout_ms == 9.0
    assert took.launch_hidden is True and t.launch_hidden is True
    assert took.elapsed_ms == pytest.approx(t.raw_elapsed_ms - 0.5) and took.elapsed_ms == t.elapsed_ms
    assert 1.5 <= took.elapsed_ms < 100.0
    assert took.host_ms >= t.raw_elapsed_ms  # launch plus wait holds the whole bracket


@pytest.mark.quiet_machine
def test_fake_time_call_reports_a_timeout_without_a_warning(fake_gpu: types.SimpleNamespace) -> None:
    fake_gpu.gates.floor_ms = 0.5
    t = _fake_timer(hide_launch_latency=True)

    def waits() -> str:
        _busy(1)
        fake_gpu.gates.host_waits()
        return "done"

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the caller decides; the timer does not warn
        took = t.time_call(waits)
        assert took.launch_hidden is False and t.launch_hidden is False
        assert took.result == "done"
        assert took.elapsed_ms == t.raw_elapsed_ms >= 1.0  # nothing subtracted
    assert fake_gpu.gates.made[-1].is_open


def test_fake_time_call_opens_the_gate_when_fn_raises(fake_gpu: types.SimpleNamespace) -> None:
    t = _fake_timer(hide_launch_latency=True)

    def broken() -> None:
        raise KeyError("inside fn")

    with pytest.raises(KeyError):
        t.time_call(broken)
    assert fake_gpu.gates.made[-1].is_open and not t.running
    with pytest.raises(KeyError):
        t.time_call(_noop, prepare=lambda stream: broken())
    assert fake_gpu.gates.made[-1].is_open and len(fake_gpu.gates.made) == 2


@pytest.mark.quiet_machine
def test_fake_timer_stops_and_starts_hiding(fake_gpu: types.SimpleNamespace) -> None:
    fake_gpu.gates.floor_ms = 0.25
    t = _fake_timer(hide_launch_latency=True)
    t.hides_launch_latency = False
    assert not t.hides_launch_latency and t.floor_ms == 0.0
    took = t.time_call(_busy, (1,))
    assert took.launch_hidden is None and fake_gpu.gates.made == []
    assert took.elapsed_ms == t.raw_elapsed_ms >= 1.0
    t.hides_launch_latency = True
    assert t.hides_launch_latency and t.floor_ms == 0.25
    assert t.time_call(_noop).launch_hidden is True and len(fake_gpu.gates.made) == 1
    with pytest.raises(InvalidInputError):
        t.hides_launch_latency = 1  # type: ignore[assignment]
    t.start()
    with pytest.raises(GpuError, match="running"):
        t.hides_launch_latency = False
    t.stop()
    fake_gpu.no_gates = True
    with pytest.raises(GpuError, match="gate kernel"):
        t.hides_launch_latency = True
    assert t.hides_launch_latency and t.floor_ms == 0.25  # unchanged by the failure
    t.hides_launch_latency = False  # needs nothing
    assert not t.hides_launch_latency


def _no_launch_warnings(r: BenchmarkResult) -> bool:
    return not any(w.startswith("launch latency") for w in r.warnings)


def test_fake_benchmark_gates_every_call(fake_gpu: types.SimpleNamespace) -> None:
    r = benchmark_function(_noop, n_calls=5, warmup=3, device="cpu")
    assert r.backend == "fakegpu" and r.timing == "gpu"
    assert r.launch_latency == "hidden" and _no_launch_warnings(r)
    made = fake_gpu.gates.made
    assert len(made) == 1 + 5  # the probing warm-up call and each measured call
    assert all(g.outcome == "opened" for g in made)
    assert all(g.stream == FakeGpuBackend.STREAM and g.device == 0 for g in made)
    # default timeout: 20 x the slowest warm-up call, within 50 ms .. 2 s; the probe's
    # is the measured calls' own
    assert all(50.0 <= g.timeout_ms <= 2000.0 for g in made)
    assert len({g.timeout_ms for g in made}) == 1
    # each measured call: gate closed, start mark, stop mark, gate opened
    assert fake_gpu.log[-4 * 5:] == ["close", "record", "record", "open"] * 5


def test_fake_benchmark_passes_the_gate_timeout(fake_gpu: types.SimpleNamespace) -> None:
    r = benchmark_function(_noop, n_calls=3, warmup=2, device="cpu", hide_launch_latency=True,
                           gate_timeout_ms=7.5)
    assert r.launch_latency == "hidden"
    assert [g.timeout_ms for g in fake_gpu.gates.made] == [7.5] * 4


def test_fake_benchmark_without_warmup_has_no_probe(fake_gpu: types.SimpleNamespace) -> None:
    r = benchmark_function(_noop, n_calls=4, warmup=0, device="cpu")
    assert r.launch_latency == "hidden" and len(fake_gpu.gates.made) == 4


def test_fake_benchmark_probe_finds_a_waiting_function(fake_gpu: types.SimpleNamespace) -> None:
    calls = {"n": 0}

    def waits() -> None:
        calls["n"] += 1
        fake_gpu.gates.host_waits()

    r = benchmark_function(waits, n_calls=6, warmup=3, device="cpu")
    assert r.launch_latency == "included"
    assert len(fake_gpu.gates.made) == 1  # only the probe: measured calls run ungated
    assert fake_gpu.gates.made[0].outcome == "timed_out"
    found = [w for w in r.warnings if w.startswith("launch latency included")]
    assert len(found) == 1 and "warm-up" in found[0]
    assert len(r.gpu_times_ms) == 6 and r.bound == "sync"
    # the warm-up, the measured calls, then the loop's rounds (and their pilot round)
    assert calls["n"] > 3 + 6 + r.loop_calls * len(r.loop_times_ms)


def test_fake_benchmark_remeasures_a_timed_out_call(fake_gpu: types.SimpleNamespace) -> None:
    calls = {"n": 0}

    def waits_from_the_second_measured_call() -> None:
        calls["n"] += 1
        if calls["n"] >= 4:  # 2 warm-up calls, then measured calls 1, 2, ...
            fake_gpu.gates.host_waits()

    r = benchmark_function(waits_from_the_second_measured_call, n_calls=5, warmup=2, device="cpu",
                           gate_timeout_ms=30)
    assert r.launch_latency == "included"
    outcomes = [g.outcome for g in fake_gpu.gates.made]
    assert outcomes == ["opened", "opened", "timed_out"]  # probe, measured 1, measured 2
    found = [w for w in r.warnings if w.startswith("launch latency included")]
    assert len(found) == 1 and "measured call" in found[0] and "30 ms" in found[0]
    # the timed-out call is measured again, so the result still has n_calls times
    assert len(r.gpu_times_ms) == 5 and r.bound == "sync"
    assert calls["n"] > 2 + 5 + 1 + r.loop_calls * len(r.loop_times_ms)


def test_fake_benchmark_hide_false_closes_no_gate(fake_gpu: types.SimpleNamespace) -> None:
    r = benchmark_function(_noop, n_calls=3, warmup=2, device="cpu", hide_launch_latency=False)
    assert r.launch_latency == "included" and _no_launch_warnings(r)
    assert fake_gpu.gates.made == []


def test_fake_benchmark_without_a_gate_kernel(fake_gpu: types.SimpleNamespace) -> None:
    fake_gpu.no_gates = True
    r = benchmark_function(_noop, n_calls=3, warmup=1, device="cpu")  # None: falls back quietly
    assert r.launch_latency == "included"
    with pytest.raises(GpuError, match="gate kernel"):
        benchmark_function(_noop, n_calls=3, warmup=1, device="cpu", hide_launch_latency=True)


# ===================================================================== GPU

# Everything below needs PyTorch with CUDA and gpukeeper's gate kernel; the ``gpu``
# marker skips it without a usable device (conftest.py).


def _torch_gates() -> Any:
    torch = torch_cuda()
    if not _core.stream_gates_available():
        pytest.skip("built without CUDA: no gate kernel")
    stream = torch.cuda.current_stream()
    _core.spin_kernel(0, stream)  # kernel module loaded before anything is timed
    torch.cuda.synchronize()
    return torch


def _median_error_ns(torch: Any, timer: CUDATimer, ns: int, stream: Any, reps: int = 21) -> float:
    """Median of (timer reading - the kernel's own %globaltimer duration), in ns, for a
    spin kernel of ``ns`` started on an idle ``stream``."""
    out = torch.zeros(2, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    errors = []
    for _ in range(reps):
        torch.cuda.synchronize()  # idle stream: the launch latency is in front of the kernel
        with timer:
            _core.spin_kernel(ns, stream, out=out.data_ptr())
        ms = timer.elapsed_ms
        if timer.hides_launch_latency:
            assert timer.launch_hidden is True
        first, last = out.tolist()
        assert last - first >= ns
        errors.append(ms * 1e6 - (last - first))
    return statistics.median(errors)


@pytest.mark.gpu
def test_gpu_gate_holds_the_stream_until_opened() -> None:
    torch = _torch_gates()
    s = torch.cuda.current_stream()
    gate = _core.StreamGate(s, torch.cuda.current_device(), 2000.0)
    assert not gate.is_open and gate.outcome == "pending"
    assert gate.stream == s.cuda_stream and gate.timeout_ms == pytest.approx(2000.0)
    assert "closed" in repr(gate)
    _core.spin_kernel(1000, s)
    time.sleep(0.02)
    assert s.query() is False  # the kernel waits behind the gate
    assert gate.outcome == "pending"
    gate.open()
    gate.open()  # idempotent
    assert gate.is_open
    torch.cuda.synchronize()
    assert gate.outcome == "opened"
    assert s.query() is True


@pytest.mark.gpu
def test_gpu_gate_as_a_context_manager_opens_on_exit() -> None:
    torch = _torch_gates()
    s = torch.cuda.current_stream()
    with _core.StreamGate(s) as gate:
        _core.spin_kernel(1000, s)
        assert not gate.is_open
    assert gate.is_open
    _core.synchronize()
    assert gate.outcome == "opened"


@pytest.mark.quiet_machine
@pytest.mark.gpu
def test_gpu_unopened_gate_times_out() -> None:
    torch = _torch_gates()
    s = torch.cuda.current_stream()
    gate = _core.StreamGate(s, timeout_ms=5)
    _core.spin_kernel(1000, s)
    t0 = time.perf_counter()
    torch.cuda.synchronize()  # would hang without the timeout
    assert time.perf_counter() - t0 < 1.0
    assert gate.outcome == "timed_out"
    del gate


@pytest.mark.gpu
def test_gpu_gate_slots_are_reused() -> None:
    torch = _torch_gates()
    s = torch.cuda.current_stream()
    t = CUDATimer(hide_launch_latency=True)
    for _ in range(10):
        with t:
            _core.spin_kernel(1000, s)
        assert t.launch_hidden is True
    torch.cuda.synchronize()
    gc.collect()
    created = _core.gate_slot_stats(0)["created"]
    for _ in range(100):
        with t:
            _core.spin_kernel(1000, s)
        assert t.launch_hidden is True
    torch.cuda.synchronize()
    stats = _core.gate_slot_stats(0)
    assert stats["created"] == created
    assert stats["retiring"] == 0


@pytest.mark.quiet_machine
@pytest.mark.gpu
def test_gpu_core_events() -> None:
    torch = _torch_gates()
    s = torch.cuda.current_stream()
    a, b = _core.Event(), _core.Event(0)
    assert not a.recorded and a.query() and a.device == 0
    with pytest.raises(InvalidInputError):
        a.elapsed_ms(b)  # neither was recorded
    a.record(s)
    _core.spin_kernel(50_000, s)
    b.record(s)
    assert a.elapsed_ms(b) >= 0.049
    assert b.query() and b.recorded
    _core.synchronize()
    _core.synchronize(0)


@pytest.mark.gpu
def test_gpu_calibrate_reports_launch_hidden() -> None:
    torch = _torch_gates()
    got = _core.calibrate(10_000, torch.cuda.current_stream(), 0, hide_launch_latency=True)
    assert set(got) == {"requested_ns", "kernel_ns", "event_ms", "launch_hidden"}
    assert got["requested_ns"] == 10_000 and got["kernel_ns"] >= 10_000
    assert got["launch_hidden"] is True
    assert _core.calibrate(10_000)["launch_hidden"] is False


@pytest.mark.gpu
def test_gpu_hidden_timer_reads_the_kernel_alone() -> None:
    torch = _torch_gates()
    s = torch.cuda.current_stream()
    hidden = CUDATimer(hide_launch_latency=True)
    assert hidden.backend == "torch" and hidden.hides_launch_latency
    hidden_error = _median_error_ns(torch, hidden, 10_000, s)
    plain = CUDATimer()
    assert not plain.hides_launch_latency and plain.launch_hidden is None
    plain_error = _median_error_ns(torch, plain, 10_000, s)
    assert -500.0 <= hidden_error <= 500.0, (hidden_error, plain_error)
    # Without the gate the launch latency of the kernel is in the reading.
    assert plain_error > hidden_error, (hidden_error, plain_error)


@pytest.mark.gpu
def test_gpu_floor_kernel_sits_behind_the_gate() -> None:
    torch = _torch_gates()
    s = torch.cuda.current_stream()
    a, b = _core.Event(), _core.Event()
    gate = _core.StreamGate(s, torch.cuda.current_device(), 2000.0)
    a.record(s)
    gate.queue_floor_kernel()
    b.record(s)
    gate.open()
    floor_ms = a.elapsed_ms(b)
    assert gate.outcome == "opened"
    assert 0.0 < floor_ms < 0.02  # one empty bracket: a few microseconds of the device's
    with pytest.raises(InvalidInputError, match="closed gate"):
        gate.queue_floor_kernel()  # open: the kernel would not be behind it
    # the timer's floor is the in-place brackets' median, near the process's floor
    t = CUDATimer(hide_launch_latency=True)
    process = _core.launch_floor_ms(0)
    for _ in range(30):
        t.time_call(_core.spin_kernel, (10_000, s))
    assert abs(t.floor_ms - process) < 0.002, (t.floor_ms, process)


@pytest.mark.quiet_machine
@pytest.mark.gpu
def test_gpu_hidden_timer_around_a_synchronize_warns() -> None:
    torch = _torch_gates()
    t = CUDATimer("syncs", hide_launch_latency=True, gate_timeout_ms=20)
    t0 = time.perf_counter()
    with t:
        torch.cuda.synchronize()  # waits for the gate: it times out after 20 ms
    with pytest.warns(TimingWarning, match="not hidden"):
        _ = t.elapsed_ms
    assert t.launch_hidden is False
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.quiet_machine
@pytest.mark.gpu
def test_gpu_benchmark_hides_the_launch_latency() -> None:
    torch = _torch_gates()
    s = torch.cuda.current_stream()
    r = benchmark_function(lambda: _core.spin_kernel(10_000, s), n_calls=50)
    assert r.timing == "gpu" and r.launch_latency == "hidden"
    assert _no_launch_warnings(r)
    assert len(r.gpu_times_ms) == 50
    median_us = r.device_median_ms * 1e3
    # The target: within 0.5 us of the kernel's duration (10 us plus a few ns of spin).
    assert 9.5 <= median_us <= 10.6, r.summary()
    assert r.host_median_ms >= r.device_median_ms * 0.9  # the host waited for each call
    # back to back, a 10 us kernel keeps the device busy; the loop also pays the ~2 us gap
    # before each next kernel (H100: 12.0 us against 9.9 us)
    assert r.bound == "device" and r.loop_median_ms == pytest.approx(r.device_median_ms + 0.002, rel=0.15)


@pytest.mark.gpu
def test_gpu_benchmark_ungated_reads_more() -> None:
    torch = _torch_gates()
    s = torch.cuda.current_stream()
    hidden = benchmark_function(lambda: _core.spin_kernel(10_000, s), n_calls=30, warmup=3)
    plain = benchmark_function(lambda: _core.spin_kernel(10_000, s), n_calls=30, warmup=3,
                               hide_launch_latency=False)
    assert hidden.launch_latency == "hidden" and plain.launch_latency == "included"
    assert _no_launch_warnings(plain)
    assert plain.device_median_ms > hidden.device_median_ms, (plain.device_median_ms, hidden.device_median_ms)


@pytest.mark.quiet_machine
@pytest.mark.gpu
def test_gpu_benchmark_of_a_synchronizing_function_falls_back() -> None:
    torch = _torch_gates()
    s = torch.cuda.current_stream()

    def spin_and_wait() -> None:
        _core.spin_kernel(10_000, s)
        torch.cuda.synchronize()

    t0 = time.perf_counter()
    r = benchmark_function(spin_and_wait, n_calls=20, warmup=3)
    assert time.perf_counter() - t0 < 5.0
    assert r.launch_latency == "included"
    found = [w for w in r.warnings if w.startswith("launch latency included")]
    assert len(found) == 1 and "warm-up" in found[0]
    assert len(r.gpu_times_ms) == 20 and r.device_median_ms * 1e3 >= 9.9
    assert r.bound == "sync" and r.median_ms * 1e3 >= 9.9


@pytest.mark.quiet_machine
@pytest.mark.gpu
def test_gpu_benchmark_remeasures_a_timed_out_call() -> None:
    torch = _torch_gates()
    s = torch.cuda.current_stream()

    def spin_and_wait() -> None:
        _core.spin_kernel(10_000, s)
        torch.cuda.synchronize()

    t0 = time.perf_counter()
    # no warm-up: no probe, so the first measured call finds the stall
    r = benchmark_function(spin_and_wait, n_calls=10, warmup=0, gate_timeout_ms=20)
    assert time.perf_counter() - t0 < 5.0
    assert r.launch_latency == "included"
    found = [w for w in r.warnings if w.startswith("launch latency included")]
    assert len(found) == 1 and "measured call" in found[0]
    # the timed-out call was measured again: still n_calls times, each holding the kernel
    assert len(r.gpu_times_ms) == 10
    assert min(r.gpu_times_ms) * 1e3 >= 9.9


@pytest.mark.gpu
def test_gpu_gpukeeper_backend_times_100_us() -> None:
    torch = _torch_gates()
    s = torch.cuda.current_stream()
    out = torch.zeros(2, dtype=torch.int64, device="cuda")
    t = CUDATimer(backend="gpukeeper")
    assert t.backend == "gpukeeper" and t.is_gpu and not t.hides_launch_latency
    readings, kernels = [], []
    for _ in range(7):
        torch.cuda.synchronize()
        # A kernel in front keeps the stream busy until the timed one is queued: no launch
        # latency in the reading, without a gate.
        _core.spin_kernel(200_000, s)
        with t:
            _core.spin_kernel(100_000, s, out=out.data_ptr())
        readings.append(t.elapsed_ms * 1e6)
        first, last = out.tolist()
        kernels.append(last - first)
    # The gpukeeper backend records on the int handle of torch's current stream.
    assert t.stream == s.cuda_stream
    reading = statistics.median(readings)
    assert 0.95 * 100_000 <= reading <= 1.05 * 100_000, readings
    assert reading == pytest.approx(statistics.median(kernels), rel=0.05)


@pytest.mark.gpu
def test_gpu_gpukeeper_backend_hidden_on_an_explicit_stream() -> None:
    torch = _torch_gates()
    side = torch.cuda.Stream()
    t = CUDATimer(backend="gpukeeper", stream=side.cuda_stream, hide_launch_latency=True)
    assert t.backend == "gpukeeper" and t.hides_launch_latency
    readings = []
    for _ in range(5):
        torch.cuda.synchronize()
        with t:
            _core.spin_kernel(100_000, side)
        assert t.launch_hidden is True
        readings.append(t.elapsed_ms * 1e3)
    assert t.stream == side.cuda_stream
    assert 95.0 <= statistics.median(readings) <= 105.0, readings


@pytest.mark.gpu
def test_gpu_hidden_timer_on_a_side_stream() -> None:
    torch = _torch_gates()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = CUDATimer(hide_launch_latency=True)
        error = _median_error_ns(torch, t, 10_000, side)
        assert t.stream == side
    assert -500.0 <= error <= 500.0, error


@pytest.mark.quiet_machine
def test_fake_timer_subtracts_the_launch_floor(fake_gpu: types.SimpleNamespace) -> None:
    fake_gpu.gates.floor_ms = 0.25
    t = _fake_timer(hide_launch_latency=True)
    assert t.floor_ms == 0.25
    with t:
        time.sleep(0.002)
    assert t.raw_elapsed_ms >= 2.0
    assert t.elapsed_ms == pytest.approx(t.raw_elapsed_ms - 0.25)
    # Never below zero: a bracket around nothing reads the floor, give or take.
    fake_gpu.gates.floor_ms = 1e6
    t = _fake_timer(hide_launch_latency=True)
    with t:
        pass
    assert t.elapsed_ms == 0.0
    # Without the gate nothing is subtracted.
    plain = _fake_timer()
    with plain:
        pass
    assert plain.floor_ms == 0.0 and plain.elapsed_ms == plain.raw_elapsed_ms


class InPlaceFloorGates(FakeGates):
    """Fake gates whose gates queue the empty kernel of an in-place floor bracket: on the
    host clock of the fake marks it lasts ``bracket_ms`` (each gate takes the next)."""

    def __init__(self, log: List[str], brackets_ms: List[float]) -> None:
        super().__init__(log, floor_ms=5.0)  # the process's floor: never the one subtracted
        self.brackets_ms = list(brackets_ms)

    def StreamGate(self, stream: Any, device: int, timeout_ms: float) -> FakeGate:  # noqa: N802
        gate = super().StreamGate(stream, device, timeout_ms)
        ms = self.brackets_ms.pop(0)

        def queue_floor_kernel() -> None:
            if gate.is_open:
                raise InvalidInputError("queue_floor_kernel needs a closed gate")
            self.log.append("floor")
            _busy(ms)

        gate.queue_floor_kernel = queue_floor_kernel  # type: ignore[attr-defined]
        return gate


def test_fake_timer_takes_the_floor_in_place(fake_gpu: types.SimpleNamespace) -> None:
    brackets = [0.2, 0.6, 0.4, 0.3] + [0.5] * (timer_module.FLOOR_WINDOW + 1)
    fake_gpu.gates = InPlaceFloorGates(fake_gpu.log, brackets)
    t = _fake_timer(hide_launch_latency=True)
    assert t.floor_ms == 5.0  # before a measurement: the process's floor
    seen: List[float] = []

    def flush(stream: Any) -> None:
        fake_gpu.log.append("prepare")

    for i in range(4):
        fake_gpu.log.clear()
        took = t.time_call(_busy, (1.0,), prepare=flush) if i % 2 else None
        if took is None:
            with t:
                _busy(1.0)
        seen.append(t._start[0] - t._floor_mark[0])  # the bracket the fake marks read
        # the floor's mark and kernel behind the gate (after what prepare queues), then
        # the measurement's start mark closes the bracket
        order = ["close"] + (["prepare"] if i % 2 else []) + ["record", "floor", "record", "record", "open"]
        assert fake_gpu.log == order
        assert t.floor_ms == pytest.approx(statistics.median(seen))
        assert t.elapsed_ms == pytest.approx(t.raw_elapsed_ms - statistics.median(seen))
    assert all(b >= a for a, b in zip(brackets, seen))  # each bracket holds its kernel
    # the median of the last FLOOR_WINDOW brackets: the early ones age out
    for _ in range(timer_module.FLOOR_WINDOW):
        with t:
            pass
        t.elapsed_ms  # noqa: B018 - a reading that is read
    assert t.floor_ms >= 0.5
    # switching the gate off and on starts over from the process's floor
    t.hides_launch_latency = False
    assert t.floor_ms == 0.0
    t.hides_launch_latency = True
    assert t.floor_ms == 5.0


@pytest.mark.quiet_machine
def test_fake_benchmark_subtracts_and_reports_the_floor(fake_gpu: types.SimpleNamespace) -> None:
    fake_gpu.gates.floor_ms = 0.5

    def work() -> None:
        time.sleep(0.002)

    r = benchmark_function(work, n_calls=5, warmup=1)
    assert r.launch_latency == "hidden" and r.gpu_floor_ms == 0.5
    assert all(1.5 <= t < 200.0 for t in r.gpu_times_ms)  # >= 2 ms of sleep, less the floor
    assert all(h >= g + 0.5 for h, g in zip(r.host_times_ms, r.gpu_times_ms))
    raw = benchmark_function(work, n_calls=5, warmup=1, hide_launch_latency=False)
    assert raw.launch_latency == "included" and raw.gpu_floor_ms is None

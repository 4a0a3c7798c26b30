"""The timing core's bindings: _core.Timer, _core.EventLog and the calibration kernels.

CPU paths run everywhere; GPU paths (marked ``gpu``) need a usable CUDA device.
"""

from __future__ import annotations

import threading
import time

import pytest

import gpukeeper
from gpukeeper import _core

CUDA = gpukeeper.cuda_available()


def test_cpu_timer_reads_a_sleep():
    t = _core.Timer(-1)
    assert not t.is_gpu and t.device == -1
    t.start()
    time.sleep(0.02)
    t.stop()
    assert t.ready()
    ms = t.elapsed_ms()
    assert 19.5 <= ms <= 250.0  # a sleep never ends early; a busy CI host may end it late
    assert t.elapsed_ms() == ms
    assert "cpu" in repr(t)


def test_timer_order_errors():
    t = _core.Timer(device=-1, stream=None)
    with pytest.raises(_core.InvalidInputError):
        t.stop()
    with pytest.raises(ValueError):  # InvalidInputError is a ValueError
        t.elapsed_ms()
    t.start()
    assert not t.ready()
    with pytest.raises(_core.InvalidInputError, match="before stop"):
        t.elapsed_ms()


@pytest.mark.parametrize("device", [-2, 1.5, "0", True])
def test_timer_rejects_bad_devices(device):
    with pytest.raises(_core.InvalidInputError):
        _core.Timer(device)
    with pytest.raises(_core.InvalidInputError):
        _core.EventLog(device)


def test_timer_rejects_bad_streams():
    with pytest.raises(_core.InvalidInputError):
        _core.Timer(-1, stream="default")


@pytest.mark.skipif(not CUDA, reason="needs a usable CUDA device")
def test_timer_on_device_0_uses_the_gpu():
    assert _core.Timer(0).is_gpu


@pytest.mark.quiet_machine
@pytest.mark.skipif(CUDA, reason="checks the fallback without a usable GPU")
def test_timer_without_gpu_falls_back_to_cpu():
    t = _core.Timer()  # device 0, no device: steady clock
    assert not t.is_gpu
    t.start()
    time.sleep(0.01)
    t.stop()
    assert 9.5 <= t.elapsed_ms() <= 250.0


def test_cpu_event_log_resolves_in_order():
    log = _core.EventLog(-1)
    assert not log.is_gpu
    log.mark("origin")
    time.sleep(0.005)
    log.mark("a")
    log.begin("outer")
    log.begin("inner")
    time.sleep(0.01)
    log.end()
    log.end()
    log.mark("b")
    assert len(log) == log.pending == 4
    assert log.ready()
    got = log.resolve()
    assert [label for label, _ in got] == ["a", "inner", "outer", "b"]
    ms = dict(got)
    # sleeps never end early; a busy CI host may end them late
    assert 4.9 <= ms["a"] <= 250.0
    assert 9.9 <= ms["inner"] <= 250.0
    assert ms["inner"] <= ms["outer"] <= ms["inner"] + 250.0
    assert ms["outer"] <= ms["b"] <= ms["outer"] + 250.0  # the lap from "a" holds "outer"
    log.mark("c")  # the last mark is the origin of the next lap
    assert [label for label, _ in log.resolve()] == ["c"]
    log.clear()
    assert log.resolve() == []


def test_event_log_unbalanced():
    log = _core.EventLog(-1)
    with pytest.raises(_core.InvalidInputError):
        log.end()
    log.begin("x")
    assert log.open == 1
    with pytest.raises(_core.InvalidInputError, match="still open"):
        log.resolve()
    log.end()
    assert [label for label, _ in log.resolve()] == ["x"]


def test_calibration_without_gpu():
    assert isinstance(_core.calibration_kernels_available(), bool)
    if CUDA and _core.calibration_kernels_available():
        pytest.skip("the kernels work here: test_calibrate_measures_spin_kernels checks them")
    with pytest.raises(_core.GpuError):
        _core.calibrate(10_000)
    if not _core.calibration_kernels_available():
        with pytest.raises(_core.DeviceError, match="nvcc"):
            _core.spin_kernel(10_000)
    if not CUDA:
        with pytest.raises(_core.GpuError):
            _core.event_pool_stats(0)


def test_spin_kernel_rejects_negative_durations():
    with pytest.raises(_core.InvalidInputError):
        _core.spin_kernel(-1)
    with pytest.raises(_core.InvalidInputError):
        _core.calibrate(-1)


# ---- GPU ------------------------------------------------------------------------------


def _need_kernels():
    if not _core.calibration_kernels_available():
        pytest.skip("built without CUDA: no calibration kernels")


@pytest.mark.quiet_machine
@pytest.mark.gpu
@pytest.mark.parametrize("ns", [10_000, 100_000, 1_000_000])
def test_calibrate_measures_spin_kernels(ns):
    _need_kernels()
    best = min((_core.calibrate(ns) for _ in range(5)),
               key=lambda c: abs(c["event_ms"] * 1e6 - c["kernel_ns"]))
    assert best["requested_ns"] == ns
    assert ns <= best["kernel_ns"] <= ns * 1.1 + 5_000
    event_ns = best["event_ms"] * 1e6
    assert best["kernel_ns"] - 1_500 <= event_ns <= best["kernel_ns"] * 1.05 + 15_000


@pytest.mark.quiet_machine
@pytest.mark.gpu
def test_gpu_timer_and_pool_reuse():
    _need_kernels()
    _core.spin_kernel(0)

    def round_():
        for _ in range(10):
            t = _core.Timer(0)
            t.start()
            _core.spin_kernel(20_000)
            t.stop()
            assert t.elapsed_ms() >= 0.019
        log = _core.EventLog(0)
        log.mark("origin")
        for _ in range(20):
            _core.spin_kernel(5_000)
            log.mark("step")
        got = log.resolve()
        assert len(got) == 20 and all(ms >= 0.0049 for _, ms in got)

    round_()
    created = _core.event_pool_stats(0)["created"]
    for _ in range(3):
        round_()
    assert _core.event_pool_stats(0)["created"] == created


@pytest.mark.quiet_machine
@pytest.mark.gpu
def test_gpu_elapsed_releases_the_gil():
    _need_kernels()
    _core.spin_kernel(0)
    t = _core.Timer(0)
    t.start()
    _core.spin_kernel(100_000_000)  # 100 ms
    t.stop()
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    th = threading.Thread(target=tick)
    th.start()
    try:
        assert t.elapsed_ms() >= 99.0
    finally:
        stop.set()
        th.join()
    assert len(ticks) > 10

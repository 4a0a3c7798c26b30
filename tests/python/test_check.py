"""``gpukeeper check`` (gpukeeper.cli.install_check): every check passes in CPU mode, the timing
check's reading is bounded, and its GPU path is right on a simulated device.

The GPU path times calibration kernels with ``CUDATimer`` (launch latency hidden, the
launch floor subtracted by the timer) against the kernels' own clock. Without a GPU it
runs here against a simulated device whose answer is known: a gated event pair costs
the device ``bracket`` ns of its own, an ungated kernel on an idle stream starts a
launch latency after its start mark. The real device is checked by the GPU round
(``scripts/gpu-check.sh`` runs ``gpukeeper check --require-gpu``).
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
from sim_device import ClockSimBackend, ClockSimDevice, ClockSimGates

import gpukeeper
from gpukeeper import _core
from gpukeeper.base import device_names as devices
from gpukeeper.cli import install_check as check_module
from gpukeeper.cli.install_check import CheckResult, run_checks
from gpukeeper.timing import register_backend
from gpukeeper.timing import timer as timer_module

CUDA = bool(gpukeeper.cuda_available())

CPU_CHECKS = ["build", "runtime", "pool[host]", "pool[host+exp]", "cleanup", "report", "timing"]


# --------------------------------------------------------------------- CPU mode


@pytest.mark.quiet_machine
@pytest.mark.skipif(CUDA, reason="checks CPU mode")
def test_every_check_passes_in_cpu_mode() -> None:
    results = list(run_checks())
    assert [r.name for r in results] == CPU_CHECKS
    assert all(r.ok for r in results), [(r.name, r.detail) for r in results if not r.ok]
    assert "CPU mode" in results[1].detail
    timing = results[-1]
    # The check itself times a 10 ms sleep with CUDATimer on the host clock.
    assert 9.0 <= timing.data["sleep_ms"] <= 60.0
    assert timing.data["sleep_ms"] / 1e3 <= timing.seconds < 5.0
    assert f"{timing.data['sleep_ms']:.2f} ms" in timing.detail


@pytest.mark.skipif(CUDA, reason="checks CPU mode")
def test_require_gpu_fails_without_one() -> None:
    results = {r.name: r for r in run_checks(require_gpu=True)}
    assert not results["runtime"].ok
    assert "a GPU was required" in results["runtime"].detail
    assert results["timing"].ok  # the host clock is still checked, and right


@pytest.mark.quiet_machine
def test_a_failing_check_is_a_result_not_a_crash() -> None:
    def broken() -> Any:
        raise ZeroDivisionError("inside a check")

    got = check_module._timed("broken", broken)
    assert isinstance(got, CheckResult) and not got.ok
    assert got.detail == "ZeroDivisionError: inside a check" and got.data == {}
    assert got.to_dict()["ok"] is False and 0.0 <= got.seconds < 5.0


# --------------------------------------------------------------------- simulated GPU


def _simulate(
    monkeypatch: pytest.MonkeyPatch, bracket_ns: int, floor_ns: int, empty_bracket_ns: Optional[int] = None
) -> ClockSimDevice:
    """Device 0 as the simulated device for the check's GPU path: gated brackets cost
    ``bracket_ns`` (``empty_bracket_ns`` around the empty kernel alone), the process's
    once-measured floor reads ``floor_ns``."""
    sim = ClockSimDevice(bracket_ns, empty_bracket_ns)
    gates = ClockSimGates(sim, floor_ns)
    monkeypatch.setattr(devices, "cuda_status", lambda: (1, ""))
    monkeypatch.setattr(check_module, "cuda_available", lambda: True)
    monkeypatch.setattr(_core, "calibration_kernels_available", lambda: True)
    monkeypatch.setattr(_core, "spin_kernel", sim.spin)
    monkeypatch.setattr(_core, "synchronize", lambda device=0: None)
    monkeypatch.setattr(timer_module, "gates", lambda: gates)
    # register_backend replaces the "gpukeeper" entry; setitem puts the real one back.
    monkeypatch.setitem(timer_module._BACKENDS, "gpukeeper", timer_module._BACKENDS["gpukeeper"])
    register_backend("gpukeeper", lambda spec: ClockSimBackend(spec, sim), lambda spec: spec.is_cuda, priority=5)
    return sim


@pytest.mark.skipif(CUDA, reason="simulates a GPU where there is none: the check's buffer would be real device memory here")
def test_simulated_gpu_timing_check_passes_with_the_right_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = _simulate(monkeypatch, bracket_ns=2_500, floor_ns=2_500)
    detail, data = check_module._check_timing(require_gpu=True)
    assert data["launch_floor_us"] == pytest.approx(2.5) and data["process_floor_us"] == pytest.approx(2.5)
    for key in ("10us", "100us", "1000us"):
        # hidden: kernel + bracket - floor = the kernel's own duration
        assert data[key]["hidden_error_us"] == pytest.approx(0.0, abs=1e-6)
        # plain: the launch latency in front of the kernel is in the reading
        assert data[key]["plain_error_us"] == pytest.approx(ClockSimDevice.LAUNCH_NS / 1e3)
    assert "floor taken in place 2.50 us subtracted" in detail and "plain event pair on 10 us: +4.00 us" in detail
    measured = [ns for ns in sim.kernels if ns]
    assert measured == [10_000] * 14 + [100_000] * 14 + [1_000_000] * 14  # 7 hidden + 7 plain each


@pytest.mark.skipif(CUDA, reason="simulates a GPU where there is none: the check's buffer would be real device memory here")
def test_simulated_gpu_timing_check_takes_the_floor_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    # The process's floor reads 1 us where a bracket costs 2.5 (it drifted, or another
    # stream's): the in-place brackets beside the calls read 2.5, and that is subtracted.
    sim = _simulate(monkeypatch, bracket_ns=2_500, floor_ns=1_000)
    detail, data = check_module._check_timing(require_gpu=True)
    assert data["process_floor_us"] == pytest.approx(1.0) and data["launch_floor_us"] == pytest.approx(2.5)
    for key in ("10us", "100us", "1000us"):
        assert data[key]["hidden_error_us"] == pytest.approx(0.0, abs=1e-6)
    # one empty kernel per hidden call, behind its gate
    assert sim.kernels.count(0) >= 3 * 7


@pytest.mark.skipif(CUDA, reason="simulates a GPU where there is none: the check's buffer would be real device memory here")
def test_simulated_gpu_timing_check_catches_a_wrong_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    # The empty bracket costs 1 us where a bracket around work costs 2.5: every hidden
    # reading is 1.5 us long, past the 10 us kernel's limit of 1 us + 0.1 %.
    _simulate(monkeypatch, bracket_ns=2_500, floor_ns=1_000, empty_bracket_ns=1_000)
    with pytest.raises(check_module._Failed, match=r"10 us kernel: events read \+1\.500 us off"):
        check_module._check_timing(require_gpu=True)


@pytest.mark.skipif(CUDA, reason="simulates a GPU where there is none: the check's buffer would be real device memory here")
def test_simulated_gpu_timing_check_fails_when_the_gate_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = _simulate(monkeypatch, bracket_ns=2_500, floor_ns=2_500)
    sim.time_out = True
    with pytest.raises(check_module._Failed, match="10 us: the launch-latency gate timed out"):
        check_module._check_timing(require_gpu=True)


@pytest.mark.skipif(CUDA, reason="simulates a GPU where there is none: the check's buffer would be real device memory here")
def test_simulated_gpu_timing_check_rejects_an_implausible_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    _simulate(monkeypatch, bracket_ns=25_000, floor_ns=25_000)
    with pytest.raises(check_module._Failed, match="implausible launch floor 25.000 us"):
        check_module._check_timing(require_gpu=True)

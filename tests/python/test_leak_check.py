"""``LeakCheck``: the light per-test check. Nothing held costs two counter reads; memory
held runs the full cleanup against the same baseline."""

from __future__ import annotations

import gc

import pytest

import gpukeeper
from gpukeeper.cleanup import run as cleanup_run
from gpukeeper.cleanup.leak_check import LeakCheck
from gpukeeper.base.errors import InvalidInputError

MiB = 1 << 20


@pytest.fixture
def pool():
    return gpukeeper.MemoryPool(kind="host")


@pytest.fixture
def full_cleanups(monkeypatch):
    """Counts the full cleanups LeakCheck runs."""
    calls = []
    real = cleanup_run.run_cleanup

    def counting(*args, **kwargs):
        calls.append(kwargs.get("source", args[0] if args else None))
        return real(*args, **kwargs)

    monkeypatch.setattr("gpukeeper.cleanup.leak_check.run_cleanup", counting)
    return calls


def test_nothing_held_is_none_and_runs_no_cleanup(pool, full_cleanups) -> None:
    check = LeakCheck()
    check.start()
    buf = pool.get_managed_buffer(0, 4 << 18)  # 4 MiB
    del buf
    assert check.finish() is None
    assert full_cleanups == []


def test_held_memory_runs_the_full_cleanup_and_names_it(pool, full_cleanups) -> None:
    check = LeakCheck()
    check.start()
    kept = pool.get_managed_buffer(0, 4 << 18)
    report = check.finish()
    assert full_cleanups == ["LeakCheck"]
    assert report is not None and report.held_bytes >= 4 * MiB
    assert report.held.get("host", {}).get("gpukeeper", 0) >= 4 * MiB
    del kept


def test_garbage_in_a_cycle_is_collected_not_a_leak(pool, full_cleanups) -> None:
    gc.disable()
    try:
        check = LeakCheck()
        check.start()
        a, b = [pool.get_managed_buffer(0, 2 << 18)], []
        a.append(b)
        b.append(a)  # a cycle: freed only by the collector
        del a, b
        report = check.finish()
    finally:
        gc.enable()
    assert full_cleanups == ["LeakCheck"]
    assert report is not None and report.held_bytes == 0 and report.gc_runs >= 1


def test_within_tolerance_is_none(pool, full_cleanups) -> None:
    check = LeakCheck(8 * MiB)
    check.start()
    kept = pool.get_managed_buffer(0, 2 << 18)
    assert check.finish() is None and full_cleanups == []
    del kept


@pytest.mark.parametrize("kwargs", [{"tolerance_bytes": -1}, {"tolerance_bytes": 1.5},
                                    {"tolerance_bytes": True}, {"track_allocations": "yes"}])
def test_bad_arguments_are_typed(kwargs) -> None:
    with pytest.raises(InvalidInputError):
        LeakCheck(**kwargs)


def test_finish_without_start_is_typed() -> None:
    with pytest.raises(InvalidInputError, match="without start"):
        LeakCheck().finish()


# --------------------------------------------------------------------- outside every framework


@pytest.fixture
def framework_on_gpu(monkeypatch):
    """A framework holding 20 MiB on device 0, and NVML's figure for the process beside it
    (``state["nvml"]``, bytes): what an engine or an extension allocates moves only that."""
    from gpukeeper import frameworks
    from gpukeeper.frameworks import FrameworkMemory

    state = {"nvml": 600 * MiB}
    held = FrameworkMemory("torch", 10 * MiB, 20 * MiB)
    monkeypatch.setattr(frameworks, "active_devices", lambda: [0])
    monkeypatch.setattr(frameworks, "gpu_frameworks_loaded", lambda: True)
    monkeypatch.setattr(frameworks, "memory_by_framework", lambda d=0: {"torch": held})
    monkeypatch.setattr(
        frameworks,
        "outside_memory",
        lambda d, reserved: FrameworkMemory(
            frameworks.OUTSIDE, state["nvml"] - reserved, state["nvml"] - reserved
        ),
    )
    monkeypatch.setattr(frameworks, "synchronize_all", lambda d=None: None)
    monkeypatch.setattr(frameworks, "release_all_caches", lambda d=None: {})
    return state


def test_memory_outside_every_framework_is_a_leak(framework_on_gpu, full_cleanups) -> None:
    from gpukeeper.cleanup.cleanup_report import leak_message

    check = LeakCheck()
    check.start()
    framework_on_gpu["nvml"] += 300 * MiB  # a raw cudaMalloc the frameworks never see
    report = check.finish()
    assert full_cleanups == ["LeakCheck"]
    assert report is not None and report.held == {"cuda:0": {"outside frameworks": 300 * MiB}}
    text = leak_message(report, tracking=False)
    assert "outside every framework" in text and "an engine or an extension" in text
    assert "no live tensor" not in text  # that line is about the frameworks' memory


def test_setup_outside_the_frameworks_is_not_a_leak(framework_on_gpu, full_cleanups) -> None:
    # A library setting itself up once (cuBLAS's first matmuls took 64-92 MiB): one region
    # cannot tell that from a leak, so it is held only past 256 MiB.
    for grew in (4 * MiB, 92 * MiB, 256 * MiB):
        check = LeakCheck()
        check.start()
        framework_on_gpu["nvml"] += grew
        assert check.finish() is None and full_cleanups == []


def test_a_kept_autograd_graph_is_named_as_the_cause() -> None:
    from gpukeeper.cleanup.cleanup_report import CleanupReport, LeakedArray, leak_message

    leaks = [
        LeakedArray("torch", "cuda:0", "Tensor", (), "float32", 4, True, (), grad_fn=True),
        LeakedArray("torch", "cuda:0", "Tensor", (64,), "float32", 256, True, ()),
    ]
    report = CleanupReport(
        "GPUContext", [0], {}, {}, {}, {"cuda:0": {"torch": 8 * MiB}}, leaks, 2, 0, 0, True, 0.0
    )
    text = leak_message(report, tracking=False)
    assert "1 of the tensors still held carry a grad_fn" in text and ".detach()" in text
    plain = CleanupReport(
        "GPUContext", [0], {}, {}, {}, {"cuda:0": {"torch": 8 * MiB}}, leaks[1:], 1, 0, 0, True, 0.0
    )
    assert "grad_fn" not in leak_message(plain, tracking=False) and "grad_fn" not in plain.table()


def test_gpucontext_reports_memory_outside_every_framework(framework_on_gpu) -> None:
    from gpukeeper.cleanup.context import GPUContext

    ctx = GPUContext(warn_on_leak=False, deferred_release=False)
    with ctx:
        framework_on_gpu["nvml"] += 300 * MiB
    assert ctx.report is not None
    assert ctx.report.held == {"cuda:0": {"outside frameworks": 300 * MiB}}
    assert "outside every framework" in ctx.report.table()
    with ctx:
        framework_on_gpu["nvml"] += 64 * MiB  # as much as cuBLAS sets up: said, not held
    assert ctx.report is not None and not ctx.report.leaked
    assert any("64.0 MiB appeared outside every framework" in n for n in ctx.report.notes)
    with ctx:
        framework_on_gpu["nvml"] += 2 * MiB  # NVML's pages: not even said
    assert ctx.report is not None and not ctx.report.leaked
    assert not any("outside every framework" in n for n in ctx.report.notes)

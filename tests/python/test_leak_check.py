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

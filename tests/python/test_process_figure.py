"""A rank summary's per-process figure read off the collective's critical path: NVML's
reading kept by a background thread (its age said), a fresh read on demand, the reading
in the summary's totals, and a forked child that starts from nothing."""

from __future__ import annotations

import json
import os
import time
import warnings

import engine_fakes
import pytest
from engine_fakes import FakeDriver, FakeNvml, MiB, fresh_nvml  # noqa: F401 (a fixture)

import gpukeeper
from gpukeeper.account import account_reader
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.nvml import ProcessReading
from gpukeeper.distributed import process_figure
from gpukeeper.distributed.rank_memory import VECTOR_LENGTH, RankMemory


@pytest.fixture
def figures(monkeypatch, fresh_nvml):
    """An engine's context on device 0 (no framework), NVML faked with its function
    table, this process's figure read from ``state["used"]``; the refresher stopped
    before and after."""
    state = {"used": 600 * MiB}
    engine_fakes.hide_frameworks(monkeypatch)
    engine_fakes.install_driver(monkeypatch, FakeDriver({0: False}))
    fake = engine_fakes.install_nvml(
        monkeypatch, FakeNvml(used=lambda: state["used"], function_table=True)
    )
    process_figure.stop_refresher()
    process_figure.configure(interval_s=process_figure.REFRESH_INTERVAL_S,
                             idle_s=process_figure.IDLE_STOP_S)
    yield state, fake
    process_figure.stop_refresher()
    process_figure.configure(interval_s=process_figure.REFRESH_INTERVAL_S,
                             idle_s=process_figure.IDLE_STOP_S)


def _wait(predicate, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def test_the_first_read_is_synchronous_and_starts_the_refresher(figures):
    state, fake = figures
    figure = process_figure.read_figure(0)
    assert figure.reading == ProcessReading(True, 600 * MiB)
    assert figure.age_s() < 1.0
    status = process_figure.refresher_status()
    assert status["running"] and status["thread"] == "gpukeeper-process-figure"
    assert status["watched"] == [(os.getpid(), 0)] and status["synchronous_reads"] == 1
    thread = next(t for t in gpukeeper.base.process_life.LIFE.live_threads()
                  if t.name == "gpukeeper-process-figure")
    assert thread.daemon  # started through process_life, recorded there
    # The refresher follows the figure without a summary reading it.
    state["used"] = 700 * MiB
    assert _wait(lambda: process_figure.read_figure(0).reading.used_bytes == 700 * MiB)
    assert process_figure.refresher_status()["background_reads"] >= 1
    assert process_figure.refresher_status()["synchronous_reads"] == 1


def test_the_age_is_reported_and_grows_while_the_reading_is_stale(figures):
    state, _fake = figures
    process_figure.configure(interval_s=30.0)  # the refresher sleeps: the reading goes stale
    first = process_figure.ProcessFigures()
    assert first(0).used_bytes == 600 * MiB
    time.sleep(0.05)
    state["used"] = 900 * MiB
    later = process_figure.ProcessFigures()
    assert later(0).used_bytes == 600 * MiB  # the kept reading, not a new one
    assert later.age_s is not None and later.age_s >= 0.05
    time.sleep(0.03)
    again = process_figure.ProcessFigures()
    again(0)
    assert again.age_s > later.age_s
    assert process_figure.refresher_status()["synchronous_reads"] == 1


def test_fresh_reads_synchronously(figures):
    state, fake = figures
    process_figure.configure(interval_s=30.0)
    process_figure.read_figure(0)
    time.sleep(0.03)
    state["used"] = 1000 * MiB
    calls = fake.driver_calls
    fresh = process_figure.ProcessFigures(fresh=True)
    assert fresh(0) == ProcessReading(True, 1000 * MiB)
    assert fake.driver_calls == calls + 1  # one driver call, made now
    assert fresh.age_s < 0.03
    assert process_figure.refresher_status()["synchronous_reads"] == 2
    # ... and it becomes the kept reading.
    assert process_figure.read_figure(0).reading.used_bytes == 1000 * MiB


def test_the_refresher_stops_when_no_summary_asks(figures):
    state, _fake = figures
    process_figure.configure(interval_s=0.005, idle_s=0.05)
    process_figure.read_figure(0)
    assert _wait(lambda: not process_figure.refresher_status()["running"], timeout=5.0)
    state["used"] = 800 * MiB
    # Stopped: the next read is made now (not an old reading), and starts it again.
    assert process_figure.read_figure(0).reading.used_bytes == 800 * MiB
    status = process_figure.refresher_status()
    assert status["synchronous_reads"] == 2 and status["running"]


def test_one_reader_per_pid_and_device(figures):
    for _ in range(3):
        process_figure.read_figure(0, fresh=True)
    assert process_figure.refresher_status()["readers"] == [(os.getpid(), 0)]


def test_without_nvml_no_reading_and_no_thread(monkeypatch, fresh_nvml):
    engine_fakes.hide_frameworks(monkeypatch)
    engine_fakes.install_driver(monkeypatch, FakeDriver({0: False}))
    fake = engine_fakes.install_nvml(monkeypatch, FakeNvml(used=1))
    fake.fail_init = True
    process_figure.stop_refresher()
    figure = process_figure.read_figure(0)
    assert figure.reading.listed is None and "nvmlInit failed" in figure.reading.reason
    assert not process_figure.refresher_status()["running"]


def test_the_summary_totals_take_the_kept_reading(figures):
    state, fake = figures
    process_figure.configure(interval_s=30.0)
    direct = account_reader.rank_totals_report(True, "visible")
    kept = process_figure.ProcessFigures()
    summary = account_reader.rank_totals_report(True, "visible", kept)
    assert summary.process_bytes == direct.process_bytes == 600 * MiB
    assert summary.context_and_libraries_bytes == direct.context_and_libraries_bytes
    assert summary.devices[0].this_process.startswith("found")
    # Later summaries make no NVML process-list call while the reading is kept.
    calls = fake.reads
    state["used"] = 650 * MiB
    again = account_reader.rank_totals_report(True, "visible", process_figure.ProcessFigures())
    assert again.process_bytes == 600 * MiB and fake.reads == calls


def test_the_summary_reads_no_free_and_total(figures, monkeypatch):
    """A summary carries neither, so its reading leaves NVML's memory call out; a full
    report still makes it."""
    _state, fake = figures
    calls = []
    real = fake.nvmlDeviceGetMemoryInfo
    monkeypatch.setattr(fake, "nvmlDeviceGetMemoryInfo", lambda h: calls.append(h) or real(h))
    summary = account_reader.rank_totals_report(True, "visible", process_figure.ProcessFigures())
    assert calls == [] and summary.devices[0].total_bytes == 0
    assert summary.devices[0].memory_source.startswith("not read")
    assert summary.process_bytes == 600 * MiB
    full = gpukeeper.memory_report()
    assert len(calls) == 1 and full.devices[0].total_bytes == fake.total


def test_the_summary_says_unknown_where_the_kept_reading_cannot_tell(figures):
    _state, _fake = figures
    unknown = ProcessReading(None, None, "a container's PID namespace")
    report = account_reader.rank_totals_report(True, "visible", lambda device: unknown)
    assert report.process_bytes is None
    assert "container" in report.devices[0].this_process


def test_the_age_travels_in_the_row_and_the_table_says_it():
    row = RankMemory(rank=0, world_size=2, hostname="h", pid=1, devices=[0], allocated=1,
                     reserved=2, peak=3, context=4, process=6, process_age_ms=12.345)
    vector = row.to_vector()
    assert len(vector) == VECTOR_LENGTH
    back = RankMemory.from_vector(vector)
    assert back.process_age_ms == pytest.approx(12.345, abs=1e-3)
    other = RankMemory(rank=1, world_size=2, hostname="h", pid=2, devices=[1], allocated=1,
                       reserved=2, peak=3, context=4, process=6, process_age_ms=0.0)
    text = gpukeeper.distributed.format_rank_table([back, other])
    assert "read up to 12.3 ms before the gather (rank 0)" in text
    fresh = gpukeeper.distributed.format_rank_table([other])
    assert "before the gather" not in fresh
    unknown = RankMemory.from_vector(RankMemory(**{**row.to_dict(), "process_age_ms": None})
                                     .to_vector())
    assert unknown.process_age_ms is None


def test_fresh_is_typed_before_any_collective():
    with pytest.raises(InvalidInputError):
        gpukeeper.distributed.gather_memory_reports(summary=True, fresh="yes")


def test_a_forked_child_does_not_inherit_the_refresher(figures):
    process_figure.read_figure(0)
    assert process_figure.refresher_status()["running"]
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # Python 3.12+ warns of a fork beside live threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: report what it sees, then leave without cleanup
        try:
            status = process_figure.refresher_status()
            seen = {
                "running": status["running"],
                "watched": status["watched"],
                "readers": status["readers"],
                "readings": len(status["readings"]),
                "reads": status["background_reads"] + status["synchronous_reads"],
                "threads": [t.name for t in gpukeeper.base.process_life.LIFE.live_threads()],
            }
            os.write(write_end, json.dumps(seen).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        seen = json.loads(f.read())
    os.waitpid(pid, 0)
    assert seen == {"running": False, "watched": [], "readers": [], "readings": 0,
                    "reads": 0, "threads": []}
    assert process_figure.refresher_status()["running"]  # the parent's goes on

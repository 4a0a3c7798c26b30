"""The progress bar of long runs: shown on a terminal, silent in CI and pytest unless asked,
and never in a short benchmark."""

from __future__ import annotations

import io
import time

import pytest

from gpukeeper.base.progress import ProgressBar, progress_wanted
from gpukeeper.timing import benchmark


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_wanted_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPUKEEPER_PROGRESS", "CI", "PYTEST_CURRENT_TEST"):
        monkeypatch.delenv(name, raising=False)
    assert progress_wanted(None, _Tty()) is True
    assert progress_wanted(None, io.StringIO()) is False  # not a terminal
    monkeypatch.setenv("CI", "true")
    assert progress_wanted(None, _Tty()) is False
    monkeypatch.delenv("CI")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "x")
    assert progress_wanted(None, _Tty()) is False
    monkeypatch.setenv("GPUKEEPER_PROGRESS", "1")
    assert progress_wanted(None, io.StringIO()) is True
    monkeypatch.setenv("GPUKEEPER_PROGRESS", "0")
    assert progress_wanted(None, _Tty()) is False
    assert progress_wanted(True, io.StringIO()) is True and progress_wanted(False, _Tty()) is False


def test_bar_draws_counts() -> None:
    out = io.StringIO()
    bar = ProgressBar(200, "trajectory", "steps", stream=out)
    assert bar.every == 2
    bar.update(100)
    bar.close()
    text = out.getvalue()
    assert "200/200" in text and "100%" in text and "trajectory" in text


def test_long_benchmark_shows_a_bar_and_short_one_none(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GPUKEEPER_PROGRESS", "1")
    monkeypatch.setattr(benchmark, "PROGRESS_AFTER_S", 0.05)
    benchmark.benchmark_function(lambda: time.sleep(0.002), n_calls=100, warmup=1, device="cpu")
    assert "100/100" in capsys.readouterr().err
    monkeypatch.setattr(benchmark, "PROGRESS_AFTER_S", 60.0)
    benchmark.benchmark_function(lambda: None, n_calls=100, warmup=1, device="cpu")
    assert "calls" not in capsys.readouterr().err

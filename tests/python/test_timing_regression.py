"""Noise-aware comparison of two runs (timing.regression) and the run store (timing.store)."""

from __future__ import annotations

import random

import pytest

from gpukeeper.errors import InvalidInputError
from gpukeeper.timing.regression import FailThreshold, compare_runs, parse_fail_threshold, regression
from gpukeeper.timing.result import BenchmarkResult
from gpukeeper.timing.store import RunStore


def _run(center: float, spread: float, n: int = 200, seed: int = 1) -> BenchmarkResult:
    rng = random.Random(seed)
    return BenchmarkResult(name="k", times_ms=[center + rng.uniform(-spread, spread) for _ in range(n)])


def test_verdicts() -> None:
    base = _run(1.0, 0.01)
    assert compare_runs(base, _run(1.0, 0.01, seed=2)).verdict == "same"
    slower = compare_runs(base, _run(2.0, 0.02))
    assert slower.verdict == "slower" and slower.ratio == pytest.approx(2.0, rel=0.02)
    assert slower.ratio_low > 1.9 and slower.ratio_high < 2.1
    assert compare_runs(base, _run(0.5, 0.005)).verdict == "faster"
    # Very noisy short runs cannot tell a 3% change apart.
    noisy = compare_runs(_run(1.0, 0.8, n=8), _run(1.03, 0.8, n=8, seed=3))
    assert noisy.verdict == "undecided" and noisy.ratio_low < 1 < noisy.ratio_high


def test_same_input_same_verdict() -> None:
    a, b = _run(1.0, 0.2), _run(1.05, 0.2, seed=5)
    assert compare_runs(a, b) == compare_runs(a, b)


def test_regression_needs_slower_beyond_noise_and_past_threshold() -> None:
    base = _run(1.0, 0.01)
    t = FailThreshold("median", 0.05)
    assert regression(compare_runs(base, _run(2.0, 0.02)), t)
    assert not regression(compare_runs(base, _run(1.03, 0.01)), t)  # real, but under 5%
    assert not regression(compare_runs(base, _run(2.0, 0.02)), None)
    assert not regression(compare_runs(_run(1.0, 0.8, n=8), _run(1.1, 0.8, n=8, seed=3)), t)


def test_fail_threshold_text() -> None:
    assert parse_fail_threshold("median:5%") == FailThreshold("median", 0.05)
    assert parse_fail_threshold("mean:0.1") == FailThreshold("mean", 0.1)
    for bad in ("5%", "fastest:5%", "median:", "median:five", ""):
        with pytest.raises(InvalidInputError, match="STAT:PERCENT"):
            parse_fail_threshold(bad)


def test_compare_checks_input() -> None:
    with pytest.raises(InvalidInputError, match="stat must be one of"):
        compare_runs(_run(1, 0.1), _run(1, 0.1), stat="fastest")
    with pytest.raises(InvalidInputError, match="at least 2 calls"):
        compare_runs(_run(1, 0.1, n=1), _run(1, 0.1))


def test_store_round_trip_latest_and_errors(tmp_path) -> None:
    store = RunStore(tmp_path, {"mode": "cpu", "name": "Test CPU", "python": "3.11.7"})
    assert store.folder.name == "Test-CPU-py3.11"
    with pytest.raises(InvalidInputError, match="saved here: none"):
        store.load()
    store.save("first", {"a": _run(1.0, 0.1)})
    path = store.save("second", {"a": _run(2.0, 0.1), "b": _run(3.0, 0.1)})
    assert path.name == "second.json" and store.latest() == "second"
    loaded = store.load()
    assert set(loaded) == {"a", "b"} and loaded["a"].times_ms == _run(2.0, 0.1).times_ms
    assert store.load("first")["a"].median_ms == pytest.approx(_run(1.0, 0.1).median_ms)
    with pytest.raises(InvalidInputError, match="saved here: first, second"):
        store.load("third")
    for bad in ("../x", "", "a b", "x" * 101):
        with pytest.raises(InvalidInputError, match="saved run's name"):
            store.save(bad, {})
    (store.folder / "broken.json").write_text("{not json")
    with pytest.raises(InvalidInputError, match="is not a saved benchmark run"):
        store.load("broken")

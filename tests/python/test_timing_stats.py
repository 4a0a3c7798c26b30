"""The timing statistics against numpy on known samples."""

from __future__ import annotations

import math
import random

import pytest

from gpukeeper import InvalidInputError
from gpukeeper.timing import stats
from gpukeeper.timing.stats import NoiseCriterion

np = pytest.importorskip("numpy")

rng = random.Random(1234)
SAMPLES = {
    "one": [3.5],
    "two": [1.0, 2.0],
    "odd": [5.0, 1.0, 4.0, 2.0, 3.0],
    "even": [0.4, 0.1, 0.3, 0.2],
    "ties": [1.0, 1.0, 1.0, 2.0, 2.0, 9.0],
    "lognormal": [rng.lognormvariate(0.0, 0.4) for _ in range(1001)],
    "clustered": [1000.0 + i * 1e-6 for i in range(200)],  # two-pass std needed
    "outlier": [0.1] * 99 + [5.0],
}


@pytest.mark.parametrize("key", sorted(SAMPLES))
def test_summary_matches_numpy(key: str) -> None:
    x = SAMPLES[key]
    a = np.asarray(x)
    s = stats.summarize(x)
    assert s.count == len(x)
    assert s.mean == pytest.approx(a.mean(), rel=1e-12)
    assert s.median == pytest.approx(np.median(a), rel=1e-12)
    assert s.min == a.min() and s.max == a.max()
    for q in stats.PERCENTILES:
        assert getattr(s, f"p{q}") == pytest.approx(np.percentile(a, q), rel=1e-12, abs=1e-15)
    assert s.iqr == pytest.approx(np.percentile(a, 75) - np.percentile(a, 25), rel=1e-9, abs=1e-12)
    if len(x) > 1:
        assert s.std == pytest.approx(a.std(ddof=1), rel=1e-9, abs=1e-15)
        assert s.relative_std == pytest.approx(a.std(ddof=1) / a.mean(), rel=1e-9, abs=1e-15)
    else:
        assert math.isnan(s.std) and math.isnan(s.relative_std)
    assert s.relative_iqr == pytest.approx(s.iqr / np.median(a), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("q", [0, 1, 12.5, 33.3, 50, 66.6, 90, 99.9, 100])
def test_percentile_linear_interpolation(q: float) -> None:
    x = SAMPLES["lognormal"]
    assert stats.percentile(x, q) == pytest.approx(np.percentile(x, q), rel=1e-12)


def test_single_functions_agree_with_summary() -> None:
    x = SAMPLES["lognormal"]
    s = stats.summarize(x)
    assert stats.mean(x) == s.mean
    assert stats.median(x) == s.median
    assert stats.std(x) == s.std
    assert stats.minimum(x) == s.min and stats.maximum(x) == s.max
    assert stats.iqr(x) == s.iqr
    assert stats.relative_std(x) == pytest.approx(s.relative_std)
    assert stats.relative_iqr(x) == pytest.approx(s.relative_iqr)
    assert stats.std(x, ddof=0) == pytest.approx(np.std(x), rel=1e-12)
    assert set(s.to_dict()) >= {"mean", "median", "p99", "iqr", "relative_std"}


def test_zero_mean_gives_nan_noise() -> None:
    assert math.isnan(stats.relative_std([0.0, 0.0]))
    assert math.isnan(stats.relative_iqr([0.0, 0.0, 0.0]))


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")], ["x"], None])
def test_bad_samples_are_typed_errors(bad) -> None:
    with pytest.raises(InvalidInputError):
        stats.summarize(bad)


@pytest.mark.parametrize("q", [-1, 100.5, "50", None])
def test_bad_percentile(q) -> None:
    with pytest.raises(InvalidInputError):
        stats.percentile([1.0, 2.0], q)


def test_noise_criterion_stops_on_quiet_samples() -> None:
    c = NoiseCriterion(max_noise=0.01, min_samples=10)
    for i in range(9):
        c.add(1.0 + 0.001 * (i % 3))
        assert not c.is_finished()  # below min_samples
    c.add(1.0)
    assert c.is_finished() and not c.converged
    assert c.noise == pytest.approx(np.std([1.0 + 0.001 * (i % 3) for i in range(9)] + [1.0], ddof=1) / np.mean([1.0 + 0.001 * (i % 3) for i in range(9)] + [1.0]))


def test_noise_criterion_respects_min_time() -> None:
    c = NoiseCriterion(max_noise=0.5, min_samples=2, min_time=10.0)
    for _ in range(9):
        c.add(1.0)
    assert not c.is_finished()  # 9 < min_time 10
    c.add(1.0)
    assert c.is_finished()


def test_noise_criterion_converges_on_steady_noise() -> None:
    # Alternating 1 and 2: relative std settles near 0.34 and never gets below 0.01;
    # once the estimate is stable the criterion says so instead of running forever.
    c = NoiseCriterion(max_noise=0.01, min_samples=10, window=32)
    finished_at = None
    for i in range(2000):
        c.add(1.0 if i % 2 else 2.0)
        if c.is_finished():
            finished_at = i + 1
            break
    assert finished_at is not None and finished_at < 2000
    assert c.converged and c.noise > 0.3


def test_noise_criterion_keeps_going_while_noise_drifts() -> None:
    # One early outlier, then constant calls: the noise estimate keeps falling (~1/sqrt(n)),
    # so it has not converged and more samples are worth taking.
    c = NoiseCriterion(max_noise=0.001, min_samples=10, window=32)
    c.add(10.0)
    for _ in range(60):
        c.add(1.0)
        assert not c.is_finished()


@pytest.mark.parametrize("kw", [{"max_noise": 0}, {"max_noise": -1}, {"max_noise": 0.1, "min_samples": 1}, {"max_noise": 0.1, "window": 2}])
def test_noise_criterion_bad_arguments(kw) -> None:
    with pytest.raises(InvalidInputError):
        NoiseCriterion(**kw)

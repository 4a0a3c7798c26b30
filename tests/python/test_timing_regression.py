"""Comparison of runs with the spread between processes (timing.regression) and the run
store with rounds (timing.store)."""

from __future__ import annotations

import json
import math
import random
from typing import List

import pytest

from gpukeeper.base.errors import InvalidInputError
from gpukeeper.timing.regression import FailThreshold, compare_runs, parse_fail_threshold, regression
from gpukeeper.timing.benchmark_result import BenchmarkResult
from gpukeeper.timing.store import RunStore

MEDIAN_5 = FailThreshold("median", 0.05)


def _run(center: float, spread: float, n: int = 200, seed: int = 1) -> BenchmarkResult:
    rng = random.Random(seed)
    return BenchmarkResult(name="k", times_ms=[center + rng.uniform(-spread, spread) for _ in range(n)])


def _rounds(centers: List[float], seed: int = 10) -> List[BenchmarkResult]:
    # Quiet calls around each round's own center: the spread is between the rounds.
    return [_run(c, 0.002 * c, n=100, seed=seed + i) for i, c in enumerate(centers)]


# Five processes of the same code, their medians ±4% apart.
SPREAD_4 = [1.00, 1.04, 0.97, 1.02, 0.96]


def test_one_round_each_is_unmeasured_and_calls_only_a_factor_of_two() -> None:
    base = _run(1.0, 0.01)
    # What a single process pair said before: +14% with a tight interval, yet the same code.
    c = compare_runs(base, _run(1.14, 0.01), threshold=MEDIAN_5)
    assert c.verdict == "undecided" and c.spread is None and not regression(c, MEDIAN_5)
    assert c.ratio_low > 1.1  # the calls alone are sure of it
    assert "unmeasured" in c.describe() and "2x" in c.describe()
    assert compare_runs(base, _run(1.0, 0.01, seed=2)).verdict == "undecided"  # never "same"
    slower = compare_runs(base, _run(3.0, 0.02))
    assert slower.verdict == "slower" and slower.ratio == pytest.approx(3.0, rel=0.02)
    assert compare_runs(base, _run(0.3, 0.005)).verdict == "faster"
    noisy = compare_runs(_run(1.0, 0.8, n=8), _run(2.5, 0.8, n=8, seed=3))
    assert noisy.verdict == "undecided" and noisy.ratio_low < 2


def test_change_within_the_measured_spread_is_undecided_and_names_it() -> None:
    base = _rounds(SPREAD_4)
    c = compare_runs(base, _rounds([1.06], seed=50)[0], threshold=MEDIAN_5)
    assert c.verdict == "undecided" and not regression(c, MEDIAN_5)
    assert c.rounds_baseline == 5 and c.rounds_current == 1
    std = math.sqrt(sum((math.log(x) - sum(map(math.log, SPREAD_4)) / 5) ** 2 for x in SPREAD_4) / 4)
    # t(4 df, 99.5%) * std * sqrt(1 + 1/5)
    assert c.spread == pytest.approx(math.exp(4.604 * std * math.sqrt(1.2)) - 1, rel=0.01)
    assert f"within the spread between processes (±{c.spread:.1%} over 5 rounds)" in c.describe()
    assert c.describe().startswith("undecided: median")


def test_change_five_times_the_spread_is_slower_and_fails() -> None:
    base = _rounds(SPREAD_4)
    first = compare_runs(base, _rounds([1.0], seed=50)[0], threshold=MEDIAN_5)
    c = compare_runs(base, _rounds([1.0 + 5 * first.spread], seed=50)[0], threshold=MEDIAN_5)
    assert c.verdict == "slower" and regression(c, MEDIAN_5)
    assert c.ratio_low > 1 and "beyond the spread between processes" in c.describe()
    assert compare_runs(base, _rounds([1 / (1 + 5 * first.spread)], seed=50)[0]).verdict == "faster"


def test_tight_rounds_give_same_and_catch_a_small_slowdown() -> None:
    base = _rounds([1.0, 1.002, 0.999, 1.001, 0.998])
    assert compare_runs(base, _rounds([1.0005], seed=50)[0], threshold=MEDIAN_5).verdict == "same"
    c = compare_runs(base, _rounds([1.08], seed=50)[0], threshold=MEDIAN_5)
    assert c.verdict == "slower" and regression(c, MEDIAN_5)
    # Below the threshold: real, reported, but it fails nothing.
    small = compare_runs(base, _rounds([1.03], seed=50)[0], threshold=MEDIAN_5)
    assert small.verdict == "slower" and not regression(small, MEDIAN_5)


def test_identical_rounds_claim_no_more_than_their_calls() -> None:
    # Zero spread between rounds: the bootstrap of the calls is the floor.
    one = _run(1.0, 0.05)
    c = compare_runs([one, one, one], [one])
    assert c.verdict == "same" and c.spread is not None and c.spread > 0.001


def test_a_a_synthetic_rounds_never_fail_the_confirmed_gate() -> None:
    # Same code, processes ±5% apart (log-normal). One current process against five
    # rounds is beyond the 99% spread about once in 200 by design; the gate's
    # confirmation (two more fresh processes, all rounds together) must clear every one.
    rng = random.Random(2026)
    alarms = 0
    for trial in range(200):
        centers = [math.exp(rng.gauss(0, 0.05)) for _ in range(8)]
        runs = _rounds(centers, seed=100 * trial)
        one = compare_runs(runs[:5], runs[5], threshold=MEDIAN_5)
        if regression(one, MEDIAN_5):
            alarms += 1
            confirmed = compare_runs(runs[:5], runs[5:], threshold=MEDIAN_5)
            assert not regression(confirmed, MEDIAN_5), confirmed.describe()
    assert alarms <= 2  # at most 1 in 100 from one process


def test_several_current_rounds_count_on_both_sides() -> None:
    base = _rounds(SPREAD_4)
    one = compare_runs(base, _rounds([1.05])[0])
    three = compare_runs(base, _rounds([1.05, 1.09, 1.01], seed=60))
    assert three.rounds_current == 3 and three.spread < one.spread
    assert "over 5+3 rounds" in three.describe()
    # A current process that landed slow, with fresh ones that did not: not a slowdown.
    outlier = compare_runs(base, _rounds([1.6, 1.0, 0.99], seed=70), threshold=MEDIAN_5)
    assert outlier.verdict == "undecided"


def test_same_input_same_verdict() -> None:
    a, b = _rounds(SPREAD_4), _run(1.05, 0.2, seed=5)
    assert compare_runs(a, b) == compare_runs(a, b)
    assert compare_runs(a[0], b) == compare_runs([a[0]], [b])


def test_threshold_gives_the_statistic_and_the_band() -> None:
    base = _rounds([1.0, 1.01, 0.99])
    c = compare_runs(base, _rounds([1.0])[0], threshold=FailThreshold("mean", 0.5))
    assert c.stat == "mean" and c.verdict == "same"
    assert compare_runs(base, _rounds([1.0])[0], "p95").stat == "p95"


def test_regression_needs_slower_beyond_noise_and_past_threshold() -> None:
    base = _rounds([1.0, 1.002, 0.999, 1.001, 0.998])
    t = FailThreshold("median", 0.05)
    assert regression(compare_runs(base, _run(2.0, 0.02)), t)
    assert not regression(compare_runs(base, _run(1.03, 0.01)), t)  # real, but under 5%
    assert not regression(compare_runs(base, _run(2.0, 0.02)), None)
    assert not regression(compare_runs(base, _run(2.0, 0.02)), FailThreshold("p95", 0.05))  # other stat


def test_fail_threshold_text() -> None:
    assert parse_fail_threshold("median:5%") == FailThreshold("median", 0.05)
    assert parse_fail_threshold("mean:0.1") == FailThreshold("mean", 0.1)
    for bad in ("5%", "fastest:5%", "median:", "median:five", ""):
        with pytest.raises(InvalidInputError, match="STAT:PERCENT"):
            parse_fail_threshold(bad)


def test_compare_checks_input() -> None:
    with pytest.raises(InvalidInputError, match="stat must be one of"):
        compare_runs(_run(1, 0.1), _run(1, 0.1), stat="fastest")
    with pytest.raises(InvalidInputError, match="at least 2 times"):
        compare_runs(_run(1, 0.1, n=1), _run(1, 0.1))
    with pytest.raises(InvalidInputError, match="non-empty list"):
        compare_runs([], _run(1, 0.1))
    with pytest.raises(InvalidInputError, match="non-empty list"):
        compare_runs(_run(1, 0.1), "times.json")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="rounds are BenchmarkResult"):
        compare_runs([_run(1, 0.1), {"times_ms": [1]}], _run(1, 0.1))  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="same_band must be a fraction"):
        compare_runs(_run(1, 0.1), _run(1, 0.1), same_band=1.5)
    with pytest.raises(InvalidInputError, match="threshold must be a FailThreshold"):
        compare_runs(_run(1, 0.1), _run(1, 0.1), threshold="median:5%")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="positive time"):
        compare_runs(_run(0.0, 0.0), _run(1, 0.1))


def test_runs_that_measure_different_things_are_refused() -> None:
    loop, device = _run(1, 0.1), _run(1, 0.1, seed=2)
    loop.measure = "loop"  # type: ignore[attr-defined]
    device.measure = "device"  # type: ignore[attr-defined]
    with pytest.raises(InvalidInputError, match="measure different things.*'device' vs 'loop'"):
        compare_runs(loop, device)
    with pytest.raises(InvalidInputError, match="measure different things"):
        compare_runs([loop, device], loop)
    same = _run(1, 0.1, seed=3)
    same.measure = "loop"  # type: ignore[attr-defined]
    assert compare_runs(loop, same).verdict == "undecided"


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


def test_store_rounds_append_and_replace(tmp_path) -> None:
    store = RunStore(tmp_path, {"mode": "cpu", "name": "Test CPU", "python": "3.11.7"})
    store.save("base", {"a": _rounds([1.0, 1.01]), "b": _run(2.0, 0.1)})
    store.save("base", {"a": _run(1.02, 0.01), "c": _run(3.0, 0.1)}, append=True)
    rounds = store.load_rounds("base")
    assert [len(rounds[k]) for k in ("a", "b", "c")] == [3, 1, 1]
    assert rounds["a"][2].median_ms == pytest.approx(_run(1.02, 0.01).median_ms)
    assert store.load("base")["a"].median_ms == pytest.approx(_rounds([1.0])[0].median_ms)  # the first round
    doc = json.loads((store.folder / "base.json").read_text())
    assert set(doc["benchmarks"]) == {"a", "b", "c"} and set(doc["later_rounds"]) == {"a"}
    store.save("base", {"a": _run(5.0, 0.1)})  # without append: replaced
    assert [len(v) for v in store.load_rounds("base").values()] == [1]
    store.save("fresh", {"a": _run(1.0, 0.1)}, append=True)  # nothing to add to: a new run
    assert len(store.load_rounds("fresh")["a"]) == 1
    with pytest.raises(InvalidInputError, match="non-empty list"):
        store.save("bad", {"a": []})


def test_a_file_saved_before_rounds_loads_as_one_round(tmp_path) -> None:
    store = RunStore(tmp_path, {"mode": "cpu", "name": "Test CPU", "python": "3.11.7"})
    store.folder.mkdir(parents=True)
    old = {"machine": store.machine, "saved_at": "2026-01-02T03:04:05+00:00", "name": "old",
           "benchmarks": {"a": {"name": "a", "times_ms": [1.0, 1.1, 0.9, 1.05], "timing": "host"}}}
    (store.folder / "old.json").write_text(json.dumps(old))
    rounds = store.load_rounds("old")
    assert list(rounds) == ["a"] and len(rounds["a"]) == 1 and rounds["a"][0].median_ms == pytest.approx(1.025)
    c = compare_runs(rounds["a"], _run(1.0, 0.01), threshold=MEDIAN_5)
    assert c.spread is None and c.verdict == "undecided"
    (store.folder / "odd.json").write_text(json.dumps({**old, "later_rounds": {"z": []}}))
    with pytest.raises(InvalidInputError, match="is not a saved benchmark run"):
        store.load_rounds("odd")


def test_decide_draws_fresh_rounds_only_while_needed_and_stops_once_decided() -> None:
    from gpukeeper.timing.regression import decide, needs_more_rounds

    threshold = FailThreshold("median", 0.05)
    base = _rounds([1.0, 1.01, 0.99, 1.0, 1.005])
    drawn: List[BenchmarkResult] = []

    def fresh(centers: List[float]):
        for r in _rounds(centers, seed=77):
            drawn.append(r)
            yield r

    # Unchanged code whose one process is within the threshold: no fresh round is drawn.
    calm = decide(base, _run(1.002, 0.001, seed=5), fresh([1.0] * 4), threshold, 4)
    assert drawn == [] and calm.verdict == "same" and not regression(calm, threshold)
    # A process that landed slow while the code is unchanged: fresh rounds clear it.
    slow_process = compare_runs(base, _run(1.3, 0.001, seed=6), threshold=threshold)
    assert needs_more_rounds(slow_process, threshold)
    cleared = decide(base, _run(1.3, 0.001, seed=6), fresh([1.0, 1.002, 0.998, 1.001]), threshold, 4)
    assert not regression(cleared, threshold) and 1 <= len(drawn) <= 4
    # A real 2x slowdown: decided slower, and it stops as soon as it is.
    drawn.clear()
    slower = decide(base, _run(2.0, 0.001, seed=7), fresh([2.0, 2.01, 1.99, 2.0]), threshold, 4)
    assert slower.verdict == "slower" and regression(slower, threshold)
    assert len(drawn) == slower.rounds_current - 1 < 4
    # limit 0 decides on the one process; no threshold: nothing to decide for.
    drawn.clear()
    decide(base, _run(1.3, 0.001, seed=6), fresh([1.0] * 4), threshold, 0)
    decide(base, _run(1.3, 0.001, seed=6), fresh([1.0] * 4), None, 4)
    assert drawn == []


def test_every_verdict_says_how_small_a_change_it_could_have_called() -> None:
    one = compare_runs(_run(1.0, 0.01, seed=1), _run(1.05, 0.01, seed=2))
    assert one.detectable == pytest.approx(1.0)  # unmeasured: only beyond 2x
    assert "could detect ±100.0% or more here" in one.describe()
    many = compare_runs(_rounds([1.0, 1.02, 0.98, 1.01]), _rounds([1.01, 0.99, 1.0], seed=3))
    assert many.detectable == pytest.approx(many.spread)
    assert f"could detect ±{many.spread:.1%} or more here" in many.describe()
    assert many.cells()[-2] == f"±{many.spread:.1%}"


def test_one_wild_round_is_set_aside_and_named_while_recurring_states_stay() -> None:
    base = _rounds([1.0, 1.01, 0.99, 1.0, 1.02])
    wild = _rounds([1.0, 1.01, 7.4], seed=21)  # a cold process, 7x the others
    c = compare_runs(base, wild, threshold=FailThreshold("median", 0.05))
    assert "current round 3" in c.set_aside and "set aside" in c.describe()
    assert c.rounds_current == 2 and c.spread is not None and c.spread < 0.2
    assert c.verdict in ("same", "undecided") and abs(c.change) < 0.05
    # A machine that is bimodal from process to process (1.4x apart): both states are the
    # spread, none is set aside, and unchanged code is not called slower.
    bimodal = _rounds([0.31, 0.43, 0.32, 0.44, 0.31])
    again = _rounds([0.44, 0.43, 0.45], seed=22)
    c = compare_runs(bimodal, again, threshold=FailThreshold("median", 0.05))
    assert c.set_aside == "" and c.verdict != "slower"
    # Fewer than 3 rounds on a side: nothing is set aside there.
    assert compare_runs(base, _rounds([1.0, 7.0], seed=23)).set_aside == ""

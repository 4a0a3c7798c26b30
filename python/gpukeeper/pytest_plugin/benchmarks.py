"""The ``gpu_benchmark`` fixture's session: results kept, saved per machine and compared
with a saved run, with verdicts from the spread between processes
(:mod:`gpukeeper.timing.regression`).

A saved run holds rounds, one per fresh process: ``--gpu-benchmark-rounds=K`` measures
K of them in one invocation (:mod:`.rounds`; by default a run saved without a compare
gets 5 when they fit a time budget), ``--gpu-benchmark-save-append`` adds this
invocation's rounds to a saved run. With one round the comparison is made as each test
runs, and decided there: a test found slower past the threshold, or undecided with a
change past it, is measured again in fresh processes of that test alone, one after
another, until the verdict is decided, ``--gpu-benchmark-confirm`` rounds have run or
the time budget (``--gpu-benchmark-confirm-budget``, by default 3x the benchmark's own
time plus 2 s for each process's start; the first two rounds always run) is spent. A
regression then fails that test, in pytest's summary and in its JUnit report like any
failed test. With several rounds the
comparison is made at the end, over all of them; a regression found there fails the test
run, and the summary names it.

Under pytest-xdist each worker measures and compares its own tests and hands its results
and comparisons to the controller, which runs the further rounds, saves the run once and
prints one table.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from gpukeeper.base.arg_checks import check_int
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.pytest_plugin import rounds as _rounds
from gpukeeper.timing.benchmark import benchmark_function
from gpukeeper.timing.benchmark_result import BenchmarkResult
from gpukeeper.timing.regression import (
    Comparison,
    compare_runs,
    decide,
    parse_fail_threshold,
    regression,
)
from gpukeeper.timing.store import DEFAULT_ROOT, RunStore, machine_info

__all__ = [
    "AUTO_ROUNDS",
    "AUTO_BUDGET_S",
    "BenchmarkSession",
    "add_benchmark_options",
    "make_gpu_benchmark",
]

#: The rounds a saved run gets under ``--gpu-benchmark-rounds=auto`` when they fit
#: :data:`AUTO_BUDGET_S`: five processes measure a spread that 2x changes clear on a busy
#: 2-core machine whose processes land in states 1.5x apart.
AUTO_ROUNDS = 5
AUTO_BUDGET_S = 120.0
#: What starting a further round's pytest costs beyond its benchmarks (a guess on the
#: safe side: interpreter, plugins and collection).
ROUND_START_S = 2.0


def add_benchmark_options(group: Any) -> None:
    group.addoption(
        "--gpu-benchmark-save",
        default=None,
        metavar="NAME",
        help="save the gpu_benchmark results of this test run as run NAME of this machine "
        "(replacing a run of that name)",
    )
    group.addoption(
        "--gpu-benchmark-save-append",
        action="store_true",
        default=False,
        help="with --gpu-benchmark-save: add this test run's results to run NAME as more rounds "
        "instead of replacing it (each invocation is one fresh process: run it k times "
        "for k rounds)",
    )
    group.addoption(
        "--gpu-benchmark-rounds",
        default="auto",
        metavar="K",
        help="measure each gpu_benchmark in K fresh processes: this one, then K-1 reruns of "
        "this invocation running only the benchmark tests; saved and compared as K "
        "rounds, so that verdicts know the spread between processes. Default auto: a run "
        f"saved (not appended) without a compare gets {AUTO_ROUNDS} rounds when the "
        f"further ones fit in {AUTO_BUDGET_S:g} s, else 1 (and says so); a compare gets 1, "
        "and decides with "
        "--gpu-benchmark-confirm",
    )
    group.addoption(
        "--gpu-benchmark-compare",
        nargs="?",
        const="",
        default=None,
        metavar="NAME",
        help=(
            "compare each gpu_benchmark result with saved run NAME (default: this machine's latest)"
        ),
    )
    group.addoption(
        "--gpu-benchmark-compare-fail",
        default=None,
        metavar="STAT:PERCENT",
        help="with --gpu-benchmark-compare: fail a test slower beyond the spread between "
        "processes and by more than this, e.g. median:5%%",
    )
    group.addoption(
        "--gpu-benchmark-confirm",
        default="4",
        metavar="N",
        help="with --gpu-benchmark-compare-fail and one round: measure a benchmark found "
        "slower past the threshold, or undecided with a change past it, again in up to N "
        "fresh processes of that test alone, stopping once the verdict is decided, and fail "
        "the test when all its rounds together are a regression; 0: decide on this process "
        "alone (default %(default)s)",
    )
    group.addoption(
        "--gpu-benchmark-confirm-budget",
        default=None,
        metavar="SECONDS",
        help="with --gpu-benchmark-confirm: start no further round once this many seconds "
        "went to a test's confirmation; the first two rounds always run (default: 3x the "
        "benchmark's own time, plus 2 s for each fresh process's start)",
    )
    group.addoption(
        "--gpu-benchmark-storage",
        default=str(DEFAULT_ROOT),
        metavar="DIR",
        help="where runs are saved (default %(default)s)",
    )


class BenchmarkSession:
    """The test run's gpu_benchmark results, the baseline they are compared with, and
    the comparisons made."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.save_as: Optional[str] = config.getoption("--gpu-benchmark-save")
        self.append = bool(config.getoption("--gpu-benchmark-save-append"))
        compare: Optional[str] = config.getoption("--gpu-benchmark-compare")
        fail: Optional[str] = config.getoption("--gpu-benchmark-compare-fail")
        rounds = config.getoption("--gpu-benchmark-rounds")
        self.rounds_auto = str(rounds).strip().lower() == "auto"
        self.rounds = 1 if self.rounds_auto else _parse_count(rounds, "--gpu-benchmark-rounds", 1)
        self.bench_seconds = 0.0  # the benchmarks' own time in this process
        self.confirm = _parse_count(
            config.getoption("--gpu-benchmark-confirm"), "--gpu-benchmark-confirm", 0
        )
        budget = config.getoption("--gpu-benchmark-confirm-budget")
        self.confirm_budget: Optional[float] = (
            None if budget is None else _parse_seconds(budget, "--gpu-benchmark-confirm-budget")
        )
        self.threshold = parse_fail_threshold(fail) if fail is not None else None
        if self.threshold is not None and compare is None:
            raise InvalidInputError("--gpu-benchmark-compare-fail needs --gpu-benchmark-compare")
        if self.append and self.save_as is None:
            raise InvalidInputError("--gpu-benchmark-save-append needs --gpu-benchmark-save=NAME")
        if self.save_as is not None:
            RunStore.check_name(self.save_as)
        self.compare_with = compare
        self.child = _rounds.is_round_child()
        if self.child:  # a further round: measure and hand back, the parent does the rest
            self.save_as, self.compare_with, self.threshold, self.rounds = None, None, None, 1
        self.root = Path(config.getoption("--gpu-benchmark-storage"))
        given = self.root != Path(DEFAULT_ROOT)  # the default folder is made as needed
        if (
            given
            and self.save_as is not None
            and not self.root.exists()
            and not self.root.parent.is_dir()
        ):
            # A typo would otherwise make a tree of folders no later compare looks in.
            raise InvalidInputError(
                f"--gpu-benchmark-storage={self.root}: its parent folder {self.root.parent} does "
                "not exist; create it, or name a folder inside an existing one"
            )
        self.created_root = self.save_as is not None and not self.root.exists()
        self.store: Optional[RunStore] = None
        self.baseline: Optional[Dict[str, List[BenchmarkResult]]] = None
        self.results: Dict[str, BenchmarkResult] = {}
        self.later_rounds: Dict[str, List[BenchmarkResult]] = {}
        self.comparisons: List[Comparison] = []
        self.failures: List[str] = []
        self.saved_path: Optional[Path] = None
        self.baseline_error: Optional[str] = None

    def open(self) -> None:
        """Reads the machine and the baseline once, at the first benchmark. A baseline that
        cannot be read fails every benchmark test alike, with one line (``baseline_error``)."""
        if self.store is not None:
            return
        self.store = RunStore(self.root, machine_info())
        if self.compare_with is not None:
            try:
                self.baseline = self.store.load_rounds(self.compare_with or None)
            except InvalidInputError as e:
                self.baseline_error = f"--gpu-benchmark-compare: {e}"
                return
            self.compare_with = self.compare_with or self.store.latest()

    def record(
        self, key: str, result: BenchmarkResult, seconds: float, say: Callable[[str], None]
    ) -> Optional[str]:
        """Keeps ``result`` (measured in ``seconds``); with one round, compares it with the
        baseline now and decides, measuring fresh rounds of this test while undecided
        (module docstring). The failure text when it is a regression past the threshold,
        else None."""
        self.results[key] = result
        self.bench_seconds += seconds
        if self.rounds > 1:
            return None  # compared at the end, over every round (finish_rounds)
        base = self.baseline.get(key) if self.baseline is not None else None
        if base is None:
            return None
        confirm = self.confirm if self.threshold is not None else 0
        # 3x the benchmark's own time, plus each fresh process's start: a fast benchmark
        # would otherwise spend its budget on starting pytest and stop undecided.
        default = 3.0 * seconds + ROUND_START_S * confirm
        budget = self.confirm_budget if self.confirm_budget is not None else default
        first = compare_runs(base, [result], threshold=self.threshold)

        def fresh_rounds() -> Iterator[BenchmarkResult]:
            # One process may have landed in a state the baseline never saw, and one round
            # cannot measure the spread between processes: fresh ones decide.
            say(
                f"gpukeeper: {key}: {first.verdict}, {first.change:+.1%} against saved run "
                f"{self.compare_with!r}; measuring it in up to {confirm} fresh process(es) "
                f"(budget {budget:.3g} s) to decide"
            )
            start = time.monotonic()
            for i in range(confirm):
                if i >= 2 and time.monotonic() - start > budget:
                    say(f"gpukeeper: {key}: the budget of {budget:.3g} s is spent after {i} rounds")
                    return
                for found in _rounds.run_rounds(self.config, [key], 1, say, number=i + 2):
                    if key in found:
                        self.later_rounds.setdefault(key, []).append(found[key])
                        yield found[key]

        comparison = dataclasses.replace(
            decide(base, result, fresh_rounds(), self.threshold, confirm), name=key
        )
        self.comparisons.append(comparison)
        return self._failure(key, comparison)

    def _compare(self, key: str, current: List[BenchmarkResult]) -> Optional[Comparison]:
        base = self.baseline.get(key) if self.baseline is not None else None
        if base is None:
            return None
        comparison = dataclasses.replace(
            compare_runs(base, current, threshold=self.threshold), name=key
        )
        self.comparisons.append(comparison)
        return comparison

    def _failure(self, key: str, comparison: Optional[Comparison]) -> Optional[str]:
        threshold = self.threshold
        if comparison is None or threshold is None or not regression(comparison, threshold):
            return None
        return (
            f"gpu_benchmark: {key} is slower than saved run {self.compare_with!r} beyond "
            f"the spread between processes and by more than "
            f"{threshold.fraction:.1%}: " + comparison.describe()
        )

    def finish_rounds(self, say: Callable[[str], None]) -> List[str]:
        """In the controller, at the end of the session, with ``--gpu-benchmark-rounds`` K >
        1: measures rounds 2..K of every benchmark in fresh processes and compares each
        over all its rounds. The failure texts of the regressions found."""
        if self.child or not self.results:
            return []
        if (
            self.rounds_auto
            and self.save_as is not None
            and self.compare_with is None
            and not self.append  # one round per invocation, as the user collects them
        ):
            self.rounds = self._auto_rounds(say)
        if self.rounds <= 1:
            return []
        keys, extra = list(self.results), self.rounds - 1
        for found in _rounds.run_rounds(self.config, keys, extra, say):
            for key, result in found.items():
                if key in keys:
                    self.later_rounds.setdefault(key, []).append(result)
        if self.compare_with is None:
            return []
        self.comparisons = [c for c in self.comparisons if c.name not in keys]
        try:
            if self.baseline is None:  # every result came from xdist workers
                store = self.open_store()
                self.baseline = store.load_rounds(self.compare_with or None)
                self.compare_with = self.compare_with or store.latest()
            for key in keys:
                comparison = self._compare(
                    key, [self.results[key]] + self.later_rounds.get(key, [])
                )
                failure = self._failure(key, comparison)
                if failure is not None:
                    self.failures.append(failure)
        except InvalidInputError as e:
            self.failures.append(f"gpu_benchmark: {e}")
        return self.failures

    def _auto_rounds(self, say: Callable[[str], None]) -> int:
        """How many rounds a saved run gets by default: :data:`AUTO_ROUNDS` when the further
        ones fit in :data:`AUTO_BUDGET_S` (each costs the benchmarks' time of this process and
        a pytest start), else 1, said once. A baseline of one round leaves the spread between
        processes unmeasured, and a compare against it calls only a change beyond 2x until
        its own fresh rounds measure it."""
        per_round = self.bench_seconds + ROUND_START_S
        if per_round * (AUTO_ROUNDS - 1) <= AUTO_BUDGET_S:
            return AUTO_ROUNDS
        say(
            f"gpukeeper: saving 1 round: {AUTO_ROUNDS - 1} more would take about "
            f"{per_round * (AUTO_ROUNDS - 1):.0f} s (over {AUTO_BUDGET_S:g} s); a baseline of one "
            "round leaves the spread between processes unmeasured. --gpu-benchmark-rounds=K "
            "saves K, or --gpu-benchmark-save-append adds one per invocation"
        )
        return 1

    def all_rounds(self) -> Dict[str, List[BenchmarkResult]]:
        """Every benchmark's rounds: this process's result, then the further rounds."""
        return {key: [r] + self.later_rounds.get(key, []) for key, r in self.results.items()}

    def open_store(self) -> RunStore:
        """The store, for a controller whose results all came from xdist workers."""
        if self.store is None:
            self.store = RunStore(self.root, machine_info())
        return self.store

    def save(self) -> None:
        """Saves the results as ``--gpu-benchmark-save`` says (nothing to save: nothing
        done); a round's child hands them back to its parent instead."""
        if self.child:
            _rounds.write_round(self.export())
            return
        if self.save_as is None or not self.results:
            return
        self.saved_path = self.open_store().save(
            self.save_as, self.all_rounds(), append=self.append
        )

    def export(self) -> Dict[str, Any]:
        """What a worker hands the controller (plain JSON types)."""
        return {
            "results": {k: r.to_dict() for k, r in self.results.items()},
            "comparisons": [dataclasses.asdict(c) for c in self.comparisons],
            "later_rounds": {k: [r.to_dict() for r in v] for k, v in self.later_rounds.items()},
            "compare_with": self.compare_with,
        }

    def merge(self, exported: Dict[str, Any]) -> None:
        """Takes in what a worker exported."""
        for key, data in exported.get("results", {}).items():
            self.results[key] = BenchmarkResult.from_dict(data)
        self.comparisons += [Comparison(**c) for c in exported.get("comparisons", [])]
        for key, found in exported.get("later_rounds", {}).items():
            self.later_rounds[key] = [BenchmarkResult.from_dict(d) for d in found]
        if exported.get("compare_with"):
            self.compare_with = exported["compare_with"]

    def summary_lines(self) -> List[str]:
        """The comparison table, slowest first, then the regressions found at the end of
        the test run (several rounds)."""
        width = max([len(c.name) for c in self.comparisons] + [1])
        lines = [
            f"{c.name:<{width}}  {c.describe()}"
            for c in sorted(self.comparisons, key=lambda c: -c.ratio)
        ]
        return lines + [f"FAILED {f}" for f in self.failures]


def _parse_seconds(value: Any, option: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(
            f"{option} must be a number of seconds >= 0, got {value!r}"
        ) from None
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise InvalidInputError(f"{option} must be a number of seconds >= 0, got {value!r}")
    return seconds


def _parse_count(value: Any, option: str, minimum: int) -> int:
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{option} must be an int >= {minimum}, got {value!r}") from None
    return check_int(count, option, minimum)


def make_gpu_benchmark(
    session: BenchmarkSession, key: str, say: Callable[[str], None]
) -> Callable[..., BenchmarkResult]:
    """The fixture's value for the test ``key``: call it once. ``say`` prints a line to
    the terminal while the test runs."""
    used: List[bool] = []

    def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BenchmarkResult:
        if used:
            raise InvalidInputError(f"gpu_benchmark: call it once per test ({key} called it twice)")
        used.append(True)
        session.open()
        if session.baseline_error is not None:
            # Before measuring: nothing could be compared, and the message is the same for
            # every benchmark test (no traceback through the user's fixtures).
            pytest.fail(session.baseline_error, pytrace=False)
        kwargs.setdefault("name", key)
        start = time.monotonic()
        result = benchmark_function(fn, *args, **kwargs)
        failure = session.record(key, result, time.monotonic() - start, say)
        if failure is not None:
            pytest.fail(failure, pytrace=False)
        return result

    return run

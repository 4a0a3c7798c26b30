"""The ``gpu_benchmark`` fixture's session: results kept, saved per machine and compared
with a saved run, with verdicts from the spread between processes
(:mod:`gpukeeper.timing.regression`).

A saved run holds rounds, one per fresh process: ``--gpu-benchmark-rounds=K`` measures
K of them in one invocation (:mod:`.rounds`), ``--gpu-benchmark-save-append`` adds this
invocation's rounds to a saved run. With one round the comparison is made as each test
runs; a regression is then confirmed in ``--gpu-benchmark-confirm`` fresh processes at
the end of the test run (0: it fails the test at once). With several rounds the
comparison is made at the end, over all of them. A regression found at the end fails
the test run, and the summary names it.

Under pytest-xdist each worker measures and compares its own tests and hands its results
and comparisons to the controller, which runs the further rounds, saves the run once and
prints one table.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

from gpukeeper.base.arg_checks import check_int
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.pytest_plugin import rounds as _rounds
from gpukeeper.timing.benchmark import benchmark_function
from gpukeeper.timing.benchmark_result import BenchmarkResult
from gpukeeper.timing.regression import Comparison, compare_runs, parse_fail_threshold, regression
from gpukeeper.timing.store import DEFAULT_ROOT, RunStore, machine_info

__all__ = ["BenchmarkSession", "add_benchmark_options", "make_gpu_benchmark"]


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
        default="1",
        metavar="K",
        help="measure each gpu_benchmark in K fresh processes: this one, then K-1 reruns of "
        "this invocation running only the benchmark tests; saved and compared as K "
        "rounds, so that verdicts know the spread between processes (default 1)",
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
        default="2",
        metavar="N",
        help="with --gpu-benchmark-compare-fail and one round: measure a benchmark found "
        "slower past the threshold again in N fresh processes, and fail the test run only "
        "when all its rounds together are still a regression; 0: fail the test at once "
        "(default %(default)s)",
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
        self.rounds = _parse_count(
            config.getoption("--gpu-benchmark-rounds"), "--gpu-benchmark-rounds", 1
        )
        self.confirm = _parse_count(
            config.getoption("--gpu-benchmark-confirm"), "--gpu-benchmark-confirm", 0
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
        self.store: Optional[RunStore] = None
        self.baseline: Optional[Dict[str, List[BenchmarkResult]]] = None
        self.results: Dict[str, BenchmarkResult] = {}
        self.later_rounds: Dict[str, List[BenchmarkResult]] = {}
        self.comparisons: List[Comparison] = []
        self.to_confirm: List[str] = []
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

    def record(self, key: str, result: BenchmarkResult) -> Optional[str]:
        """Keeps ``result``; with one round, compares it with the baseline now. The
        failure text when it is a regression past the threshold, else None."""
        self.results[key] = result
        if self.rounds > 1:
            return None  # compared at the end, over every round (finish_rounds)
        failure = self._compare(key, [result])
        if failure is not None and self.confirm > 0:
            # One process may have landed in a slow state the baseline never saw: the
            # verdict waits for fresh processes (finish_rounds).
            self.to_confirm.append(key)
            return None
        return failure

    def _compare(self, key: str, current: List[BenchmarkResult]) -> Optional[str]:
        base = self.baseline.get(key) if self.baseline is not None else None
        if base is None:
            return None
        comparison = dataclasses.replace(
            compare_runs(base, current, threshold=self.threshold), name=key
        )
        self.comparisons.append(comparison)
        threshold = self.threshold
        if threshold is not None and regression(comparison, threshold):
            return (
                f"gpu_benchmark: {key} is slower than saved run {self.compare_with!r} beyond "
                f"the spread between processes and by more than "
                f"{threshold.fraction:.1%}: " + comparison.describe()
            )
        return None

    def finish_rounds(self, say: Callable[[str], None]) -> List[str]:
        """In the controller, at the end of the session: with ``--gpu-benchmark-rounds``
        K > 1, measures rounds 2..K of every benchmark in fresh processes and compares
        each over all its rounds; with one round, measures the benchmarks to confirm in
        ``--gpu-benchmark-confirm`` fresh processes and compares them again. The failure
        texts of the regressions found."""
        if self.child or not self.results:
            return []
        if self.rounds > 1:
            keys, extra = list(self.results), self.rounds - 1
        elif self.to_confirm:
            keys, extra = [k for k in self.to_confirm if k in self.results], self.confirm
            say(
                f"gpukeeper: {len(keys)} benchmark(s) slower than saved run {self.compare_with!r} "
                f"past the threshold in this process; confirming in {extra} fresh process(es)"
            )
        else:
            return []
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
                failure = self._compare(key, [self.results[key]] + self.later_rounds.get(key, []))
                if failure is not None:
                    self.failures.append(failure)
        except InvalidInputError as e:
            self.failures.append(f"gpu_benchmark: {e}")
        return self.failures

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
            "to_confirm": self.to_confirm,
            "compare_with": self.compare_with,
        }

    def merge(self, exported: Dict[str, Any]) -> None:
        """Takes in what a worker exported."""
        for key, data in exported.get("results", {}).items():
            self.results[key] = BenchmarkResult.from_dict(data)
        self.comparisons += [Comparison(**c) for c in exported.get("comparisons", [])]
        self.to_confirm += exported.get("to_confirm", [])
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


def _parse_count(value: Any, option: str, minimum: int) -> int:
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{option} must be an int >= {minimum}, got {value!r}") from None
    return check_int(count, option, minimum)


def make_gpu_benchmark(session: BenchmarkSession, key: str) -> Callable[..., BenchmarkResult]:
    """The fixture's value for the test ``key``: call it once."""
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
        result = benchmark_function(fn, *args, **kwargs)
        failure = session.record(key, result)
        if failure is not None:
            pytest.fail(failure, pytrace=False)
        return result

    return run

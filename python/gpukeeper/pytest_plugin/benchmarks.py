"""The ``gpu_benchmark`` fixture's session: results kept, saved per machine and compared
with a saved run, with noise-aware verdicts (:mod:`gpukeeper.timing.regression`).

Under pytest-xdist each worker measures and compares its own tests (a regression fails
the test where it ran) and hands its results and comparisons to the controller, which
saves the run once and prints one table.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

from gpukeeper.errors import InvalidInputError
from gpukeeper.timing.benchmark import benchmark_function
from gpukeeper.timing.regression import Comparison, compare_runs, parse_fail_threshold, regression
from gpukeeper.timing.result import BenchmarkResult
from gpukeeper.timing.store import DEFAULT_ROOT, RunStore, machine_info

__all__ = ["BenchmarkSession", "add_benchmark_options", "make_gpu_benchmark"]


def add_benchmark_options(group: Any) -> None:
    group.addoption(
        "--gpu-benchmark-save", default=None, metavar="NAME",
        help="save the gpu_benchmark results of this session as run NAME of this machine")
    group.addoption(
        "--gpu-benchmark-compare", nargs="?", const="", default=None, metavar="NAME",
        help="compare each gpu_benchmark result with saved run NAME (default: this machine's latest)")
    group.addoption(
        "--gpu-benchmark-compare-fail", default=None, metavar="STAT:PERCENT",
        help="with --gpu-benchmark-compare: fail a test slower beyond the noise by more than "
             "this, e.g. median:5%%")
    group.addoption(
        "--gpu-benchmark-storage", default=str(DEFAULT_ROOT), metavar="DIR",
        help="where runs are saved (default %(default)s)")


class BenchmarkSession:
    """The session's gpu_benchmark results, the baseline they are compared with, and
    the comparisons made."""

    def __init__(self, config: pytest.Config) -> None:
        self.save_as: Optional[str] = config.getoption("--gpu-benchmark-save")
        compare: Optional[str] = config.getoption("--gpu-benchmark-compare")
        fail: Optional[str] = config.getoption("--gpu-benchmark-compare-fail")
        self.threshold = parse_fail_threshold(fail) if fail is not None else None
        if self.threshold is not None and compare is None:
            raise InvalidInputError("--gpu-benchmark-compare-fail needs --gpu-benchmark-compare")
        if self.save_as is not None:
            RunStore.check_name(self.save_as)
        self.compare_with = compare
        self.root = Path(config.getoption("--gpu-benchmark-storage"))
        self.store: Optional[RunStore] = None
        self.baseline: Optional[Dict[str, BenchmarkResult]] = None
        self.results: Dict[str, BenchmarkResult] = {}
        self.comparisons: List[Comparison] = []
        self.saved_path: Optional[Path] = None

    def open(self) -> None:
        """Reads the machine and the baseline once, at the first benchmark."""
        if self.store is not None:
            return
        self.store = RunStore(self.root, machine_info())
        if self.compare_with is not None:
            self.baseline = self.store.load(self.compare_with or None)
            self.compare_with = self.compare_with or self.store.latest()

    def record(self, key: str, result: BenchmarkResult) -> Optional[str]:
        """Keeps ``result``; compares it with the baseline. The failure text when it is
        a regression past the threshold, else None."""
        self.results[key] = result
        base = self.baseline.get(key) if self.baseline is not None else None
        if base is None:
            return None
        stat = self.threshold.stat if self.threshold is not None else "median"
        comparison = compare_runs(base, result, stat)
        self.comparisons.append(comparison)
        if regression(comparison, self.threshold):
            return (f"gpu_benchmark: {key} is slower than saved run {self.compare_with!r} beyond "
                    f"the noise and by more than {self.threshold.fraction:.1%}: "  # type: ignore[union-attr]
                    + comparison.describe())
        return None

    def save(self) -> None:
        """Saves the results as ``--gpu-benchmark-save`` says (nothing to save: nothing done)."""
        if self.save_as is None or not self.results:
            return
        if self.store is None:  # results from xdist workers: this process measured none
            self.store = RunStore(self.root, machine_info())
        self.saved_path = self.store.save(self.save_as, self.results)

    def export(self) -> Dict[str, Any]:
        """What a worker hands the controller (plain JSON types)."""
        return {"results": {k: r.to_dict() for k, r in self.results.items()},
                "comparisons": [dataclasses.asdict(c) for c in self.comparisons],
                "compare_with": self.compare_with}

    def merge(self, exported: Dict[str, Any]) -> None:
        """Takes in what a worker exported."""
        for key, data in exported.get("results", {}).items():
            self.results[key] = BenchmarkResult.from_dict(data)
        self.comparisons += [Comparison(**c) for c in exported.get("comparisons", [])]
        if exported.get("compare_with"):
            self.compare_with = exported["compare_with"]

    def summary_lines(self) -> List[str]:
        """The comparison table, slowest first."""
        width = max([len(c.name) for c in self.comparisons] + [1])
        return [f"{c.name:<{width}}  {c.describe()}" for c in sorted(self.comparisons, key=lambda c: -c.ratio)]


def make_gpu_benchmark(session: BenchmarkSession, key: str) -> Callable[..., BenchmarkResult]:
    """The fixture's value for the test ``key``: call it once."""
    used = []

    def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BenchmarkResult:
        if used:
            raise InvalidInputError(f"gpu_benchmark: call it once per test ({key} called it twice)")
        used.append(True)
        kwargs.setdefault("name", key)
        result = benchmark_function(fn, *args, **kwargs)
        session.open()
        failure = session.record(key, result)
        if failure is not None:
            pytest.fail(failure, pytrace=False)
        return result

    return run

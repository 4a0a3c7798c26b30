"""gpukeeper's pytest plugin: a per-test GPU memory leak check and a per-test ``GPUContext``.

Registered through the ``pytest11`` entry point, so installing gpukeeper is enough. It
does nothing to a test that does not ask for it:

- ``@pytest.mark.no_gpu_leak(tolerance_mb=0.0, track_allocations=False)`` fails a test
  that leaves more memory allocated after it than before it. Counted: the device memory
  of every framework in use (PyTorch, CuPy, JAX) and every gpukeeper pool, host pools
  included. The failure names what is held (shape, dtype and bytes of the live tensors
  and arrays; their creating lines with ``track_allocations=True``).
- ``--gpu-leaks[=TOLERANCE_MB]`` applies that check to every test;
  ``@pytest.mark.allow_gpu_leak`` exempts one. A marker's own tolerance wins over the
  option's.
- The fixture ``gpu_context`` runs the test inside a :class:`gpukeeper.GPUContext` (the
  fixture's value) and puts its report in the test's report section "gpukeeper".
- The fixture ``gpu_benchmark(fn, *args, **kwargs)`` returns
  :func:`gpukeeper.benchmark_function`'s ``BenchmarkResult``. ``--gpu-benchmark-save=NAME``
  keeps the session's results under ``.gpukeeper/benchmarks/<machine>/NAME.json``;
  ``--gpu-benchmark-compare[=NAME]`` compares each with that run (default: the latest
  of this machine), with noise-aware verdicts (:mod:`gpukeeper.timing.regression`), and
  ``--gpu-benchmark-compare-fail=median:5%`` fails a test that is slower beyond the noise
  by more than that. A comparison table ends the terminal summary.

What counts is the net change over the test's call: fixtures are set up before the
baseline is taken, so memory a fixture holds is not the test's leak. Caches are released
after a checked test only when memory is held (``GPUContext``'s fast path).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Generator, List, Optional, Tuple

import pytest

from gpukeeper.cleanup.context import GPUContext
from gpukeeper.cleanup.report import leak_message
from gpukeeper.errors import InvalidInputError
from gpukeeper.timing.benchmark import benchmark_function
from gpukeeper.timing.regression import Comparison, compare_runs, parse_fail_threshold, regression
from gpukeeper.timing.result import BenchmarkResult
from gpukeeper.timing.store import DEFAULT_ROOT, RunStore, machine_info

__all__ = ["LEAK_SECTION", "leak_policy", "parse_tolerance_mb"]

#: The name of the report section the plugin adds to a test's report.
LEAK_SECTION = "gpukeeper"

_MiB = 1 << 20


def parse_tolerance_mb(value: Any, what: str) -> float:
    """``value`` as a tolerance in MiB (a finite number >= 0); ``InvalidInputError``
    naming ``what`` otherwise. Strings are read as numbers (the command-line form)."""
    if isinstance(value, bool):
        raise InvalidInputError(f"{what} must be a number of MiB >= 0, got {value!r}")
    try:
        mb = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{what} must be a number of MiB >= 0, got {value!r}") from None
    if not math.isfinite(mb) or mb < 0:
        raise InvalidInputError(f"{what} must be a number of MiB >= 0, got {value!r}")
    return mb


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpukeeper", "GPU memory checks (gpukeeper)")
    group.addoption(
        "--gpu-leaks", nargs="?", const="0", default=None, metavar="TOLERANCE_MB",
        help="fail every test that leaves more than TOLERANCE_MB (default 0) of GPU or "
             "gpukeeper pool memory allocated after it; @pytest.mark.allow_gpu_leak exempts one")
    group.addoption(
        "--gpu-leaks-track", action="store_true", default=False,
        help="with --gpu-leaks: record where each tensor/array is made, so that leaks name "
             "their creating line (costs microseconds per operation)")
    _add_benchmark_options(group)


def _add_benchmark_options(group: Any) -> None:
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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "no_gpu_leak(tolerance_mb=0.0, track_allocations=False): fail the test when it leaves "
        "more than tolerance_mb MiB of GPU or gpukeeper pool memory allocated (gpukeeper)")
    config.addinivalue_line(
        "markers", "allow_gpu_leak: exempt the test from --gpu-leaks (gpukeeper)")
    try:
        option = config.getoption("--gpu-leaks")
        if option is not None:
            try:
                parse_tolerance_mb(option, "--gpu-leaks")
            except InvalidInputError as e:
                if os.path.exists(str(option)):  # argparse took the path for the optional value
                    raise InvalidInputError(
                        f"{e} (a path: write --gpu-leaks=0, or put --gpu-leaks after the paths)") from None
                raise
        config.stash[_BENCH] = _BenchmarkSession(config)
    except InvalidInputError as e:
        raise pytest.UsageError(str(e)) from None


def leak_policy(item: pytest.Item) -> Optional[Tuple[float, bool]]:
    """(tolerance in MiB, track allocations) for ``item``, or None when it is not checked."""
    if item.get_closest_marker("allow_gpu_leak") is not None:
        return None
    marker = item.get_closest_marker("no_gpu_leak")
    if marker is not None:
        if marker.args:
            raise InvalidInputError(
                "no_gpu_leak takes keyword arguments only: no_gpu_leak(tolerance_mb=..., "
                f"track_allocations=...), got {marker.args!r}")
        unknown = set(marker.kwargs) - {"tolerance_mb", "track_allocations"}
        if unknown:
            raise InvalidInputError(f"no_gpu_leak: unknown argument(s) {sorted(unknown)}")
        tolerance = parse_tolerance_mb(marker.kwargs.get("tolerance_mb", 0.0), "no_gpu_leak tolerance_mb")
        track = marker.kwargs.get("track_allocations", False)
        if not isinstance(track, bool):
            raise InvalidInputError(f"no_gpu_leak: track_allocations must be True or False, got {track!r}")
        return tolerance, track
    option = item.config.getoption("--gpu-leaks")
    if option is None:
        return None
    return parse_tolerance_mb(option, "--gpu-leaks"), bool(item.config.getoption("--gpu-leaks-track"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    policy = leak_policy(item)
    if policy is None:
        return (yield)
    tolerance_mb, track = policy
    tolerance_bytes = int(tolerance_mb * _MiB)
    # The test's own exception is never replaced; nothing is armed to outlive the test.
    context = GPUContext(warn_on_leak=False, tolerance_bytes=tolerance_bytes,
                         track_allocations=track, deferred_release=False)
    context.__enter__()
    try:
        result = yield
    except BaseException:
        context.__exit__(*sys.exc_info())
        raise
    context.__exit__(None, None, None)
    report = context.report
    if report is not None and report.held_bytes > tolerance_bytes:
        item.add_report_section("call", LEAK_SECTION, report.table())
        limit = f"{tolerance_mb:g} MiB tolerated" if tolerance_mb else "none tolerated"
        hint = None if track else (
            "del what the test keeps, or mark it @pytest.mark.allow_gpu_leak; "
            "no_gpu_leak(track_allocations=True) or --gpu-leaks-track names the creating lines")
        pytest.fail(f"GPU memory leak in {item.nodeid} ({limit}):\n"
                    + leak_message(report, track, hint), pytrace=False)
    return result


@pytest.fixture
def gpu_context(request: pytest.FixtureRequest) -> Generator[GPUContext, None, None]:
    """The test runs inside a :class:`gpukeeper.GPUContext`; its report goes to the
    test's report section "gpukeeper". Leaks are reported there, not failed (use
    ``no_gpu_leak`` for that)."""
    context = GPUContext(warn_on_leak=False, deferred_release=False)
    with context:
        yield context
    if context.report is not None:
        request.node.add_report_section("teardown", LEAK_SECTION, context.report.table())


class _BenchmarkSession:
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


_BENCH = pytest.StashKey[_BenchmarkSession]()


@pytest.fixture
def gpu_benchmark(request: pytest.FixtureRequest) -> Callable[..., BenchmarkResult]:
    """``gpu_benchmark(fn, *args, **kwargs)``: :func:`gpukeeper.benchmark_function` on
    ``fn`` (its keyword arguments pass through), named after the test; the result is
    saved and compared as the ``--gpu-benchmark-*`` options say. Call it once per test."""
    session = request.config.stash[_BENCH]
    key = request.node.nodeid
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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    bench = session.config.stash.get(_BENCH, None)
    if bench is None or bench.save_as is None or not bench.results or bench.store is None:
        return
    bench.saved_path = bench.store.save(bench.save_as, bench.results)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    bench = config.stash.get(_BENCH, None)
    if bench is None:
        return
    path = bench.saved_path
    if bench.comparisons:
        terminalreporter.section(f"gpukeeper: benchmarks against saved run {bench.compare_with!r}")
        width = max(len(c.name) for c in bench.comparisons)
        for c in sorted(bench.comparisons, key=lambda c: -c.ratio):
            terminalreporter.write_line(f"{c.name:<{width}}  {c.describe()}")
    if path is not None:
        terminalreporter.write_line(f"gpukeeper: saved {len(bench.results)} benchmark(s) to {path}")

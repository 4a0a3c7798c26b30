"""gpukeeper's pytest plugin: per-test GPU leak checks, a per-test ``GPUContext``, GPU
benchmarks with saved baselines, and a table of each test's peak memory and GPU time.

Registered through the ``pytest11`` entry point, so installing gpukeeper is enough. It
does nothing to a test that does not ask for it:

- ``@pytest.mark.no_gpu_leak(tolerance_mb=0.0, track_allocations=False)`` fails a test
  that leaves more memory allocated after it than before it. Counted: the device memory
  of every framework in use (PyTorch, CuPy, JAX) and every gpukeeper pool, host pools
  included. The failure names what is held (shape, dtype and bytes of the live tensors
  and arrays; their creating lines with ``track_allocations=True``). When the counters
  show nothing held the check costs two counter reads; only then is anything
  synchronized, released or collected (:class:`gpukeeper.cleanup.leak_check.LeakCheck`).
- ``--gpu-leaks[=TOLERANCE_MB]`` applies that check to every test;
  ``@pytest.mark.allow_gpu_leak`` exempts one. A marker's own tolerance wins.
- The fixture ``gpu_context`` runs the test inside a :class:`gpukeeper.GPUContext` (the
  fixture's value) and puts its report in the test's report section "gpukeeper".
- The fixture ``gpu_benchmark(fn, *args, **kwargs)`` returns
  :func:`gpukeeper.benchmark_function`'s ``BenchmarkResult``; ``--gpu-benchmark-save``,
  ``--gpu-benchmark-compare`` and ``--gpu-benchmark-compare-fail`` keep and compare runs
  per machine, ``--gpu-benchmark-rounds`` measures them in several fresh processes
  (:mod:`.benchmarks`, :mod:`.rounds`).
- ``--gpu-memory[=N]`` ends the run with a table of each test's peak memory and GPU time,
  worst first (:mod:`.memory_table`).
- Under pytest-xdist, ``--gpu-devices=all|LIST`` gives each worker one GPU
  (:mod:`.workers`); workers hand their benchmarks and memory rows to the controller.

What counts as a leak is the net change over the test's call: fixtures are set up before
the baseline is taken, so memory a fixture holds is not the test's leak.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Generator, List, Optional

import pytest

from gpukeeper.base.errors import InvalidInputError
from gpukeeper.cleanup.context import GPUContext
from gpukeeper.pytest_plugin import rounds, workers
from gpukeeper.pytest_plugin.benchmarks import (
    BenchmarkSession,
    add_benchmark_options,
    make_gpu_benchmark,
)
from gpukeeper.pytest_plugin.leaks import (
    check_leaks_option,
    leak_check_for,
    leak_failure,
    parse_tolerance_mb,
)
from gpukeeper.pytest_plugin.memory_table import MemoryRow, RegionProbe, format_rows
from gpukeeper.timing.benchmark_result import BenchmarkResult

__all__ = ["LEAK_SECTION", "gpu_benchmark", "gpu_context", "parse_tolerance_mb"]

#: The name of the report section the plugin adds to a test's report.
LEAK_SECTION = "gpukeeper"


class _Session:
    """What the plugin keeps for one pytest session (in ``config.stash``)."""

    def __init__(self, config: pytest.Config) -> None:
        self.leaks_option: Optional[str] = config.getoption("--gpu-leaks")
        self.track_option = bool(config.getoption("--gpu-leaks-track"))
        check_leaks_option(self.leaks_option)
        memory = config.getoption("--gpu-memory")
        self.memory_limit: Optional[int] = None if memory is None else _parse_row_limit(memory)
        self.probe = RegionProbe() if self.memory_limit is not None else None
        self.rows: List[MemoryRow] = []
        self.bench = BenchmarkSession(config)
        self.worker_device: Optional[str] = None
        self.leak_checked = 0  # tests whose leak check ran (for the note without CUDA)


_SESSION = pytest.StashKey[_Session]()


def _parse_row_limit(value: str) -> int:
    try:
        limit = int(value)
    except ValueError:
        limit = -1
    if limit < 0:
        raise InvalidInputError(
            f"--gpu-memory takes the number of rows to show (0: all), got {value!r}"
        )
    return limit


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpukeeper", "GPU memory and timing (gpukeeper)")
    group.addoption(
        "--gpu-leaks",
        nargs="?",
        const="0",
        default=None,
        metavar="TOLERANCE_MB",
        help="fail every test that leaves more than TOLERANCE_MB (default 0) of GPU or "
        "gpukeeper pool memory allocated after it; @pytest.mark.allow_gpu_leak exempts one",
    )
    group.addoption(
        "--gpu-leaks-track",
        action="store_true",
        default=False,
        help="with --gpu-leaks: record where each tensor/array is made, so that leaks name "
        "their creating line (costs microseconds per operation)",
    )
    group.addoption(
        "--gpu-memory",
        nargs="?",
        const="20",
        default=None,
        metavar="N",
        help="end with a table of each test's peak memory and GPU time, worst first "
        "(N rows, default 20; 0: all). Resets PyTorch's peak statistics before each test",
    )
    group.addoption(
        "--gpu-devices",
        default=None,
        metavar="all|LIST",
        help="with pytest-xdist: give worker gwN the device LIST[N %% len(LIST)] as its "
        "CUDA_VISIBLE_DEVICES ('all': every visible device)",
    )
    add_benchmark_options(group)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: List[str]
) -> None:
    # Before the conftest files, which may initialise CUDA on import.
    option = getattr(early_config.known_args_namespace, "gpu_devices", None)
    try:
        workers.assign_worker_device(option)
    except InvalidInputError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "no_gpu_leak(tolerance_mb=0.0, track_allocations=False): fail the test when it leaves "
        "more than tolerance_mb MiB of GPU or gpukeeper pool memory allocated (gpukeeper)",
    )
    config.addinivalue_line(
        "markers", "allow_gpu_leak: exempt the test from --gpu-leaks (gpukeeper)"
    )
    devices = config.getoption("--gpu-devices")
    try:
        session = _Session(config)
        if devices is not None and workers.worker_index() is None:
            # The controller (or a run without xdist): resolved once, inherited by the workers.
            os.environ[workers.RESOLVED_ENV] = ",".join(workers.resolve_for_workers(devices))
    except InvalidInputError as e:
        raise pytest.UsageError(str(e)) from None
    if devices is not None and workers.worker_index() is not None:
        session.worker_device = os.environ.get("CUDA_VISIBLE_DEVICES")
    config.stash[_SESSION] = session


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    rounds.keep_benchmark_items(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    session = item.config.stash[_SESSION]
    check = leak_check_for(item, session.leaks_option, session.track_option)
    probe = session.probe
    if check is None and probe is None:
        return (yield)
    if probe is not None:
        probe.start()
    if check is not None:
        session.leak_checked += 1
    try:
        result = yield
    except BaseException:
        # The test's own failure is reported as it is: no leak check over it.
        if check is not None:
            check.stop_tracking()
        raise
    finally:
        if probe is not None:
            session.rows.append(probe.finish(item.nodeid))
    report = check.finish() if check is not None else None
    if check is not None and report is not None:
        failure = leak_failure(item, check, report)
        if failure is not None:
            item.add_report_section("call", LEAK_SECTION, report.table())
            pytest.fail(failure, pytrace=False)
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


@pytest.fixture
def gpu_benchmark(request: pytest.FixtureRequest) -> Callable[..., BenchmarkResult]:
    """``gpu_benchmark(fn, *args, **kwargs)``: :func:`gpukeeper.benchmark_function` on
    ``fn`` (its keyword arguments pass through), named after the test; the result is
    saved and compared as the ``--gpu-benchmark-*`` options say. Call it once per test."""
    return make_gpu_benchmark(
        request.config.stash[_SESSION].bench, request.node.nodeid, _say(request.config)
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(_SESSION, None)
    if state is None:
        return
    workeroutput: Optional[Dict[str, Any]] = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller saves and prints
        workeroutput[workers.WORKER_KEY] = {
            "bench": state.bench.export(),
            "rows": [r.to_dict() for r in state.rows],
            "device": state.worker_device,
        }
        return
    failures = state.bench.finish_rounds(_say(session.config))
    if failures and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    state.bench.save()


def _say(config: pytest.Config) -> Callable[[str], None]:
    """Prints a line on the terminal, on a line of its own (not after pytest's progress
    dots), also while a test runs with its output captured."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def say(line: str) -> None:
        if reporter is None:
            return
        if capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.ensure_newline()
                reporter.write_line(line)
        else:
            reporter.ensure_newline()
            reporter.write_line(line)

    return say


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist: takes in what a finished worker measured."""
    state = node.config.stash.get(_SESSION, None)
    data = getattr(node, "workeroutput", {}).get(workers.WORKER_KEY)
    if state is None or data is None:
        return
    state.bench.merge(data.get("bench", {}))
    state.rows += [MemoryRow(**row) for row in data.get("rows", [])]


def pytest_report_header(config: pytest.Config) -> Optional[str]:
    resolved = os.environ.get(workers.RESOLVED_ENV)
    if config.getoption("--gpu-devices") is None or not resolved:
        return None
    if resolved == workers.NO_DEVICES:
        return (
            f"gpukeeper: --gpu-devices={config.getoption('--gpu-devices')}: no CUDA device here "
            f"({workers.no_devices_reason().rstrip('.')}); the tests run on the CPU"
        )
    return f"gpukeeper: xdist workers get CUDA devices {resolved} in turn (CUDA_VISIBLE_DEVICES)"


def _no_cuda_note() -> str:
    """Once per run where leaks were checked without CUDA: what those checks could see."""
    from gpukeeper.base.runtime import cuda_available

    cuda = cuda_available()
    if cuda:
        return ""
    return (
        "gpukeeper: no usable CUDA here, so the leak checks watched gpukeeper's pools only "
        "(host pools included); memory of CPU tensors and arrays is not checked "
        f"({cuda.reason.rstrip('.')})"
    )


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_SESSION, None)
    if state is None:
        return
    if state.leak_checked:
        note = _no_cuda_note()
        if note:
            terminalreporter.write_line(note)
    bench = state.bench
    if bench.comparisons or bench.failures:
        terminalreporter.section(f"gpukeeper: benchmarks against saved run {bench.compare_with!r}")
        for line in bench.summary_lines():
            terminalreporter.write_line(line)
    if bench.saved_path is not None:
        terminalreporter.write_line(
            f"gpukeeper: saved {len(bench.results)} benchmark(s) to {bench.saved_path}"
            + (f" (created the folder {bench.root})" if bench.created_root else "")
        )
    if state.memory_limit is not None and state.rows:
        terminalreporter.section("gpukeeper: peak memory and GPU time per test, worst first")
        for line in format_rows(state.rows, state.memory_limit):
            terminalreporter.write_line(line)

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

What counts is the net change over the test's call: fixtures are set up before the
baseline is taken, so memory a fixture holds is not the test's leak. Caches are released
after a checked test only when memory is held (``GPUContext``'s fast path).
"""

from __future__ import annotations

import math
import sys
from typing import Any, Generator, Optional, Tuple

import pytest

from gpukeeper.cleanup.context import GPUContext
from gpukeeper.cleanup.report import leak_message
from gpukeeper.errors import InvalidInputError

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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "no_gpu_leak(tolerance_mb=0.0, track_allocations=False): fail the test when it leaves "
        "more than tolerance_mb MiB of GPU or gpukeeper pool memory allocated (gpukeeper)")
    config.addinivalue_line(
        "markers", "allow_gpu_leak: exempt the test from --gpu-leaks (gpukeeper)")
    option = config.getoption("--gpu-leaks")
    if option is not None:
        try:
            parse_tolerance_mb(option, "--gpu-leaks")
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

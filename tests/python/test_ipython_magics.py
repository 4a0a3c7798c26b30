"""The IPython extension (``%load_ext gpukeeper``) driven through a real, in-process
``InteractiveShell``: ``%gpu_timeit`` / ``%%gpu_timeit``, ``%%gpu_memory``, ``%gpu_report``,
their usage errors, and failed cells that must not keep memory in IPython's traceback.

Memory is planted in a host pool, so every test runs on a CPU; on a GPU machine the same
tests run with CUDA available (the magics then also watch the devices in use).
"""

from __future__ import annotations

import gc
import subprocess
import sys
from typing import Any, Tuple

import pytest

pytest.importorskip("IPython")

from IPython.core.error import UsageError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

from gpukeeper import BenchmarkResult, MemoryPool, Precision  # noqa: E402

MiB = 1 << 20
# 1 << 20 float32 elements: get_managed_buffer counts elements, not bytes.
BUFFER = "pool.get_managed_buffer(0, 1 << 20, Precision.Fp32)"


@pytest.fixture
def shell(host_pool: MemoryPool):
    """The process's InteractiveShell with the extension loaded and a host pool named
    ``pool``; the names, the output history and the last traceback are dropped after."""
    ip = InteractiveShell.instance()
    if "gpukeeper" not in ip.extension_manager.loaded:
        ip.extension_manager.load_extension("gpukeeper")
    ip.user_ns.update(pool=host_pool, Precision=Precision)
    yield ip
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    ip.run_cell("%reset -f out", silent=True)
    for name in ("pool", "kept", "res", "calls", "s", "x", "bad", "step"):
        ip.user_ns.pop(name, None)
    gc.collect()


def run(ip: InteractiveShell, cell: str) -> Tuple[Any, str, Any]:
    """(the ExecutionResult, the plain text of everything displayed, the capture)."""
    with capture_output() as cap:
        result = ip.run_cell(cell, store_history=True)
    shown = "\n".join(out.data.get("text/plain", "") for out in cap.outputs)
    return result, shown, cap


def allocated(pool: MemoryPool) -> int:
    return pool.stats(0).allocated_bytes


# --------------------------------------------------------------------- loading


def test_importing_gpukeeper_does_not_import_ipython():
    code = "import gpukeeper, sys; assert 'IPython' not in sys.modules, 'IPython imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_load_and_unload_the_extension(shell):
    magics = shell.magics_manager.magics
    assert {"gpu_timeit", "gpu_report"} <= set(magics["line"])
    assert {"gpu_timeit", "gpu_memory"} <= set(magics["cell"])
    shell.run_cell("%unload_ext gpukeeper", store_history=False)
    try:
        assert "gpu_report" not in magics["line"] and "gpu_memory" not in magics["cell"]
        result, _, _ = run(shell, "%gpu_report")
        assert isinstance(result.error_in_exec, UsageError)  # "not found"
    finally:
        shell.run_cell("%load_ext gpukeeper", store_history=False)
    assert "gpu_report" in magics["line"]


# --------------------------------------------------------------------- %gpu_timeit


def test_gpu_timeit_line_shows_the_benchmark(shell):
    result, shown, _ = run(shell, "%gpu_timeit -n 5 sum(range(100))")
    assert result.success, result.error_in_exec
    assert "sum(range(100)): 5 calls on" in shown
    assert "median" in shown and "throughput" in shown
    assert result.result is None  # displayed, not returned, without -o


def test_gpu_timeit_device_time_leads_when_asked(shell):
    result, _, _ = run(shell, "res = %gpu_timeit -o --device-time -n 5 -w 1 sum(range(10))")
    assert result.success, result.error_in_exec
    assert shell.user_ns["res"].measure == "device"
    result, _, _ = run(shell, "res2 = %gpu_timeit -o -n 5 -w 1 sum(range(10))")
    assert shell.user_ns["res2"].measure == "loop"


def test_gpu_timeit_o_returns_the_result(shell):
    result, shown, _ = run(shell, "res = %gpu_timeit -o -n 7 -w 2 sum(range(10))")
    assert result.success, result.error_in_exec
    res = shell.user_ns["res"]
    assert isinstance(res, BenchmarkResult)
    assert res.n_calls == 7 and len(res.times_ms) == 7 and res.warmup == 2
    assert res.name == "sum(range(10))"
    assert "BenchmarkResult(" in repr(res) and res.summary() in shown


def test_gpu_timeit_cell_runs_setup_once_and_times_the_body(shell):
    shell.user_ns["calls"] = []
    result, shown, _ = run(shell, "%%gpu_timeit -o -n 5 -w 3 calls.append('setup'); x = 2\ncalls.append(x)")
    assert result.success, result.error_in_exec
    calls = shell.user_ns["calls"]
    assert calls.count("setup") == 1
    assert calls.count(2) == 3 + 5  # warm-up, then the measured calls
    assert result.result.n_calls == 5
    assert shell.user_ns["x"] == 2  # the setup ran in the notebook's namespace


def test_gpu_timeit_statement_rebinds_the_notebook_names(shell):
    run(shell, "x = 0")
    result, shown, _ = run(shell, "%gpu_timeit -n 5 -w 2 -d cpu x += 1")
    assert result.success, result.error_in_exec
    assert shown.startswith("x += 1: ")
    assert shell.user_ns["x"] == 2 + 5  # every call rebound the notebook's x
    result, _, _ = run(shell, "%%gpu_timeit -o -n 3 -w 1 -d cpu x = 10\nx += 1\nx")
    assert result.success, result.error_in_exec
    assert shell.user_ns["x"] == 10 + 1 + 3  # the body rebinds what the setup bound
    assert result.result.n_calls == 3


def test_gpu_timeit_rounds_keep_the_best_median(shell):
    shell.user_ns["calls"] = []
    result, shown, _ = run(shell, "res = %gpu_timeit -o -r 3 -n 4 -w 1 calls.append(1)")
    assert result.success, result.error_in_exec
    assert len(shell.user_ns["calls"]) == 3 * (1 + 4)
    assert "best of 3 rounds (medians " in shown
    medians = [float(m) for m in shown.split("(medians ", 1)[1].split(" ms)")[0].split(", ")]
    assert medians == sorted(medians)
    assert shell.user_ns["res"].median_ms == pytest.approx(medians[0], abs=1e-4)


def test_gpu_timeit_keeps_the_statement_verbatim_and_sees_user_names(shell):
    shell.user_ns["s"] = "a  b"
    result, _, _ = run(shell, '%gpu_timeit -n 3 -w 1 -d cpu --no-flush assert s.split("  ") == ["a", "b"]')
    assert result.success, result.error_in_exec
    # A warm-up of 0 is allowed, as by benchmark_function and `gpukeeper timeit`.
    result, _, _ = run(shell, "res = %gpu_timeit -o -n 2 -w 0 -d cpu -- -len(s)")
    assert result.success, result.error_in_exec
    assert shell.user_ns["res"].device == "cpu" and not shell.user_ns["res"].l2_flush


BAD_LINES = [
    ("%gpu_timeit -n 0 x", "-n needs a whole number >= 1"),
    ("%gpu_timeit -n many x", "-n needs a whole number >= 1"),
    ("%gpu_timeit -r -1 x", "-r needs a whole number >= 1"),
    ("%gpu_timeit -w -1 x", "-w needs a whole number >= 0"),
    ("%gpu_timeit -q x", "unknown option '-q'"),
    ("%gpu_timeit -n", "option -n needs a value"),
    ("%gpu_timeit -n 3 -n 4 x", "given twice"),
    ("%gpu_timeit -n 3", "no statement to time"),
    ("%gpu_timeit -d gpu x", "unknown -d 'gpu'"),
    ("%gpu_timeit -d cuda:99 x", "99"),  # no such device, or no CUDA at all
    ("%%gpu_timeit -n 2\n# a comment\n", "no statement to time (only comments"),
    ("%%gpu_memory --tolerance-mb -3\nx = 1", "--tolerance-mb needs a number >= 0"),
    ("%%gpu_memory --tolerance-mb\nx = 1", "option --tolerance-mb needs a value"),
    ("%%gpu_memory 1 + 1\nx = 1", "unexpected '1 + 1'"),
    ("%gpu_report everything", "unexpected 'everything'"),
    ("%gpu_report --json=yes", "--json takes no value"),
]


@pytest.mark.parametrize("line, message", BAD_LINES, ids=[b[0].split("\n")[0] for b in BAD_LINES])
def test_bad_options_are_one_line_usage_errors(shell, line, message):
    result, shown, cap = run(shell, line)
    error = result.error_in_exec
    assert isinstance(error, UsageError), error
    text = str(error)
    assert message in text and "\n" not in text
    written = line.split()[0]  # "%gpu_timeit", "%%gpu_memory": the message names it
    assert text.startswith(f"{written}: ")
    assert "Traceback" not in cap.stderr and "UsageError: " + text in cap.stderr
    assert shown == ""  # nothing ran


FAILING_CODE = [
    ("%gpu_timeit -n 2 1 +", "%gpu_timeit: the statement is not Python: invalid syntax (line 1: 1 +)"),
    ("%%gpu_timeit -n 2\nx = 1\n1 +", "%%gpu_timeit: the statement is not Python: invalid syntax (line 3: 1 +)"),
    ("%%gpu_timeit -n 2 x = (\nx", "%%gpu_timeit: the setup is not Python: "),
    ("%gpu_timeit -n 2 -d cpu 1 / 0", "%gpu_timeit: the statement raised ZeroDivisionError: division by zero"),
    ("%gpu_timeit -n 2 -d cpu raise KeyError('k')", "%gpu_timeit: the statement raised KeyError: 'k'"),
    ("%%gpu_timeit -n 2 -d cpu raise ValueError('no\\nmore')\nx = 1",
     "%%gpu_timeit: the setup raised ValueError: no ..."),
]


@pytest.mark.parametrize("cell, message", FAILING_CODE, ids=[c[0].split("\n")[0] for c in FAILING_CODE])
def test_failing_code_is_a_one_line_error(shell, cell, message):
    result, shown, cap = run(shell, cell)
    error = result.error_in_exec
    assert isinstance(error, UsageError), error
    assert str(error).startswith(message) and "\n" not in str(error)
    assert "Traceback" not in cap.stderr and cap.stderr.strip() == f"UsageError: {error}"
    assert shown == ""


# --------------------------------------------------------------------- %%gpu_memory


def _row(shown: str, where: str, framework: str) -> list:
    """The cells of the table row for ``where``/``framework`` (sizes as 'N unit')."""
    for line in shown.splitlines():
        parts = line.split()
        if parts[:2] == [where, framework]:
            rest = parts[2:]
            return [" ".join(rest[i:i + 2]) for i in range(0, len(rest), 2)]
    raise AssertionError(f"no row {where} {framework} in:\n{shown}")


def test_gpu_memory_names_a_planted_leak(shell, host_pool):
    result, shown, _ = run(shell, f"%%gpu_memory\nkept = {BUFFER}")
    assert result.success, result.error_in_exec
    assert allocated(host_pool) == 4 * MiB  # the cell's name still holds it
    before, peak, after = _row(shown, "host", "gpukeeper")[:3]
    assert (before, peak, after) == ("0 B", "4.0 MiB", "4.0 MiB")
    assert "LEAK: 4.0 MiB still held after the cell (gpukeeper 4.0 MiB on host" in shown
    assert "kept: gpukeeper ManagedBuffer (1048576,) fp32, 4.0 MiB on host" in shown
    # A notebook gets the same table as HTML, as every other result of the magics.
    _, _, cap = run(shell, "%%gpu_memory\nkept2 = kept")
    html = "\n".join(out.data.get("text/html", "") for out in cap.outputs)
    assert "<table" in html and "allocated before" in html and "gpu_memory: cell ran in" in html
    run(shell, "del kept, kept2")
    assert allocated(host_pool) == 0


def test_gpu_memory_a_clean_cell_shows_its_peak_and_no_leak(shell, host_pool):
    result, shown, _ = run(shell, f"%%gpu_memory\nx = {BUFFER}\nx.release()\ndel x")
    assert result.success, result.error_in_exec
    before, peak, after, reserved_before, reserved_after = _row(shown, "host", "gpukeeper")
    assert (before, peak, after) == ("0 B", "4.0 MiB", "0 B")
    assert reserved_after == "0 B"  # the context released the pool's cache
    assert "no leak" in shown and "LEAK" not in shown
    assert allocated(host_pool) == 0


def test_gpu_memory_small_leak_within_tolerance_is_named_but_not_a_leak(shell, host_pool):
    result, shown, _ = run(shell, f"%%gpu_memory --tolerance-mb 8\nkept = {BUFFER}")
    assert result.success, result.error_in_exec
    assert "within tolerance: 4.0 MiB still held" in shown and "LEAK" not in shown
    assert "ManagedBuffer (1048576,) fp32" in shown
    run(shell, "del kept")


def test_gpu_memory_keeps_ipython_semantics(shell):
    result, shown, _ = run(shell, "%%gpu_memory -d cpu\nx = 21\nx * 2")
    assert result.success and result.result == 42  # the last expression is the cell's value
    assert shell.user_ns["x"] == 21  # names land in the notebook
    assert "gpu_memory: cell ran in" in shown


def test_gpu_memory_failed_cell_keeps_no_memory(shell, host_pool):
    cell = (
        "%%gpu_memory\n"
        "def step():\n"
        f"    held = {BUFFER}\n"
        "    raise RuntimeError('failed on purpose')\n"
        "step()\n"
    )
    result, shown, _ = run(shell, cell)
    assert isinstance(result.error_in_exec, RuntimeError)  # the cell's own error
    assert sys.last_traceback is not None  # IPython keeps the traceback...
    assert allocated(host_pool) == 0  # ...but its frames hold no buffer
    assert host_pool.stats(0).reserved_bytes == 0
    assert "and raised RuntimeError" in shown and "no leak" in shown


def test_gpu_timeit_failed_statement_keeps_no_memory(shell, host_pool):
    shell.run_cell(f"def bad():\n    held = {BUFFER}\n    raise ValueError('bad call')\n")
    result, _, _ = run(shell, "%gpu_timeit -n 3 bad()")
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec) == "%gpu_timeit: the statement raised ValueError: bad call"
    assert allocated(host_pool) == 0  # the failed call's frames went with its exception...
    assert result.error_in_exec.__context__ is None  # ...which the error shown does not keep


# --------------------------------------------------------------------- %gpu_report


def test_gpu_report_shows_the_memory_report(shell):
    result, shown, _ = run(shell, "%gpu_report")
    assert result.success, result.error_in_exec
    assert "gpukeeper memory report:" in shown and "total" in shown
    assert ("CPU mode" in shown) or ("CUDA device" in shown)


def test_gpu_report_json_and_cpu(shell):
    result, _, cap = run(shell, "%gpu_report -d cpu --json")
    assert result.success, result.error_in_exec
    data = cap.outputs[0].data["application/json"]
    assert data["mode"] == "cpu" and data["total_bytes"] > 0
    assert '"mode": "cpu"' in cap.outputs[0].data["text/plain"]

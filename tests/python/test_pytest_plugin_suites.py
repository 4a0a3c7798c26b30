"""gpukeeper's pytest plugin beside the tools a suite already uses: the ``--gpu-memory``
table, pytest-xdist (``-n 2``, one device per worker, results handed to the controller),
and pytest-benchmark / pytest-memray in the same session."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("gpukeeper.pytest_plugin")

HEADER = """
import os
import pytest
import gpukeeper

POOL = gpukeeper.MemoryPool(kind="host")
KEPT = []

def take(mib):  # mib MiB, freed on return: get_managed_buffer counts float32 elements
    buf = POOL.get_managed_buffer(0, mib << 18)
    del buf
"""


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner sessions run their own xdist controller: when this suite itself runs
    under xdist (``-n 2``), they must not inherit this worker's identity."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


def _plugin_loaded(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    if "--gpu-memory" not in result.stdout.str():
        pytest.skip("gpukeeper is not installed with its pytest11 entry point here")


def _table_rows(out: str) -> list:
    """The test names of the --gpu-memory table, in the order shown."""
    section = out.split("peak memory and GPU time per test, worst first", 1)[1]
    return re.findall(r"^(\S+::\S+)\s", section, flags=re.M)


def test_memory_table_lists_peaks_worst_first(pytester: pytest.Pytester) -> None:
    _plugin_loaded(pytester)
    pytester.makepyfile(HEADER + """
def test_small():
    take(1)

def test_big():
    take(16)

def test_none():
    pass
""")
    result = pytester.runpytest("-q", "--gpu-memory")
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    rows = _table_rows(out)
    assert [r.split("::")[1] for r in rows] == ["test_big", "test_small", "test_none"], out
    big = next(line for line in out.splitlines() if line.startswith(rows[0]))
    assert "16.0 MiB" in big, big  # peak above entry: the 16 MiB the test took and freed


def test_memory_table_limit_and_bad_value(pytester: pytest.Pytester) -> None:
    _plugin_loaded(pytester)
    pytester.makepyfile(HEADER + """
@pytest.mark.parametrize("i", range(5))
def test_many(i):
    take(i + 1)
""")
    result = pytester.runpytest("-q", "--gpu-memory=2")
    result.assert_outcomes(passed=5)
    out = result.stdout.str()
    assert len(_table_rows(out)) == 2 and "... and 3 more" in out
    bad = pytester.runpytest("-q", "--gpu-memory=x")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--gpu-memory takes the number of rows" in bad.stderr.str()


def _xdist(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    _plugin_loaded(pytester)


def test_xdist_workers_get_one_device_each(pytester: pytest.Pytester, tmp_path: Path) -> None:
    _xdist(pytester)
    out_dir = tmp_path / "seen"
    out_dir.mkdir()
    pytester.makeconftest(f"""
import os
# What the conftest sees on import: the device must be set before it.
SEEN = os.environ.get("CUDA_VISIBLE_DEVICES")
""")
    pytester.makepyfile(f"""
import os, pytest, conftest

@pytest.mark.parametrize("i", range(8))
def test_where(i):
    worker = os.environ["PYTEST_XDIST_WORKER"]
    with open(os.path.join({str(out_dir)!r}, worker), "w") as f:
        f.write(conftest.SEEN + " " + os.environ["CUDA_VISIBLE_DEVICES"])
""")
    result = pytester.runpytest_subprocess("-n", "2", "--gpu-devices=5,7", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=8)
    seen = {p.name: p.read_text() for p in out_dir.iterdir()}
    assert seen == {"gw0": "5 5", "gw1": "7 7"}, seen
    assert "xdist workers get CUDA devices 5,7" in result.stdout.str()


def test_xdist_all_devices_on_a_machine_without_cuda_runs_on_the_cpu(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpukeeper

    if gpukeeper.cuda_available():
        pytest.skip("this machine has a CUDA device")
    _xdist(pytester)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makepyfile("def test_x():\n    pass\n\ndef test_y():\n    pass\n")
    result = pytester.runpytest_subprocess("-n", "2", "--gpu-devices=all", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert "--gpu-devices=all: no CUDA device here" in result.stdout.str()
    assert "the tests run on the CPU" in result.stdout.str()


def test_xdist_bad_device_list_is_a_usage_error(pytester: pytest.Pytester) -> None:
    _xdist(pytester)
    pytester.makepyfile("def test_x():\n    pass\n")
    for bad in ("0,,1", "banana", "0,gpu1"):
        result = pytester.runpytest("-q", "-n", "2", f"--gpu-devices={bad}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR, bad
        assert "--gpu-devices takes 'all' or a comma-separated list" in result.stderr.str()


def test_xdist_leaks_fail_in_workers_and_tables_reach_the_controller(pytester: pytest.Pytester) -> None:
    _xdist(pytester)
    pytester.makepyfile(HEADER + """
def test_leaks():
    KEPT.append(POOL.get_managed_buffer(0, 4 << 18))

@pytest.mark.parametrize("i", range(4))
def test_clean(i):
    take(2)
""")
    result = pytester.runpytest_subprocess("-q", "-n", "2", "--gpu-leaks", "--gpu-memory=0", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=1)
    out = result.stdout.str()
    assert "GPU memory leak in test_xdist_leaks_fail_in_workers_and_tables_reach_the_controller.py::test_leaks" in out
    assert len(_table_rows(out)) == 5, out


def test_xdist_benchmarks_saved_once_by_the_controller(pytester: pytest.Pytester) -> None:
    _xdist(pytester)
    pytester.makepyfile("""
import pytest

@pytest.mark.parametrize("i", range(4))
def test_kernel(gpu_benchmark, i):
    gpu_benchmark(sum, range(100 * (i + 1)), n_calls=20, warmup=2, device="cpu")
""")
    result = pytester.runpytest_subprocess("-q", "-n", "2", "--gpu-benchmark-save=base",
                                           "--gpu-benchmark-storage=store", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    saved = list(Path(pytester.path, "store").rglob("base.json"))
    assert len(saved) == 1, saved
    data = json.loads(saved[0].read_text())
    assert len(data["benchmarks"]) == 4
    # Saved with the default rounds: the controller ran the further rounds, once each.
    assert {len(v) for v in data["later_rounds"].values()} == {4}
    again = pytester.runpytest_subprocess("-q", "-n", "2", "--gpu-benchmark-compare=base",
                                          "--gpu-benchmark-storage=store", "-p", "no:cacheprovider")
    again.assert_outcomes(passed=4)
    table = again.stdout.str().split("benchmarks against saved run 'base'", 1)[1]
    assert len(re.findall(r"test_kernel\[\d\]", table)) == 4


def test_beside_pytest_benchmark_and_pytest_memray(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_benchmark")
    _plugin_loaded(pytester)
    args = ["-q", "-p", "no:cacheprovider", "--benchmark-disable"]
    try:
        import pytest_memray  # noqa: F401
        args.append("--memray")
    except ImportError:
        pass  # pytest-memray is not on every machine: pytest-benchmark alone then
    pytester.makepyfile(HEADER + """
@pytest.mark.no_gpu_leak
def test_all_fixtures(benchmark, gpu_benchmark, gpu_context):
    benchmark(sum, range(10))
    gpu_benchmark(sum, range(10), n_calls=10, warmup=1, device="cpu")
    take(1)
""")
    result = pytester.runpytest_subprocess(*args, "--gpu-memory")
    result.assert_outcomes(passed=1)
    assert "peak memory and GPU time per test" in result.stdout.str()

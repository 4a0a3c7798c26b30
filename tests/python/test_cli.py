"""The ``gpukeeper`` command line: every subcommand, its errors (one line, exit 2), JSON to a
file and to stdout, a closed pipe, NO_COLOR, and the compare gate's exit codes. Run as a
real process, as users run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

import gpukeeper
from gpukeeper.timing import BenchmarkResult, benchmark_function


def gk(*args: str, env_extra: dict = None, cwd: Path = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "gpukeeper", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def _one_line_error(done: subprocess.CompletedProcess, *needles: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 or lines[0].startswith("usage:"), done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr


def test_help_lists_every_subcommand_exit_codes_and_no_rst() -> None:
    done = gk("--help")
    assert done.returncode == 0
    for name in ("check", "info", "report", "watch", "timeit", "compare", "exit codes", "141"):
        assert name in done.stdout
    assert "``" not in done.stdout and ":func:" not in done.stdout


@pytest.mark.parametrize("command", ["check", "info", "report", "watch", "timeit", "compare"])
def test_every_subcommand_has_a_description_and_examples(command: str) -> None:
    done = gk(command, "--help")
    assert done.returncode == 0
    assert "examples:" in done.stdout and f"gpukeeper {command}" in done.stdout
    assert "``" not in done.stdout


def test_version() -> None:
    done = gk("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"gpukeeper {gpukeeper.__version__}"


def test_check_passes_and_writes_json(tmp_path: Path) -> None:
    path = tmp_path / "check.json"
    done = gk("check", "--json", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpukeeper check: PASS" in done.stdout
    result = json.loads(path.read_text())
    assert result["verdict"] == "PASS"
    # The verdict names the mode, in the line and in the JSON alike.
    if gpukeeper.cuda_available():
        assert result["mode"] == "gpu" and "CPU mode" not in done.stdout
    else:
        assert result["mode"] == "cpu" and result["cuda"]
        assert "PASS in CPU mode: " in done.stdout


def test_check_json_to_stdout_is_only_json() -> None:
    done = gk("check", "--json", "-")
    assert done.returncode == 0
    assert json.loads(done.stdout)["verdict"] == "PASS"
    assert "gpukeeper check: PASS" in done.stderr  # the human lines, out of the way


def test_check_json_bad_path_is_a_one_line_error_before_any_work(tmp_path: Path) -> None:
    done = gk("check", "--json", "/no/such/dir/x.json")
    _one_line_error(done, "no such directory")
    assert "PASS" not in done.stdout
    _one_line_error(gk("check", "--json", str(tmp_path)), "is a directory")


def test_closed_pipe_is_quiet() -> None:
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m gpukeeper check | head -1"],
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.startswith("[ok  ] build") and len(done.stdout.splitlines()) == 1
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode in (0, 141)  # 141 when the pipe closed while check still wrote


def test_no_color_and_plain_when_piped() -> None:
    for env in ({}, {"NO_COLOR": "1", "FORCE_COLOR": "1"}):
        done = gk("check", env_extra=env)
        assert "\x1b[" not in done.stdout, env


def test_info_table_and_environment_export(tmp_path: Path) -> None:
    done = gk("info")
    assert done.returncode == 0
    assert "gpukeeper" in done.stdout and "NVML" in done.stdout and "{" not in done.stdout
    exported = json.loads(gk("info", "--json", "-").stdout)
    for key in ("build", "cuda", "devices", "host", "frameworks", "nvml"):
        assert key in exported
    path = tmp_path / "env.json"
    done = gk("info", "--export-json", str(path))  # the MLFF utilities' spelling: written once
    assert done.returncode == 0 and json.loads(path.read_text())["build"]["version"] == gpukeeper.__version__
    assert done.stdout.count('"build"') == 0


def test_driver_message_tells_missing_driver_apart() -> None:
    status = gpukeeper.cuda_available()
    if status:
        pytest.skip("CUDA is usable here")
    if status.driver_version == 0 and gpukeeper.build_info()["cuda"]:
        assert status.reason.startswith("No NVIDIA driver found"), status.reason
        assert "insufficient" not in status.reason
        assert "No NVIDIA driver found" in gk("info").stdout


def test_report_every_device_and_json() -> None:
    done = gk("report")
    assert done.returncode == 0 and "memory report" in done.stdout
    assert "\ntotal over CUDA device" in done.stdout or "\ntotal (CPU mode" in done.stdout
    everything = json.loads(gk("report", "--json", "-").stdout)
    assert everything["devices"] and "total_bytes" in everything["devices"][0]
    assert everything["total"]["total_bytes"] == sum(d["total_bytes"] for d in everything["devices"])
    one = json.loads(gk("report", "--device", "cpu", "--json", "-").stdout)
    assert one["mode"] == "cpu" and "devices" not in one  # one device: its MemoryReport


def test_report_bad_device_is_a_one_line_error() -> None:
    _one_line_error(gk("report", "--device", "99"), "--device 99")
    _one_line_error(gk("report", "--device", "gpu"), "argument --device: takes N, cuda:N, cuda, cpu or all, got 'gpu'")


def test_watch_bounded_and_bad_interval() -> None:
    done = gk("watch", "--count", "2", "--interval", "0.05")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(" used (") == 2  # one view per refresh
    if not gpukeeper.cuda_available():
        # Without CUDA: what the host holds, and why there is no device to watch; no "?" rows.
        assert done.stdout.count("resident memory (RSS)") == 2
        assert "no CUDA device to watch: " in done.stdout and " ? " not in done.stdout
    _one_line_error(gk("watch", "--interval", "0"), "--interval")
    _one_line_error(gk("watch", "--count", "0"), "--count")


def test_timeit_times_a_statement(tmp_path: Path) -> None:
    done = gk("timeit", "-d", "cpu", "-n", "30", "-s", "data = list(range(500))", "sum(data)")
    assert done.returncode == 0, done.stderr
    assert "30 calls" in done.stdout and "median" in done.stdout
    result = json.loads(gk("timeit", "-d", "cpu", "-n", "20", "--json", "-", "sum(range(9))").stdout)
    assert len(result["times_ms"]) == 20 and result["measure"] == "loop" and result["bound"] == "host"
    device = json.loads(gk("timeit", "-d", "cpu", "-n", "5", "--device-time", "--json", "-", "1").stdout)
    assert device["measure"] == "device"


def test_timeit_statement_rebinds_the_setup_names() -> None:
    # The setup's exit hook reads x from the namespace the statement ran in: 2 warm-up
    # and 5 measured calls of x += 1 leave it at 7 (a statement compiled as a function
    # body could not rebind x at all).
    setup = "import atexit; x = 0; atexit.register(lambda: print('final x =', x))"
    done = gk("timeit", "-d", "cpu", "-n", "5", "-w", "2", "-s", setup, "x += 1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("x += 1: ") and "final x = 7" in done.stdout
    assert gk("timeit", "-d", "cpu", "-n", "3", "-s", "x = 0", "x += 1").returncode == 0


def test_timeit_prepare_runs_the_statement_in_the_setup_namespace() -> None:
    from gpukeeper.cli.timeit_cmd import prepare

    statement, fn = prepare("total += len(items)\nitems.append(total)\ntotal", "items = [0]\ntotal = 0")
    assert [fn() for _ in range(4)] == [1, 3, 6, 10]  # each call sees the last one's names
    _, fn = prepare("y = 2 * x", "x = 21")
    assert fn() is None  # no final expression: nothing returned
    assert statement.body is not None and statement.last is not None


@pytest.mark.parametrize("args, needle", [
    (["1/"], "the statement is not Python: invalid syntax"),
    (["-s", "x = (", "x"], "the setup is not Python"),
    (["-s", "raise ValueError('nope')", "1"], "the setup raised ValueError: nope"),
    (["-d", "cpu", "1/0"], "the statement raised ZeroDivisionError: division by zero"),
    (["-d", "cpu", "-s", "from gpukeeper.base.errors import InvalidInputError",
      "raise InvalidInputError('line one\\nline two')"], "the statement raised InvalidInputError: line one ..."),
    (["-d", "cpu", "-s", "x = 0", "x += 1; x > 3 and undefined_name"], "the statement raised NameError"),
    (["-d", "cpu", "# only a comment"], "no statement to time"),
    (["-n", "0", "1"], "argument -n/--number: must be at least 1"),
    (["-d", "cuda:99", "1"], "cuda:99"),
])
def test_timeit_errors_are_one_line(args: List[str], needle: str) -> None:
    _one_line_error(gk("timeit", *args), needle)


def _saved(tmp_path: Path, name: str, scale: float = 1.0, rounds: int = 3) -> Path:
    base = benchmark_function(sum, range(2000), n_calls=60, warmup=5, device="cpu", name="sum")
    data = base.to_dict()
    results = []
    for r in range(rounds):
        # Fixed, quiet times, rounds 0.1% apart: the verdicts under test must not depend
        # on this machine's noise.
        data["times_ms"] = [(1.0 + 0.001 * r + 0.002 * (i % 7)) * scale for i in range(60)]
        results.append(BenchmarkResult.from_dict(data).to_dict())
    path = tmp_path / f"{name}.json"
    doc = {"benchmarks": {"sum": results[0]}}
    if rounds > 1:
        doc["later_rounds"] = {"sum": results[1:]}
    path.write_text(json.dumps(doc))
    return path


def test_compare_gate(tmp_path: Path) -> None:
    old = _saved(tmp_path, "old")
    same = tmp_path / "same.json"
    same.write_text(old.read_text())
    slow = _saved(tmp_path, "slow", scale=2.0)
    ok = gk("compare", str(old), str(same), "--fail", "median:5%")
    assert ok.returncode == 0 and "same" in ok.stdout, ok.stdout + ok.stderr
    bad = gk("compare", str(old), str(slow), "--fail", "median:5%")
    assert bad.returncode == 1 and "slower" in bad.stdout and "regression" in bad.stdout
    as_json = json.loads(gk("compare", str(old), str(slow), "--json", "-").stdout)
    assert as_json["comparisons"][0]["verdict"] == "slower" and as_json["regressions"] == []
    assert as_json["comparisons"][0]["rounds_baseline"] == 3 and as_json["comparisons"][0]["spread"] < 0.05


def test_compare_one_round_each_is_undecided_and_says_why(tmp_path: Path) -> None:
    old = _saved(tmp_path, "old", rounds=1)
    slow = _saved(tmp_path, "slow", scale=1.3, rounds=1)
    done = gk("compare", str(old), str(slow), "--fail", "median:5%")
    assert done.returncode == 0 and "undecided" in done.stdout and "spread unmeasured" in done.stdout


def test_compare_reads_a_single_result(tmp_path: Path) -> None:
    one = tmp_path / "one.json"
    one.write_text(benchmark_function(sum, range(100), n_calls=20, warmup=2, device="cpu", name="s").to_json())
    done = gk("compare", str(one), str(one))
    assert done.returncode == 0 and "s" in done.stdout


@pytest.mark.parametrize("content, needle", [
    (None, "No such file"),
    ("not json", "not JSON"),
    ('{"x": 1}', "not a saved benchmark run"),
])
def test_compare_bad_files_are_one_line_errors(tmp_path: Path, content, needle: str) -> None:
    good = _saved(tmp_path, "good")
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    _one_line_error(gk("compare", str(bad), str(good)), needle)


def test_compare_bad_threshold_and_usage_errors(tmp_path: Path) -> None:
    good = _saved(tmp_path, "good")
    _one_line_error(gk("compare", str(good), str(good), "--fail", "median"), "--fail")
    _one_line_error(gk("compare", str(good)), "required")
    _one_line_error(gk("nonsense"), "invalid choice")
    _one_line_error(gk(), "required")


@pytest.mark.parametrize("argv, says", [
    (("report", "--device", "None"), "argument --device: takes N, cuda:N, cuda, cpu or all, got 'None'"),
    (("watch", "--device", "gpu0", "--count", "1"), "argument --device: takes N, cuda:N, cuda, cpu or all"),
    (("timeit", "-d", "None", "1+1"), "argument -d/--device: takes N, cuda:N, cuda or cpu, got 'None'"),
    (("timeit", "-n", "0", "1+1"), "argument -n/--number: must be at least 1, got 0"),
    (("timeit", "-w", "-1", "1+1"), "argument -w/--warmup: must be at least 0, got -1"),
    (("timeit", "-n", "x", "1+1"), "argument -n/--number: takes a whole number, got 'x'"),
    (("watch", "--count", "0"), "argument --count: must be at least 1, got 0"),
])
def test_bad_flags_are_answered_in_the_command_lines_words(argv, says) -> None:
    done = gk(*argv)
    assert done.returncode == 2
    assert says in done.stderr
    assert "None for the current device" not in done.stderr and "int >=" not in done.stderr


def test_compare_never_cuts_names_off_a_terminal(tmp_path: Path) -> None:
    name = "tests/test_models.py::test_matmul_with_a_rather_long_parametrised_name[float16-4096x4096]"
    paths = []
    for label in ("a", "b"):
        path = _saved(tmp_path, label)
        doc = json.loads(path.read_text())
        doc["benchmarks"] = {name: dict(doc["benchmarks"].pop("sum"), name=name)}
        doc["later_rounds"] = {name: [dict(r, name=name) for r in doc["later_rounds"].pop("sum")]}
        path.write_text(json.dumps(doc))
        paths.append(str(path))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run([sys.executable, "-m", "gpukeeper", "compare", *paths], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert name in done.stdout and "…" not in done.stdout
    # An 80-column terminal: one block per benchmark, nothing cut, the power stated.
    narrow = subprocess.run([sys.executable, "-m", "gpukeeper", "compare", *paths], capture_output=True,
                            text=True, env={**env, "COLUMNS": "80"}, timeout=120)
    assert narrow.returncode == 0, narrow.stderr
    assert name in narrow.stdout and "…" not in narrow.stdout
    assert "could detect ±" in narrow.stdout and "over 3+3 rounds" in narrow.stdout

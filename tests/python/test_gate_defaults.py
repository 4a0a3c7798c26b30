"""The regression gate as a user first types it, in fresh pytest processes on this machine:
`pytest --gpu-benchmark-save=main` with every other option at its default, then
`pytest --gpu-benchmark-compare --gpu-benchmark-compare-fail=median:5%` (README's form).
Unchanged code passes; a pure-Python loop made 2x and 3x slower fails, every time, as a
failed test in pytest's summary and in JUnit XML. On a busy 2-core machine this loop's
processes land in states about 1.4x apart, which the default path (five saved rounds,
fresh rounds of the test until decided) must see through."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gpukeeper.pytest_plugin")

BENCH = """
import os

N = 20_000

def loop(scale):
    total = 0
    for i in range(int(N * scale)):
        total += i
    return total

def test_loop(gpu_benchmark):
    gpu_benchmark(loop, float(os.environ.get("PLANTED_SLOWDOWN", "1")), device="cpu")
"""


def _pytest(folder: Path, slowdown: float, *args: str) -> subprocess.CompletedProcess:
    env = {**__import__("os").environ, "PLANTED_SLOWDOWN": repr(slowdown)}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=str(folder), env=env, capture_output=True, text=True, timeout=600)


def test_default_options_pass_unchanged_code_and_fail_2x_and_3x_every_time(tmp_path: Path) -> None:
    (tmp_path / "test_bench.py").write_text(BENCH)
    saved = _pytest(tmp_path, 1.0, "--gpu-benchmark-save=main")
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert "benchmark round 5 of 5" in saved.stdout  # the default saves five rounds
    compare = ["--gpu-benchmark-compare", "--gpu-benchmark-compare-fail=median:5%"]
    for trial in range(2):
        same = _pytest(tmp_path, 1.0, *compare, f"--junitxml=same{trial}.xml")
        assert same.returncode == 0, same.stdout
        assert 'failures="0"' in (tmp_path / f"same{trial}.xml").read_text()
    for slowdown in (2.0, 3.0):
        for trial in range(2):
            report = tmp_path / f"slow{slowdown}-{trial}.xml"
            slow = _pytest(tmp_path, slowdown, *compare, f"--junitxml={report}")
            out = slow.stdout
            assert slow.returncode == 1, out
            assert re.search(r"^1 failed", out, re.M), out  # pytest's own summary line
            assert "FAILED test_bench.py::test_loop" in out
            junit = report.read_text()
            assert 'failures="1"' in junit and "is slower than saved run 'main'" in junit

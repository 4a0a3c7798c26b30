#!/usr/bin/env python3
"""What gpukeeper's pytest plugin adds to each test.

A file of N trivial tests runs in fresh pytest processes, alternating:
  plugin off        -p no:gpukeeper (the baseline)
  plugin, idle      the plugin loaded, nothing asked of it
  --gpu-leaks       every test checked for leaks (a GPUContext around each test call)
With --cuda (and PyTorch seeing a GPU) the conftest initialises CUDA and keeps a tensor,
as a GPU test suite would. Each mode also runs a file of one test: its time less the
baseline's is the one-time cost (importing gpukeeper, reading the options), and the
per-test cost is the slope, ((N tests - 1 test) - the baseline's same difference) / (N - 1),
medians over the rounds. Target (issue 11): at most 50 us per test when no memory is held.

  python pytest_plugin_bench.py [--tests N] [--rounds R] [--cuda] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from bench_env import cpu_name

CONFTEST_CUDA = """
import torch
KEEP = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
"""


def run_once(folder: Path, extra: List[str]) -> float:
    # The folder first: "--gpu-leaks PATH" would read PATH as the option's tolerance.
    cmd = [sys.executable, "-m", "pytest", str(folder), "-q", "-p", "no:cacheprovider", *extra]
    t = time.perf_counter()
    done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"pytest failed ({' '.join(extra)}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cuda", action="store_true", help="initialise CUDA in the conftest (needs torch + GPU)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    modes = {"plugin off": ["-p", "no:gpukeeper"], "plugin, idle": [], "--gpu-leaks": ["--gpu-leaks"]}
    times: Dict[str, Dict[int, List[float]]] = {m: {a.tests: [], 1: []} for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        folders = {}
        for n in (a.tests, 1):
            folder = Path(tmp) / f"n{n}"
            folder.mkdir()
            (folder / "test_many.py").write_text(
                "import pytest\n\n@pytest.mark.parametrize('i', range(%d))\ndef test_nothing(i):\n    pass\n" % n)
            if a.cuda:
                (folder / "conftest.py").write_text(CONFTEST_CUDA)
            folders[n] = folder
        for _ in range(a.rounds):
            for mode, extra in modes.items():
                for n, folder in folders.items():
                    times[mode][n].append(run_once(folder, extra))
    med = {m: {n: statistics.median(v) for n, v in per.items()} for m, per in times.items()}
    base = med["plugin off"]
    rows = []
    print(f"pytest plugin cost ({a.tests} tests, {a.rounds} rounds; cpu: {cpu_name()}; "
          f"{'CUDA initialised' if a.cuda else 'no CUDA'})")
    print(f"{'mode':<14} {'N tests s':>10} {'1 test s':>9} {'once ms':>8} {'us/test':>8}  target")
    for mode in modes:
        once = (med[mode][1] - base[1]) * 1e3
        per = ((med[mode][a.tests] - med[mode][1]) - (base[a.tests] - base[1])) / (a.tests - 1) * 1e6
        target = "" if mode == "plugin off" else ("<=50 met" if per <= 50 else "<=50 MISSED")
        print(f"{mode:<14} {med[mode][a.tests]:>10.3f} {med[mode][1]:>9.3f} {once:>8.1f} {per:>8.1f}  {target}")
        rows.append({"mode": mode, "median_s": med[mode][a.tests], "one_test_s": med[mode][1],
                     "once_ms": once, "us_per_test": per, "runs_s": times[mode][a.tests]})
    if a.json:
        Path(a.json).write_text(json.dumps({"tests": a.tests, "rounds": a.rounds, "cuda": a.cuda,
                                            "cpu": cpu_name(), "python": sys.version.split()[0],
                                            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

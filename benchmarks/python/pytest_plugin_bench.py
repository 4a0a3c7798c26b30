#!/usr/bin/env python3
"""What gpukeeper's pytest plugin adds to each test.

A file of N trivial tests runs in fresh pytest processes, alternating:
  plugin off        -p no:gpukeeper (the baseline)
  plugin, idle      the plugin loaded, nothing asked of it
  --gpu-leaks       every test checked for leaks (a GPUContext around each test call)
  --gpu-memory      the per-test peak memory and time table
With --cuda (and PyTorch seeing a GPU) the conftest initialises CUDA and keeps a tensor,
as a GPU test suite would. Each mode also runs a file of one test: its time less the
baseline's is the one-time cost (importing gpukeeper, reading the options), and the
per-test cost is the slope, ((N tests - 1 test) - the baseline's same difference) / (N - 1),
medians over the rounds. Target: at most 50 us per test when no memory is held.

The slope of whole pytest runs is noisy on a shared machine, so the same costs are also
taken in process, directly: the leak check's start+finish with nothing held (what
--gpu-leaks adds to a clean test), the --gpu-memory probe's start+finish, and a
GPUContext's enter+exit (the gpu_context fixture), each timed over many repetitions.

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


def in_process(cuda: bool, reps: int, rounds: int) -> List[Dict[str, float]]:
    """Median microseconds per start+finish of each per-test mechanism, in this process."""
    from gpukeeper import GPUContext
    from gpukeeper.cleanup.leak_check import LeakCheck
    from gpukeeper.pytest_plugin.memory_table import RegionProbe

    keep = None
    if cuda:
        import torch

        keep = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
    probe = RegionProbe()

    def leak_check() -> None:
        check = LeakCheck()
        check.start()
        if check.finish() is not None:
            raise SystemExit("the leak check found memory held in an empty region")

    def memory_probe() -> None:
        probe.start()
        probe.finish("x")

    def context() -> None:
        with GPUContext(warn_on_leak=False, deferred_release=False):
            pass

    from gpukeeper import frameworks
    from gpukeeper.cleanup.measure import devices_in_use, measure

    in_use = devices_in_use(None)
    # The leak check is two of each of devices_in_use and measure: the parts say where its
    # time goes, down to the single reads they are made of.
    mechanisms = [("leak check (--gpu-leaks)", leak_check), ("memory probe (--gpu-memory)", memory_probe),
                  ("GPUContext (gpu_context)", context),
                  ("  part: devices_in_use", lambda: devices_in_use(None)),
                  ("  part: measure (counters)", lambda: measure(in_use)),
                  ("    active_devices", frameworks.active_devices),
                  ("    gpu_frameworks_loaded", frameworks.gpu_frameworks_loaded),
                  ("    host_pool_memory", frameworks.host_pool_memory)]
    for name, adapter in frameworks.ADAPTERS.items():
        mechanisms.append((f"    {name}.memory", lambda a=adapter: [a.memory(d) for d in in_use]))
    if cuda:
        import torch

        mechanisms += [("    torch memory_stats_as_nested_dict",
                        lambda: torch.cuda.memory.memory_stats_as_nested_dict(0)),
                       ("    torch._C._cuda_memoryStats", lambda: torch._C._cuda_memoryStats(0)),
                       ("    torch.cuda.is_initialized", torch.cuda.is_initialized)]
    rows = []
    for name, fn in mechanisms:
        for _ in range(min(reps, 100)):
            fn()  # warm: first calls import and cache
        per = []
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            per.append((time.perf_counter() - t) / reps * 1e6)
        rows.append({"mechanism": name, "us_median": statistics.median(per), "us_min": min(per)})
    del keep
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cuda", action="store_true", help="initialise CUDA in the conftest (needs torch + GPU)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--reps", type=int, default=2000, help="repetitions per round in process")
    ap.add_argument("--skip-runs", action="store_true", help="only the in-process figures")
    a = ap.parse_args()
    direct = in_process(a.cuda, a.reps, a.rounds)
    print(f"in process ({a.reps} repetitions x {a.rounds} rounds; {'CUDA, a tensor held' if a.cuda else 'no CUDA'})")
    print(f"{'mechanism':<30} {'us median':>10} {'us min':>8}  target")
    for row in direct:
        target = "<=50 met" if row["us_median"] <= 50 else "<=50 MISSED"
        target = target if row["mechanism"].startswith("leak") else ""
        print(f"{row['mechanism']:<30} {row['us_median']:>10.1f} {row['us_min']:>8.1f}  {target}")
    if a.skip_runs:
        if a.json:
            Path(a.json).write_text(json.dumps({"cuda": a.cuda, "in_process": direct}, indent=1))
        return 0
    modes = {"plugin off": ["-p", "no:gpukeeper"], "plugin, idle": [], "--gpu-leaks": ["--gpu-leaks"],
             "--gpu-memory": ["--gpu-memory"]}
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
                                            "rows": rows, "in_process": direct}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

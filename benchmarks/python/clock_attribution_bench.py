#!/usr/bin/env python3
"""Why a device-bound region's loop time reads off its truth: the SM clock of each run's
own window, beside the error in time and in cycles.

NVML's SM clock is sampled every 2 ms in a side thread. Each of ``--pairs`` pairs is a
loop truth (N back-to-back calls by one synchronized wall clock), ``benchmark_function``,
and another truth; the method's error is its ``median_ms`` over the mean of the two
truths, and the same in cycles: each figure times the mean SM clock of its own window
(the truths' windows, and the loop batches' windows of ``benchmark_function``, taken by
wrapping ``gpukeeper.timing.loop_time.time_batch``). Where the error in time is large and
the error in cycles small, the clock moved between the windows (a power-capped GPU), not
the measurement. Two callables:

  spin      a 5 ms calibration kernel spinning by %globaltimer: its time does not follow
            the SM clock, so its error is the method's own
  matmul    three bf16 ``--n``² matmuls with elementwise ops between (power-heavy)

    python clock_attribution_bench.py [--n 8192] [--pairs 8] [--json PATH]

Needs CUDA, PyTorch and NVML; without them it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import calibration_torch, try_import, write_report  # noqa: E402

Window = Tuple[float, float]


class ClockSampler:
    """NVML's SM clock every ``period_s`` in a daemon thread, kept with the host time."""

    def __init__(self, nvml: Any, index: int, period_s: float = 0.002) -> None:
        self._nvml = nvml
        self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self._period = period_s
        self.samples: List[Tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sm = self._nvml.NVML_CLOCK_SM
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), self._nvml.nvmlDeviceGetClockInfo(self._handle, sm)))
            time.sleep(self._period)

    def mean_mhz(self, windows: List[Window]) -> float:
        vals = [c for t, c in list(self.samples) if any(a <= t <= b for a, b in windows)]
        return statistics.mean(vals) if vals else float("nan")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def truth(torch: Any, fn: Callable[[], Any], calls: int) -> Tuple[float, Window]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    return (t1 - t0) * 1e3 / calls, (t0, t1)


def run_pairs(torch: Any, gk: Any, clocks: ClockSampler, fn: Callable[[], Any], calls: int,
              pairs: int) -> List[Dict[str, float]]:
    from gpukeeper.timing import loop_time

    windows: List[Window] = []
    plain = loop_time.time_batch

    def timed_batch(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = plain(*a, **k)
        windows.append((t0, time.perf_counter()))
        return out

    loop_time.time_batch = timed_batch  # run_batches looks it up in its module
    rows = []
    try:
        for _ in range(10):
            fn()
        for _ in range(pairs):
            before, w1 = truth(torch, fn, calls)
            windows.clear()
            result = gk.benchmark_function(fn, n_calls=100, warmup=10)
            loop_windows = list(windows)
            after, w2 = truth(torch, fn, calls)
            time.sleep(0.02)  # the sampler's last readings of the window
            ref = (before + after) / 2
            clk_truth, clk_loop = clocks.mean_mhz([w1, w2]), clocks.mean_mhz(loop_windows)
            rows.append({
                "truth_ms": ref,
                "loop_ms": result.median_ms,
                "error_pct": 100 * (result.median_ms / ref - 1),
                "cycles_error_pct": 100 * ((result.median_ms * clk_loop) / (ref * clk_truth) - 1),
                "clock_truth_mhz": clk_truth,
                "clock_loop_mhz": clk_loop,
            })
    finally:
        loop_time.time_batch = plain
    return rows


def main(argv: Any = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=8192, help="matmul size (default %(default)s)")
    p.add_argument("--pairs", type=int, default=8, help="truth, method, truth pairs per callable (default %(default)s)")
    p.add_argument("--json", metavar="PATH", help="write the rows and the environment as JSON")
    args = p.parse_args(argv)
    torch = calibration_torch()
    if torch is None:
        return 0
    nvml, nvml_why = try_import("pynvml")
    import gpukeeper
    from gpukeeper import _core

    if nvml is None:
        print(f"no NVML here: nothing measured ({nvml_why})")
        return 0
    nvml.nvmlInit()
    clocks = ClockSampler(nvml, torch.cuda.current_device())
    stream = torch.cuda.current_stream()
    torch.manual_seed(0)
    a, b, c = (torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def spin() -> None:
        _core.spin_kernel(5_000_000, stream)

    def matmul() -> Any:
        x = torch.relu(a @ b)
        x = (x @ c) * 0.5 + 1.0
        return x @ a

    out: Dict[str, Any] = {}
    print(f"{'callable':10s} {'time error':>11s} {'cycles error':>13s}  SM clock truth / loop (MHz)")
    for name, fn, calls in (("spin", spin, 40), ("matmul", matmul, 50)):
        rows = run_pairs(torch, gpukeeper, clocks, fn, calls, args.pairs)
        out[name] = rows
        for r in rows:
            print(f"{name:10s} {r['error_pct']:+10.2f}% {r['cycles_error_pct']:+12.2f}%  "
                  f"{r['clock_truth_mhz']:.0f} / {r['clock_loop_mhz']:.0f}")
        print(f"{name:10s} median: time {statistics.median(r['error_pct'] for r in rows):+.2f}%, "
              f"cycles {statistics.median(r['cycles_error_pct'] for r in rows):+.2f}%")
    clocks.stop()
    write_report(args.json, torch, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

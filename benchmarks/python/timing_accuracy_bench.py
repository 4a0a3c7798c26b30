#!/usr/bin/env python3
"""How right GPU timers are: calibration kernels of known duration, timed side by side.

The kernels spin for 10 us, 100 us and 1 ms by the GPU's own nanosecond clock
(%globaltimer, gpukeeper's ``_core.spin_kernel``) and write their first and last
reading, so every launch carries its true duration. Each method times the same kernel
on an idle stream, call by call (every call waits for the GPU, as in a benchmark loop):

  raw event pair          cudaEventRecord / launch / cudaEventRecord (_core.Event)
  torch.cuda.Event        the same with PyTorch's events
  CUDATimer               gpukeeper's timer, defaults (torch events)
  CUDATimer hidden        CUDATimer(hide_launch_latency=True): a gate holds the stream
  benchmark_function      gpukeeper's benchmark, defaults (gated)
  benchmark_function raw  benchmark_function(hide_launch_latency=False)
  triton do_bench         triton.testing.do_bench(return_mode="median") (flushes L2)

Error = median reading - median true duration of the same calls. Target: within 0.5 us
on the 10 us kernel. Then the host cost of one timer start/stop pair per variant.

  python timing_accuracy_bench.py [--calls N] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import cpu_name  # noqa: E402

DURATIONS_NS = (10_000, 100_000, 1_000_000)
TARGET_ERROR_US = 0.5
SLOTS = 8192  # ring of per-launch truth records


class Truth:
    """A device ring of (start, end) %globaltimer pairs, one slot per launch."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.buf = torch.zeros(SLOTS * 2, dtype=torch.int64, device="cuda")
        self.base = self.buf.data_ptr()
        self.next = 0

    def reset(self) -> None:
        self.buf.zero_()
        self.torch.cuda.synchronize()
        self.next = 0

    def slot(self) -> int:
        address = self.base + 16 * (self.next % SLOTS)
        self.next += 1
        return address

    def durations_us(self) -> List[float]:
        pairs = self.buf.view(-1, 2).cpu().tolist()
        return [(e - s) / 1e3 for s, e in pairs if s and e]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200, help="timed calls per method and kernel")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--quick", action="store_true", help="few calls (smoke test)")
    a = ap.parse_args(argv)
    calls = 20 if a.quick else a.calls

    import gpukeeper
    from gpukeeper import _core

    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available() or not _core.calibration_kernels_available():
        print("timing_accuracy_bench: needs a CUDA GPU, PyTorch with CUDA and the calibration "
              "kernels (gpukeeper built with nvcc); nothing measured")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"skipped": True}, f)
        return 0
    try:
        import triton.testing as triton_testing
    except Exception as exc:  # noqa: BLE001 - optional peer
        triton_testing = None
        print(f"triton not usable ({exc}); its row is skipped")

    torch.zeros(1, device="cuda")
    stream = torch.cuda.current_stream()
    truth = Truth(torch)
    spin = _core.spin_kernel

    def timed_loop(duration_ns: int, measure_one: Callable[[], float]) -> Dict[str, Any]:
        truth.reset()
        for _ in range(10):  # warm-up: clocks up, events pooled, modules loaded
            measure_one()
        truth.reset()
        readings = [measure_one() for _ in range(calls)]
        return {"readings_us": readings, "truth_us": truth.durations_us()}

    def raw_pair(ns: int) -> Callable[[], float]:
        s, e = _core.Event(), _core.Event()

        def one() -> float:
            s.record(stream)
            spin(ns, stream, truth.slot())
            e.record(stream)
            return s.elapsed_ms(e) * 1e3

        return one

    def torch_pair(ns: int) -> Callable[[], float]:
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)

        def one() -> float:
            s.record()
            spin(ns, stream, truth.slot())
            e.record()
            e.synchronize()
            return s.elapsed_time(e) * 1e3

        return one

    def cuda_timer(ns: int, **kw: Any) -> Callable[[], float]:
        t = gpukeeper.CUDATimer(**kw)

        def one() -> float:
            with t:
                spin(ns, stream, truth.slot())
            return t.elapsed_ms * 1e3

        return one

    def aggregate(ns: int, run: Callable[[Callable[[], None]], float]) -> Dict[str, Any]:
        truth.reset()
        fn = lambda: spin(ns, stream, truth.slot())  # noqa: E731
        reading = run(fn)
        return {"readings_us": [reading], "truth_us": truth.durations_us()}

    methods: List[tuple] = [
        ("raw event pair", lambda ns: timed_loop(ns, raw_pair(ns))),
        ("torch.cuda.Event", lambda ns: timed_loop(ns, torch_pair(ns))),
        ("CUDATimer", lambda ns: timed_loop(ns, cuda_timer(ns))),
        ("CUDATimer hidden", lambda ns: timed_loop(ns, cuda_timer(ns, hide_launch_latency=True))),
        ("benchmark_function", lambda ns: aggregate(
            ns, lambda fn: gpukeeper.benchmark_function(fn, n_calls=calls, warmup=10).median_ms * 1e3)),
        ("benchmark_function raw", lambda ns: aggregate(
            ns, lambda fn: gpukeeper.benchmark_function(
                fn, n_calls=calls, warmup=10, hide_launch_latency=False).median_ms * 1e3)),
    ]
    if triton_testing is not None:
        methods.append(("triton do_bench", lambda ns: aggregate(
            ns, lambda fn: float(triton_testing.do_bench(fn, return_mode="median")) * 1e3)))

    rows: List[Dict[str, Any]] = []
    for ns in DURATIONS_NS:
        for label, run in methods:
            got = run(ns)
            reading = statistics.median(got["readings_us"])
            true_us = statistics.median(got["truth_us"]) if got["truth_us"] else float("nan")
            rows.append({
                "method": label,
                "kernel_us": ns / 1e3,
                "median_reading_us": reading,
                "median_true_us": true_us,
                "error_us": reading - true_us,
                "within_target": abs(reading - true_us) <= TARGET_ERROR_US,
                "calls": len(got["readings_us"]) if len(got["readings_us"]) > 1 else calls,
                "truth_samples": len(got["truth_us"]),
            })

    print(f"\n{'method':24s} {'kernel us':>9s} {'reading us':>11s} {'true us':>9s} {'error us':>9s}  "
          f"within {TARGET_ERROR_US} us")
    for r in rows:
        print(f"{r['method']:24s} {r['kernel_us']:9.0f} {r['median_reading_us']:11.3f} "
              f"{r['median_true_us']:9.3f} {r['error_us']:+9.3f}  {'yes' if r['within_target'] else 'no'}")

    # Host cost of one start/stop pair (nothing timed inside), per timer variant.
    overhead: List[Dict[str, Any]] = []
    variants = [
        ("torch.cuda.Event pair", None),
        ("CUDATimer (torch)", dict()),
        ("CUDATimer (gpukeeper events)", dict(backend="gpukeeper")),
        ("CUDATimer hidden (torch)", dict(hide_launch_latency=True)),
        ("_core.Timer", "core"),
    ]
    n_pairs = 200 if a.quick else 2000
    for label, kw in variants:
        if kw is None:
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            start, stop = (lambda: s.record()), (lambda: e.record())
            read = lambda: (e.synchronize(), s.elapsed_time(e))  # noqa: E731
        elif kw == "core":
            ct = _core.Timer(0, stream.cuda_stream)
            start, stop, read = ct.start, ct.stop, ct.elapsed_ms
        else:
            t = gpukeeper.CUDATimer(**kw)
            start, stop, read = t.start, t.stop, (lambda t=t: t.elapsed_ms)
        samples = []
        for i in range(n_pairs + 50):
            h0 = time.perf_counter_ns()
            start()
            stop()
            h1 = time.perf_counter_ns()
            read()
            if i >= 50:
                samples.append((h1 - h0) / 1e3)
        overhead.append({"variant": label, "median_us": statistics.median(samples),
                         "p90_us": sorted(samples)[int(0.9 * len(samples))]})
    print(f"\n{'start+stop host cost':32s} {'median us':>9s} {'p90 us':>8s}")
    for o in overhead:
        print(f"{o['variant']:32s} {o['median_us']:9.2f} {o['p90_us']:8.2f}")

    # What events cost the device. A GPU-bound loop of K 20 us kernels, timed by one event
    # pair around the loop, with 0, 1 or 2 events recorded between the kernels: the
    # extra period per kernel is the device time the events take.
    k = 50 if a.quick else 500
    loop_s, loop_e = _core.Event(), _core.Event()

    def period_us(events_between: int) -> float:
        marks = [_core.Event() for _ in range(events_between)]
        spin(20_000, stream)
        loop_s.record(stream)
        for _ in range(k):
            spin(20_000, stream)
            for m in marks:
                m.record(stream)
        loop_e.record(stream)
        return loop_s.elapsed_ms(loop_e) * 1e3 / k

    event_cost: Dict[str, float] = {}
    for n_between in (0, 1, 2):
        event_cost[f"period_us_{n_between}_events"] = statistics.median(
            period_us(n_between) for _ in range(5))
    base = event_cost["period_us_0_events"]
    event_cost["device_us_per_event_1"] = event_cost["period_us_1_events"] - base
    event_cost["device_us_per_event_2"] = (event_cost["period_us_2_events"] - base) / 2

    # Gated brackets: what the event pair itself reads around nothing, an empty kernel,
    # one and two 10 us kernels (the marginal cost of one more kernel on the device).
    def gated(n_kernels: int, ns: int) -> float:
        readings = []
        s, e = _core.Event(), _core.Event()
        for _ in range(25):
            with _core.StreamGate(stream):
                s.record(stream)
                for _ in range(n_kernels):
                    spin(ns, stream)
                e.record(stream)
            readings.append(s.elapsed_ms(e) * 1e3)
        return statistics.median(readings[5:])

    floors = {
        "pair_nothing_us": gated(0, 0),
        "pair_empty_kernel_us": gated(1, 0),
        "pair_one_10us_us": gated(1, 10_000),
        "pair_two_10us_us": gated(2, 10_000),
    }
    floors["marginal_10us_kernel_us"] = floors["pair_two_10us_us"] - floors["pair_one_10us_us"]
    print("\ndevice cost of events (GPU-bound loop of 20 us kernels):")
    for key, value in event_cost.items():
        print(f"  {key:28s} {value:9.3f}")
    print("gated event pair reads (us):")
    for key, value in floors.items():
        print(f"  {key:28s} {value:9.3f}")

    if a.json:
        props = torch.cuda.get_device_properties(0)
        meta = {
            "date": datetime.date.today().isoformat(),
            "gpu": props.name,
            "driver": gpukeeper.cuda_available().driver_version,
            "torch": torch.__version__,
            "triton": getattr(sys.modules.get("triton"), "__version__", None),
            "gpukeeper": gpukeeper.__version__,
            "python": platform.python_version(),
            "cpu": cpu_name(),
            "calls": calls,
        }
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "accuracy": rows, "overhead": overhead,
                       "event_cost": event_cost, "gated_floors": floors}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

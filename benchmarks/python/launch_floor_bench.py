#!/usr/bin/env python3
"""How steady the launch floor is: re-measured within one process, and what it leaves of a
calibration kernel's reading against the kernel's own %globaltimer duration.

The floor (``_core.launch_floor_ms``: the median of gated event brackets around an empty
kernel) is subtracted from every gated reading, so its drift is every single-kernel
reading's error. The program re-measures it ``--floors`` times, then, ``--rounds`` times,
re-measures it and times ``--calls`` gated calibration kernels of 10 us and 100 us
(``_core.calibrate``): raw reading - kernel duration is the bracket's true cost, and
raw reading - floor - kernel duration the error a benchmark would report.

    python launch_floor_bench.py [--floors 15] [--rounds 7] [--calls 15] [--json PATH]

Without CUDA (or without the calibration kernels) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import calibration_torch, write_report  # noqa: E402


def measure(core: Any, torch: Any, args: argparse.Namespace) -> Dict[str, Any]:
    stream = torch.cuda.current_stream().cuda_stream
    floors = [core.launch_floor_ms(0, True) * 1e3 for _ in range(args.floors)]
    kernels: Dict[str, List[Dict[str, float]]] = {}
    for duration_ns in (10_000, 100_000):
        rows = []
        for _ in range(args.rounds):
            floor = core.launch_floor_ms(0, True) * 1e3
            calls = [core.calibrate(duration_ns, stream, 0, hide_launch_latency=True) for _ in range(args.calls)]
            raw = statistics.median(c["event_ms"] * 1e3 for c in calls)
            kernel = statistics.median(c["kernel_ns"] / 1e3 for c in calls)
            rows.append({"floor_us": floor, "raw_minus_kernel_us": raw - kernel,
                         "error_us": raw - floor - kernel})
        kernels[f"{duration_ns // 1000} us"] = rows
    return {"floors_us": floors, "kernels": kernels}


def main(argv: Any = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--floors", type=int, default=15, help="floor re-measurements (default %(default)s)")
    p.add_argument("--rounds", type=int, default=7, help="floor + kernels rounds per duration (default %(default)s)")
    p.add_argument("--calls", type=int, default=15, help="kernels per round (default %(default)s)")
    p.add_argument("--json", metavar="PATH", help="write the readings and the environment as JSON")
    args = p.parse_args(argv)
    torch = calibration_torch()
    if torch is None:
        return 0
    from gpukeeper import _core

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    out = measure(_core, torch, args)
    f = out["floors_us"]
    print(f"floor re-measured {len(f)} times: {min(f):.3f} .. {max(f):.3f} us (median {statistics.median(f):.3f})")
    for name, rows in out["kernels"].items():
        errors = [r["error_us"] for r in rows]
        costs = [r["raw_minus_kernel_us"] for r in rows]
        print(f"{name} kernel: bracket cost {min(costs):.3f} .. {max(costs):.3f} us; "
              f"error after the floor {min(errors):+.3f} .. {max(errors):+.3f} us "
              f"(median {statistics.median(errors):+.3f}) over {len(rows)} rounds")
    write_report(args.json, torch, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""GPUContext enter+exit cost: with nothing leaked, and with a leaked reference cycle.

Rows (each timed per iteration with perf_counter around the whole `with`):
  empty               with GPUContext(): pass                    (all devices in use)
  empty, device 0     with GPUContext(0): pass                   (CUDA only)
  alloc+free inside   with GPUContext(): t = alloc(1 MiB); del t (cache released on exit)
  young cycle         with GPUContext(): <1 MiB kept only by a fresh reference cycle>
  old cycle           the same cycle, promoted to the oldest generation inside the block
                      (two young collections) before it becomes garbage: only a full
                      collection finds it
  gc.collect()        a bare full collection, for reference

With CUDA (PyTorch sees a GPU) the memory is a CUDA tensor and CUDA is initialised before
timing; without, it is a buffer of a gpukeeper host pool (the only memory GPUContext
watches then) and the output says "cpu mode". The collector is disabled while timing (as
timeit does), so that cycles are found by GPUContext and not by an automatic collection.
Target: median enter+exit with nothing leaked <= 1 ms.

  python cleanup_bench.py [--json PATH] [--quick] [--iterations N]
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import cpu_name  # noqa: E402
from bench_timeit import quantile  # noqa: E402

TARGET_S = 1e-3


def timed(body: Callable[[], Optional[Any]], iterations: int, warmup: int) -> Dict[str, Any]:
    """Runs body() iterations times (after warmup), timing each; body may return a report."""
    for _ in range(warmup):
        body()
    times: List[float] = []
    gc_runs: List[int] = []
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(iterations):
            t0 = time.perf_counter()
            report = body()
            times.append(time.perf_counter() - t0)
            if report is not None:
                gc_runs.append(report.gc_runs)
    finally:
        if was:
            gc.enable()
    us = [t * 1e6 for t in times]
    row: Dict[str, Any] = {
        "us_median": statistics.median(us),
        "us_p10": quantile(us, 0.1),
        "us_p90": quantile(us, 0.9),
        "us_min": min(us),
        "us_max": max(us),
        "us_mean": statistics.fmean(us),
        "iterations": iterations,
    }
    if gc_runs:
        row["gc_runs_median"] = statistics.median(gc_runs)
    return row


def environment(torch: Any, cuda: bool) -> Dict[str, Any]:
    import gpukeeper

    env: Dict[str, Any] = {
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "gpukeeper": gpukeeper.__version__,
        "mode": "cuda" if cuda else "cpu",
        "gc_objects": len(gc.get_objects()),
    }
    env["cpu"] = cpu_name()
    try:
        env["build_info"] = json.loads(json.dumps(gpukeeper.build_info(), default=str))
    except Exception as e:  # report, never fail the run over it
        env["build_info"] = f"error: {e}"
    if torch is not None:
        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        if cuda:
            env["gpu_name"] = torch.cuda.get_device_name(0)
            env["gpu_total_memory"] = torch.cuda.get_device_properties(0).total_memory
            env["cuda_driver"] = getattr(torch._C, "_cuda_getDriverVersion", lambda: None)()
    if "cupy" in sys.modules:
        env["cupy"] = sys.modules["cupy"].__version__
    return env


class _Node:
    pass


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--quick", action="store_true", help="few iterations (smoke test)")
    p.add_argument("--iterations", type=int, default=None, help="iterations of the fast rows")
    args = p.parse_args(argv)

    fast_n = args.iterations or (300 if args.quick else 3000)
    slow_n = max(5, fast_n // 60)
    warmup = 20 if args.quick else 100

    try:
        import torch
    except Exception:  # the benchmark runs without PyTorch too
        torch = None
    from gpukeeper import MemoryPool, Precision
    from gpukeeper.cleanup import GPUContext

    cuda = bool(torch is not None and torch.cuda.is_available())
    MiB = 1 << 20
    host_pool = None
    if cuda:
        torch.ones(1, device="cuda")  # CUDA initialised before timing
        torch.cuda.synchronize()

        def alloc() -> Any:
            return torch.empty(MiB, dtype=torch.uint8, device="cuda")
    else:
        host_pool = MemoryPool("host")

        def alloc() -> Any:
            return host_pool.get_managed_buffer(0, MiB // 4, Precision.Fp32)

    rows: List[Dict[str, Any]] = []

    def add(name: str, body: Callable[[], Optional[Any]], n: int, what: str) -> None:
        row = {"name": name, "what": what, **timed(body, n, min(warmup, n))}
        rows.append(row)
        print(f"  measured {name}: median {row['us_median']:.1f} us", file=sys.stderr)

    ctx = GPUContext()

    def empty() -> Any:
        with ctx:
            pass
        return ctx.report

    add("empty", empty, fast_n, "with GPUContext(): pass")

    if cuda:
        ctx0 = GPUContext(0)

        def empty0() -> Any:
            with ctx0:
                pass
            return ctx0.report

        add("empty, device 0", empty0, fast_n, "with GPUContext(0): pass")

    def alloc_free() -> Any:
        with ctx:
            t = alloc()
            del t
        return ctx.report

    add("alloc+free inside", alloc_free, fast_n, "1 MiB allocated and freed inside; released on exit")

    def young_cycle() -> Any:
        with ctx:
            a, b = _Node(), _Node()
            a.other, b.other, a.payload = b, a, alloc()
            del a, b
        return ctx.report

    add("young cycle", young_cycle, slow_n, "1 MiB kept by a reference cycle made inside")

    def old_cycle() -> Any:
        with ctx:
            holder = []
            a, b = _Node(), _Node()
            a.other, b.other, a.payload = b, a, alloc()
            holder.append(a)
            del a, b
            gc.collect(1)
            gc.collect(1)  # survivors now in the oldest generation (two young collections: ~us)
            holder.clear()  # garbage that only a full collection finds
        return ctx.report

    add("old cycle", old_cycle, slow_n, "1 MiB kept by a cycle in the oldest generation")
    add("gc.collect()", lambda: (gc.collect(), None)[1], slow_n, "a bare full collection, for reference")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Sanity: nothing leaked across the whole run.
        with GPUContext(tolerance_bytes=0) as final:
            pass
    leaked_after = final.report.held_bytes

    empty_row = rows[0]
    targets = {
        "empty_enter_exit_median_us": empty_row["us_median"],
        "target_us": TARGET_S * 1e6,
        "met": empty_row["us_median"] <= TARGET_S * 1e6,
    }
    print()
    print(f"GPUContext enter+exit ({'cuda' if cuda else 'cpu mode: gpukeeper host pool, no GPU'})")
    header = f"{'row':<20} {'median us':>10} {'p10':>9} {'p90':>9} {'gc runs':>8} {'iters':>6}  what"
    print(header)
    print("-" * len(header))
    for r in rows:
        gcr = r.get("gc_runs_median")
        print(
            f"{r['name']:<20} {r['us_median']:>10.1f} {r['us_p10']:>9.1f} {r['us_p90']:>9.1f} "
            f"{'' if gcr is None else f'{gcr:g}':>8} {r['iterations']:>6}  {r['what']}"
        )
    print()
    verdict = "met" if targets["met"] else "NOT met"
    print(f"target: empty enter+exit median <= {TARGET_S * 1e6:.0f} us: {verdict} ({empty_row['us_median']:.1f} us)")
    if leaked_after:
        print(f"warning: {leaked_after} bytes still held after the run")

    if args.json:
        out = {
            "benchmark": "cleanup_bench",
            "environment": environment(torch, cuda),
            "rows": rows,
            "targets": targets,
            "held_after_run_bytes": leaked_after,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Cost of one account of the device: gpukeeper.account.account_reader.memory_report() and friends.

Rows (each timed call by call, after warm-up; median, p10, p90 and min in microseconds):
  memory_report()                  NVML on: frameworks + NVML memory + process list
  memory_report(use_nvml=False)    frameworks + cudaMemGetInfo, no process split
  memory_by_framework(device)      the frameworks' part alone (what cleanup reads)
  torch allocated+reserved         torch.cuda.memory_allocated + memory_reserved: the
                                   floor for reading PyTorch's figures (GPU only)
  manager.get_memory_info()        the manager's (used, available, total)
  report.to_json() / str(report)   formatting an existing report

State while timing: torch imported, and on a GPU one live 64 MiB tensor plus a cached
block, so PyTorch's figures are real; a gpukeeper pool holding one buffer; CuPy with
one array when it is installed and sees a GPU. Without CUDA the reports are CPU-mode
reports (host memory), which is said in the output; NVML rows then show what a
missing NVML costs.

  python report_bench.py [--calls N] [--json PATH] [--device D]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_timeit import quantile  # noqa: E402


def measure(fn, calls: int, warmup: int = 20):
    """Per-call wall time in microseconds; the collector is off while timing."""
    for _ in range(warmup):
        fn()
    times = []
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            fn()
            times.append((time.perf_counter_ns() - t0) / 1e3)
    finally:
        if was_enabled:
            gc.enable()
    return {
        "us_median": statistics.median(times),
        "us_p10": quantile(times, 0.1),
        "us_p90": quantile(times, 0.9),
        "us_min": min(times),
        "calls": calls,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=500, help="timed calls per row (default 500)")
    p.add_argument("--device", type=int, default=0, help="CUDA device (default 0)")
    p.add_argument("--json", help="write the results as JSON to this path")
    args = p.parse_args(argv)

    import gpukeeper
    from gpukeeper import frameworks
    from gpukeeper.account.memory_manager import get_gpu_memory_manager
    from gpukeeper.account.account_reader import memory_report, nvml_status

    try:
        import torch
    except Exception as e:  # the benchmark is about torch being loaded; say if it is not
        torch, torch_err = None, f"{type(e).__name__}: {e}"
    else:
        torch_err = None

    cuda = gpukeeper.cuda_available()
    device = args.device if cuda else "cpu"  # one device's report either way
    keep = []  # live objects, so every framework has something to report
    notes = []
    torch_cuda = bool(torch is not None and cuda and torch.cuda.is_available())
    if torch_cuda:
        dev = f"cuda:{args.device}"
        torch.cuda.set_device(args.device)
        # Freed at once into PyTorch's cache: reserved > allocated.
        torch.empty(32 << 20, dtype=torch.uint8, device=dev)
        keep.append(torch.empty(64 << 20, dtype=torch.uint8, device=dev))
        torch.cuda.synchronize()
    elif torch is None:
        notes.append(f"torch not loaded: {torch_err}")
    else:
        notes.append("torch loaded without CUDA: its figures are not read")
    pool = gpukeeper.MemoryPool()
    keep.append(pool.get_managed_buffer(args.device if cuda else 0, 1 << 20, "fp32"))
    if cuda:
        try:
            import cupy

            with cupy.cuda.Device(args.device):
                keep.append(cupy.zeros(8 << 20, dtype=cupy.uint8))
        except Exception as e:
            notes.append(f"cupy not used: {type(e).__name__}: {e}")
    else:
        notes.append(f"CPU mode ({cuda.reason}): reports describe host memory")

    first = memory_report(device)
    rows = {}
    rows["memory_report()"] = measure(lambda: memory_report(device), args.calls)
    rows["memory_report(use_nvml=False)"] = measure(lambda: memory_report(device, use_nvml=False), args.calls)
    if cuda:
        rows["memory_by_framework(device)"] = measure(
            lambda: frameworks.memory_by_framework(args.device), args.calls
        )
    if torch_cuda:
        d = args.device
        rows["torch allocated+reserved"] = measure(
            lambda: (torch.cuda.memory_allocated(d), torch.cuda.memory_reserved(d)), args.calls
        )
    manager = get_gpu_memory_manager(device)
    rows["manager.get_memory_info()"] = measure(manager.get_memory_info, args.calls)
    rows["report.to_json()"] = measure(first.to_json, args.calls)
    rows["str(report)"] = measure(first.table, args.calls)

    env = {
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "gpukeeper": gpukeeper.__version__,
        "build_info": gpukeeper.build_info(),
        "cuda_available": bool(cuda),
        "cuda_reason": cuda.reason,
        "nvml": nvml_status(),
        "device": first.name if cuda else "host (CPU mode)",
        "frameworks_in_report": sorted(first.frameworks),
        "torch": getattr(torch, "__version__", None),
    }
    width = max(len(k) for k in rows) + 2
    print(f"memory_report cost on {env['device']} (NVML: {env['nvml']})")
    print(f"{'row':<{width}}{'median us':>11}{'p10':>9}{'p90':>9}{'min':>9}")
    for name, r in rows.items():
        print(f"{name:<{width}}{r['us_median']:>11.1f}{r['us_p10']:>9.1f}{r['us_p90']:>9.1f}{r['us_min']:>9.1f}")
    for n in notes:
        print(f"note: {n}")
    print()
    print(first.table())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "rows": rows, "notes": notes, "report": first.to_dict()}, f, indent=2)
        print(f"\nwrote {args.json}")
    for obj in keep:
        if hasattr(obj, "release"):
            obj.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())

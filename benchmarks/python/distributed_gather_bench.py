#!/usr/bin/env python3
"""What gathering memory reports across ranks costs (issue 14).

For each world size, N processes join a process group (gloo on the CPU, or NCCL with one
GPU per rank) and time, on rank 0, after a barrier:

  full, to rank 0        gather_memory_reports()                 every rank's DevicesReport
  summary, to rank 0     gather_memory_reports(summary=True)     a RankMemory per rank
  full, to all           gather_memory_reports(dst=None)
  report only            gpukeeper.memory_report() on each rank  (the local part)
  torch gather_object    dist.gather_object of a same-sized dict (the transport alone)

and the payload per rank (pickled bytes). Medians over the repetitions; the gather's
cost is then split into the local report and the transport, and the growth with N is
what docs/performance.md extrapolates to 1 000 ranks.

  python distributed_gather_bench.py [--ranks 2 4 8] [--reps 50] [--backend gloo|nccl] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

from bench_env import cpu_name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _time(fn, reps: int, barrier) -> float:
    """Median microseconds of ``fn`` on this rank, each call after a barrier."""
    samples = []
    for _ in range(reps):
        barrier()
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(samples)


def _rank_main(rank: int, world: int, port: int, backend: str, reps: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist

    import gpukeeper
    from gpukeeper import distributed as gkd

    if backend == "nccl":
        torch.cuda.set_device(rank)
        keep = torch.ones(1 << 20, device="cuda")  # a context and a tensor, as in training
    else:
        keep = torch.ones(1 << 20)
    dist.init_process_group(backend, rank=rank, world_size=world)
    barrier = dist.barrier
    full = gpukeeper.memory_report().to_dict()
    summary = gkd.RankMemory.from_report(gpukeeper.memory_report(), rank=rank).to_dict()
    rows: Dict[str, float] = {}
    for _ in range(3):  # warm-up: first collectives set up connections
        gkd.gather_memory_reports()
    rows["full, to rank 0"] = _time(lambda: gkd.gather_memory_reports(), reps, barrier)
    rows["summary, to rank 0"] = _time(lambda: gkd.gather_memory_reports(summary=True), reps, barrier)
    rows["full, to all"] = _time(lambda: gkd.gather_memory_reports(dst=None), reps, barrier)
    rows["report only"] = _time(lambda: gpukeeper.memory_report(), reps, barrier)
    out_list = [None] * world if rank == 0 else None
    rows["torch gather_object"] = _time(lambda: dist.gather_object(full, out_list, dst=0), reps, barrier)
    if rank == 0:
        Path(out).write_text(json.dumps({
            "ranks": world, "backend": backend, "reps": reps, "median_us": rows,
            "payload_bytes": {"full": len(pickle.dumps(full)), "summary": len(pickle.dumps(summary))},
        }))
    del keep
    dist.destroy_process_group()


def _environment(backend: str) -> Dict[str, Any]:
    import torch

    import gpukeeper

    env = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "torch": torch.__version__,
           "gpukeeper": gpukeeper.__version__, "cpu": cpu_name(), "cores": os.cpu_count(), "backend": backend}
    if backend == "nccl":
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch.multiprocessing as mp
    from rich.console import Console
    from rich.table import Table

    results: List[Dict[str, Any]] = []
    for world in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rank0.json")
            mp.start_processes(_rank_main, args=(world, _free_port(), args.backend, args.reps, out),
                               nprocs=world, join=True, start_method="spawn")
            results.append(json.loads(Path(out).read_text()))
    names = list(results[0]["median_us"])
    table = Table(title=f"gather_memory_reports, {args.backend}: median us on rank 0 ({args.reps} reps)")
    table.add_column("what")
    for r in results:
        table.add_column(f"{r['ranks']} ranks", justify="right")
    for name in names:
        table.add_row(name, *(f"{r['median_us'][name]:,.0f}" for r in results))
    table.add_row("payload per rank, full (B)", *(f"{r['payload_bytes']['full']:,}" for r in results))
    table.add_row("payload per rank, summary (B)", *(f"{r['payload_bytes']['summary']:,}" for r in results))
    Console().print(table)
    if args.json is not None:
        args.json.write_text(json.dumps({"environment": _environment(args.backend), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

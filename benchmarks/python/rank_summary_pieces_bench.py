#!/usr/bin/env python3
"""Where a rank summary's time goes, piece by piece, every rank calling at once (NCCL).

    torchrun --standalone --nproc-per-node=N benchmarks/python/rank_summary_pieces_bench.py [--json PATH]

One rank per GPU. Each piece of ``gather_memory_reports(summary=True, dst=None)`` is
timed alone: the ranks meet (an ``all_reduce`` waited for on the host), then each rank
takes the wall clock around the piece and a ``torch.cuda.synchronize()``. The table
gives, per piece, the median on rank 0 and the median over the calls of the slowest
rank's time (what a gather waits for); the first row, nothing but the synchronize, is
the floor under every other. ``--profile`` adds cProfile's table of rank 0
over the whole summary. Without NCCL or a GPU per rank it measures nothing and exits 0.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from typing import Any, Callable, Dict, List

from bench_env import nccl_rank, write_report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=200, help="timed calls per piece (default %(default)s)")
    p.add_argument("--warmup", type=int, default=20, help="calls before timing (default %(default)s)")
    p.add_argument("--profile", action="store_true", help="cProfile rank 0 over the whole summary")
    p.add_argument("--json", metavar="PATH", help="write the pieces and the environment as JSON")
    args = p.parse_args()
    import torch
    import torch.distributed as dist

    me = nccl_rank(torch, dist)
    if me is None:
        return 0
    world, local, meet = me.world, me.local, me.meet
    pieces = _pieces(torch, local)

    rows: Dict[str, Dict[str, float]] = {}
    for name, fn in pieces.items():
        for _ in range(args.warmup):
            meet()
            fn()
        mine: List[float] = []
        for _ in range(args.reps):
            meet()
            t0 = time.perf_counter_ns()
            fn()
            torch.cuda.synchronize()
            mine.append((time.perf_counter_ns() - t0) / 1e3)
        everyone: List[Any] = [None] * world
        dist.all_gather_object(everyone, mine)
        slowest = [max(per[i] for per in everyone) for i in range(args.reps)]
        rows[name] = {"rank0_median_us": statistics.median(everyone[0]),
                      "slowest_median_us": statistics.median(slowest)}
    profile = _profile(pieces["summary to all"], meet, args.reps) if args.profile else None
    if dist.get_rank() == 0:
        print(f"{world} ranks: piece, median on rank 0, median of the slowest rank (us)")
        for name, row in rows.items():
            print(f"  {name:44s} {row['rank0_median_us']:9.1f} {row['slowest_median_us']:9.1f}")
        if profile:
            print(profile)
        write_report(args.json, torch, {"ranks": world, "reps": args.reps, "pieces": rows})
    dist.destroy_process_group()
    return 0


def _pieces(torch: Any, local: int) -> Dict[str, Callable[[], Any]]:
    """The summary and its parts, in the order the summary runs them."""
    from gpukeeper.account import account_reader
    from gpukeeper.base.nvml import NVML, device_handle
    from gpukeeper.distributed import gather_memory_reports
    from gpukeeper.distributed.process_figure import ProcessFigures
    from gpukeeper.distributed.rank_memory import RankMemory
    from gpukeeper.frameworks import context_census, ranks

    figures = ProcessFigures(fresh=False)
    totals = account_reader.rank_totals_report(True, "rank", figures)
    row = RankMemory.from_report(totals, process_age_ms=1.0).to_vector()
    rows = ranks.all_gather_int64(row, None, None)
    out: Dict[str, Callable[[], Any]] = {
        # Every piece is timed with a synchronize after it: this row is that floor.
        "nothing (the floor: a synchronize)": lambda: None,
        "summary to all": lambda: gather_memory_reports(summary=True, dst=None),
        "summary to all, no NVML": lambda: gather_memory_reports(summary=True, dst=None, use_nvml=False),
        "the reading (background NVML figure)": lambda: account_reader.rank_totals_report(
            True, "rank", ProcessFigures(fresh=False)),
        "the reading, no NVML": lambda: account_reader.rank_totals_report(False, "rank", None),
        "frameworks' counters and peaks": lambda: account_reader._memory_and_peaks(local),
        "PyTorch's raw statistics": lambda: torch._C._cuda_memoryStats(local),
        "the kept NVML figure": lambda: ProcessFigures(fresh=False)(local),
        "the context census": lambda: context_census(local, reading=figures(local), primary_in_use=True),
        "the other devices": lambda: account_reader._other_devices(local, torch.cuda.device_count(), True),
        "the row from the report, as int64s": lambda: RankMemory.from_report(
            totals, process_age_ms=1.0).to_vector(),
        "the transport (all_gather_int64)": lambda: ranks.all_gather_int64(row, None, None),
        "decoding the rows": lambda: [RankMemory.from_vector(r) for r in rows],
        "checking the group and dst": lambda: (ranks.check_group(None, "bench"), ranks.check_dst(None, None, "bench")),
    }
    nvml, _why = NVML.get()
    if nvml is not None:
        handle = device_handle(nvml, local)[0]
        out["NVML's free and total (not read by a summary)"] = lambda: nvml.nvmlDeviceGetMemoryInfo(handle)
    return out


def _profile(summary: Callable[[], Any], meet: Callable[[], None], reps: int) -> str:
    profiler = cProfile.Profile()
    for _ in range(reps):
        meet()
        profiler.enable()
        summary()
        profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


if __name__ == "__main__":
    raise SystemExit(main())

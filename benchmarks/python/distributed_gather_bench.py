#!/usr/bin/env python3
"""What gathering memory reports and timings across ranks costs, under torchrun.

    torchrun --standalone --nproc-per-node=N benchmarks/python/distributed_gather_bench.py --out DIR

Every rank joins one process group (NCCL with one GPU per rank where there are N GPUs,
else gloo on the CPU; ``--backend`` chooses) and times each row below many times. Before
each call the ranks meet (an ``all_reduce`` of one integer, waited for on the host), then
every rank takes the wall clock around the call (and, for NCCL, until its device is
done). A call's time is the slowest rank's: what a job waits for. The table gives the
median of those over ``--reps`` calls, and rank 0's own median beside it.

  full, to rank 0        gather_memory_reports()                       pickled reports
  full, to all           gather_memory_reports(dst=None)
  summary, to rank 0     gather_memory_reports(summary=True)           one int64 row a rank
  summary, to all        gather_memory_reports(summary=True, dst=None): the process
                         figure is the background reading (NVML read off the call)
  summary, to all, fresh the same with fresh=True: NVML's list read during the call
  summary, to all, as before  what a summary did before the background reading and the
                         kept tensors: NVML's list read in the call, tensors made per call
  summary transport      the summary's all_gather alone (a row made beforehand), its
                         tensors kept between calls
  summary transport, new tensors  the same, tensors made on every call (as before)
  bare all_gather        dist.all_gather_single of the same bytes, tensors made beforehand
  transport step: ...    the summary transport's steps one at a time on tensors made
                         beforehand (NCCL only): the row to the device from pinned memory
                         without a wait, or from pageable memory; the collective; the
                         rows back to pinned memory and the wait on the stream, or to
                         pageable memory (tolist)
  report, scope=rank     memory_report(scope="rank"): the local part of a gather
  report, scope=visible  memory_report(): every visible device
  summary's reading      the rank's own reading that a summary gather sends: with the
                         background NVML reading, with a fresh read (the lean reader, one
                         driver call), with NVML's list as before, and without NVML
  NVML lean reader       process_memory_reader(device)(): the fresh read alone (NCCL only)
  NVML ...               NVML's calls under it on the rank's device (NCCL only): the
                         compute and graphics process lists and the memory info
  aggregate              aggregate(result): a RankTiming row per rank, to every rank
  ..., one rank at a time  the reading and NVML's lists with the ranks taking turns (the
                         others wait at the barrier): against the rows where every rank
                         calls at once, what concurrent calls cost each other

and the ratios of the summary rows to the bare all_gather. Rank 0 prints the table and
writes DIR/distributed_gather_{backend}_{N}ranks.json (environment block from bench_env).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
from bench_env import environment

import gpukeeper
from gpukeeper import distributed as gkd
from gpukeeper.account.account_reader import rank_totals_report
from gpukeeper.base.nvml import NVML, device_handle, process_memory_reader, running_processes
from gpukeeper.distributed import process_figure
from gpukeeper.distributed.rank_memory import VECTOR_LENGTH, RankMemory
from gpukeeper.distributed.rank_timings import TIMING_VECTOR_LENGTH
from gpukeeper.frameworks import ranks


def _backend(choice: str, world: int) -> str:
    if choice != "auto":
        return choice
    usable = torch.cuda.is_available() and torch.cuda.device_count() >= world
    return "nccl" if usable and dist.is_nccl_available() else "gloo"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON")
    parser.add_argument("--reps", type=int, default=200, help="calls timed per row")
    parser.add_argument("--warmup", type=int, default=10, help="calls before timing, per row")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    args = parser.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    backend = _backend(args.backend, world)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = torch.device("cuda", torch.cuda.current_device())
        keep = torch.ones(1 << 20, device=device)  # a context and a tensor, as in training
    else:
        device = torch.device("cpu")
        keep = torch.ones(1 << 20)
    dist.init_process_group(backend)
    rank = dist.get_rank()
    flag = torch.zeros(1, dtype=torch.int64, device=device)

    def meet() -> None:
        dist.all_reduce(flag)
        flag.item()  # on the host: every rank is past the barrier

    def done() -> None:
        if backend == "nccl":
            torch.cuda.synchronize()

    vector = RankMemory.from_report(gpukeeper.memory_report(scope="rank")).to_vector()
    bare_in = torch.tensor(vector, dtype=torch.int64, device=device)
    bare_out = torch.empty(world * VECTOR_LENGTH, dtype=torch.int64, device=device)
    flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    result = gpukeeper.BenchmarkResult(name="step", times_ms=[1.0 + 0.01 * rank, 1.1, 1.2])

    def new_tensors(values: List[int]) -> Any:
        # The transport as it was: a row and an output made on every call.
        row = torch.tensor(values, dtype=torch.int64).to(device)
        out = torch.empty(world * row.numel(), dtype=torch.int64, device=device)
        flat(out, row)
        return out.view(world, -1).tolist()

    def as_before() -> Any:
        totals = rank_totals_report(True, "rank")  # NVML's list read in the call
        rows = new_tensors(RankMemory.from_report(totals).to_vector())
        return [RankMemory.from_vector(r) for r in rows]

    def reading(fresh: bool) -> Any:
        return rank_totals_report(True, "rank", process_figure.ProcessFigures(fresh=fresh))

    rows: Dict[str, Callable[[], Any]] = {
        "full, to rank 0": lambda: gkd.gather_memory_reports(),
        "full, to all": lambda: gkd.gather_memory_reports(dst=None),
        "summary, to rank 0": lambda: gkd.gather_memory_reports(summary=True),
        "summary, to all": lambda: gkd.gather_memory_reports(summary=True, dst=None),
        "summary, to all, fresh": lambda: gkd.gather_memory_reports(
            summary=True, dst=None, fresh=True
        ),
        "summary, to all, as before": as_before,
        "summary, to all, no NVML": lambda: gkd.gather_memory_reports(
            summary=True, dst=None, use_nvml=False
        ),
        "summary transport": lambda: ranks.all_gather_int64(vector, None, None),
        "summary transport, new tensors": lambda: new_tensors(vector),
        "bare all_gather": lambda: flat(bare_out, bare_in),
        "report, scope=rank": lambda: gpukeeper.memory_report(scope="rank"),
        "summary's reading": lambda: reading(False),
        "summary's reading, fresh": lambda: reading(True),
        "summary's reading, NVML list as before": lambda: rank_totals_report(True, "rank"),
        "summary's reading, no NVML": lambda: rank_totals_report(False, "rank"),
        "report, scope=visible": lambda: gpukeeper.memory_report(),
        "aggregate": lambda: gkd.aggregate(result),
    }
    # The rank's own reading and NVML's calls under it, every rank at once (as in a
    # gather) and one rank at a time (the others wait at the barrier): the difference is
    # what the ranks' concurrent calls cost each other.
    alone = {
        name: rows[name]
        for name in (
            "summary's reading",
            "summary's reading, fresh",
            "summary's reading, NVML list as before",
            "summary's reading, no NVML",
        )
    }
    if backend == "nccl":
        nvml_lib, _why = NVML.get()
        handle = None if nvml_lib is None else device_handle(nvml_lib, device.index)[0]
        if handle is not None:
            for label, getter in (
                ("NVML compute list", "nvmlDeviceGetComputeRunningProcesses"),
                ("NVML graphics list", "nvmlDeviceGetGraphicsRunningProcesses"),
            ):
                call = functools.partial(running_processes, nvml_lib, handle, getter)
                rows[label] = call
                alone[label] = call
            rows["NVML memory info"] = functools.partial(nvml_lib.nvmlDeviceGetMemoryInfo, handle)
            lean, _why = process_memory_reader(device.index)
            if lean is not None:
                rows["NVML lean reader"] = lean
                alone["NVML lean reader"] = lean
    if backend == "nccl":
        rows.update(_transport_steps(vector, world, device, flat))
    for name, fn in alone.items():
        rows[f"{name}, one rank at a time"] = fn
    mine: Dict[str, List[float]] = {}
    for name, fn in rows.items():
        turns = name.endswith(", one rank at a time")
        for _ in range(args.warmup):  # first collectives set up connections
            meet()
            fn()
            done()
        samples = []
        for _ in range(args.reps):
            for turn in range(world if turns else 1):
                meet()
                if turns and turn != rank:
                    continue
                t0 = time.perf_counter_ns()
                fn()
                done()
                samples.append((time.perf_counter_ns() - t0) / 1e3)
        mine[name] = samples
    # How old the process figures were that the summaries sent (the background reading),
    # and what the refresher did meanwhile.
    ages = []
    for _ in range(args.reps):
        meet()
        got = gkd.gather_memory_reports(summary=True, dst=None)
        ages.append(max((r.process_age_ms or 0.0) for r in got))
    refresher = process_figure.refresher_status()
    mine["process figure age (ms)"] = ages
    everyone: List[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        per_call = [max(per["process figure age (ms)"][i] for per in everyone)
                    for i in range(args.reps)]
        for per in everyone:
            del per["process figure age (ms)"]
        out = _summarise(everyone, args, backend, world)
        out["process_figure_age_ms"] = {
            "median": statistics.median(per_call),
            "max": max(per_call),
        }
        out["refresher"] = {
            k: refresher[k]
            for k in ("running", "background_reads", "synchronous_reads", "interval_s")
        }
        out["payload_bytes"] = {
            "full (pickled report)": len(pickle.dumps(gpukeeper.memory_report().to_dict())),
            "summary (int64 row)": 8 * VECTOR_LENGTH,
            "timing (int64 row)": 8 * TIMING_VECTOR_LENGTH,
        }
        out["environment"] = environment(gpukeeper, torch, None)
        out["environment"].update(backend=backend, ranks=world, cores=os.cpu_count())
        if backend == "nccl":
            out["environment"]["gpus"] = [
                torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
            ]
        out["command"] = "torchrun --standalone --nproc-per-node=%d %s" % (
            world,
            " ".join(sys.argv),
        )
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"distributed_gather_{backend}_{world}ranks.json"
        path.write_text(json.dumps(out, indent=2))
        _print(out, path)
    del keep
    dist.destroy_process_group()
    return 0


def _transport_steps(
    vector: List[int], world: int, device: Any, flat: Callable[..., Any]
) -> Dict[str, Callable[[], Any]]:
    """The summary transport's steps, each alone, on tensors made here (NCCL): which of
    them makes the transport cost more than the bare collective."""
    row = torch.tensor(vector, dtype=torch.int64, device=device)
    out = torch.empty(world * row.numel(), dtype=torch.int64, device=device)
    host_in = torch.tensor(vector, dtype=torch.int64).pin_memory()
    host_out = torch.empty(world * row.numel(), dtype=torch.int64).pin_memory()
    stream = torch.cuda.current_stream(device)

    def pinned_in() -> None:
        host_in.copy_(torch.tensor(vector, dtype=torch.int64))
        row.copy_(host_in, non_blocking=True)

    def pinned_back() -> Any:
        host_out.copy_(out, non_blocking=True)
        stream.synchronize()
        return host_out.view(world, -1).tolist()

    return {
        "transport step: row in, pinned, no wait": pinned_in,
        "transport step: row in, pageable": lambda: row.copy_(
            torch.tensor(vector, dtype=torch.int64)
        ),
        "transport step: the collective": lambda: flat(out, row),
        "transport step: rows back, pinned, wait": pinned_back,
        "transport step: rows back, pageable": lambda: out.view(world, -1).tolist(),
    }


def _summarise(everyone: List[Dict[str, List[float]]], args: Any, backend: str, world: int):
    table: Dict[str, Dict[str, float]] = {}
    for name in everyone[0]:
        slowest = [max(per[name][i] for per in everyone) for i in range(args.reps)]
        table[name] = {
            "median_us": statistics.median(slowest),
            "p90_us": sorted(slowest)[int(0.9 * (len(slowest) - 1))],
            "rank0_median_us": statistics.median(everyone[0][name]),
        }
    bare = table["bare all_gather"]["median_us"]
    ratios = {
        f"{name} / bare all_gather": table[name]["median_us"] / bare
        for name in (
            "summary, to all",
            "summary, to all, fresh",
            "summary, to all, as before",
            "summary, to rank 0",
            "summary transport",
        )
    }
    return {"backend": backend, "ranks": world, "reps": args.reps, "rows": table, "ratios": ratios}


def _print(out: Dict[str, Any], path: Path) -> None:
    title = (
        f"gather across ranks: {out['ranks']} ranks, {out['backend']}, "
        f"median of {out['reps']} calls (slowest rank per call), microseconds"
    )
    print(title)
    width = max(len(n) for n in out["rows"]) + 2
    print(f"{'what':<{width}}{'median':>10}{'p90':>10}{'rank 0':>10}")
    for name, row in out["rows"].items():
        print(
            f"{name:<{width}}{row['median_us']:>10.1f}{row['p90_us']:>10.1f}"
            f"{row['rank0_median_us']:>10.1f}"
        )
    for name, ratio in out["ratios"].items():
        print(f"{name}: {ratio:.2f}x")
    age = out["process_figure_age_ms"]
    print(
        f"process figure sent by the summaries (oldest rank per call): median "
        f"{age['median']:.2f} ms, max {age['max']:.2f} ms"
    )
    print(f"rank 0's refresher: {out['refresher']}")
    for name, size in out["payload_bytes"].items():
        print(f"payload per rank, {name}: {size} B")
    print(f"written: {path}")


if __name__ == "__main__":
    sys.exit(main())

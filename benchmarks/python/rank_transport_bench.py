#!/usr/bin/env python3
"""The rank summary's transport against its variants, call for call interleaved (NCCL).

    torchrun --standalone --nproc-per-node=N benchmarks/python/rank_transport_bench.py \\
        [--reps 300] [--previous OLD_RANKS_PY] [--json PATH]

One rank per GPU. Each variant moves the same row of a rank summary to every rank and
back to the host: gpukeeper's ``all_gather_int64``, tensors made on each call, kept
tensors with pageable or pinned copies, and the bare collective. The variants run in
turn within each repetition, in an order rotated and reversed from one repetition to
the next, the ranks meeting (an ``all_reduce`` waited for on the host) before each, so
that a drift of the host or the link over the run falls on every variant alike. Each
rank takes the wall clock around a call and a ``torch.cuda.synchronize()``; the table
gives the median on rank 0 and the median over the repetitions of the slowest rank's
time (what a gather waits for). Every variant's rows are checked against the others'.

``--previous`` loads another ``ranks.py`` of gpukeeper (e.g. ``git show
REV:python/gpukeeper/frameworks/ranks.py > old_ranks.py``) and times its
``all_gather_int64`` beside this one. Without NCCL or a GPU per rank it measures
nothing and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from typing import Any, Callable, Dict, List

from bench_env import nccl_rank, write_report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=300, help="repetitions (default %(default)s)")
    p.add_argument("--warmup", type=int, default=20, help="untimed repetitions first")
    p.add_argument("--previous", metavar="PATH", help="another ranks.py to time beside this one")
    p.add_argument("--json", metavar="PATH", help="write the table and the environment as JSON")
    args = p.parse_args()
    import torch
    import torch.distributed as dist

    me = nccl_rank(torch, dist)
    if me is None:
        return 0
    world, local, meet = me.world, me.local, me.meet

    variants = _variants(torch, dist, world, local, args.previous)
    names = list(variants)
    reference = variants["tensors made each call (.to)"]()
    for name, fn in variants.items():
        got = fn()
        if got is not None and got != reference:
            raise SystemExit(f"{name}: rows differ from the other variants'")
    for _ in range(args.warmup):
        for name in names:
            meet()
            variants[name]()
    mine: Dict[str, List[float]] = {name: [] for name in names}
    for i in range(args.reps):
        k = i % len(names)
        order = names[k:] + names[:k]
        for name in order if i % 2 == 0 else order[::-1]:
            meet()
            t0 = time.perf_counter_ns()
            variants[name]()
            torch.cuda.synchronize()
            mine[name].append((time.perf_counter_ns() - t0) / 1e3)
    everyone: List[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        rows = {}
        print(f"{world} ranks, {args.reps} repetitions interleaved: median on rank 0, "
              "median and p90 of the slowest rank (us)")
        for name in names:
            slowest = sorted(max(per[name][i] for per in everyone) for i in range(args.reps))
            rows[name] = {
                "rank0_median_us": statistics.median(everyone[0][name]),
                "slowest_median_us": statistics.median(slowest),
                "slowest_p90_us": slowest[int(0.9 * (len(slowest) - 1))],
            }
            r = rows[name]
            print(f"  {name:52s} {r['rank0_median_us']:8.1f} {r['slowest_median_us']:8.1f} "
                  f"{r['slowest_p90_us']:8.1f}")
        write_report(args.json, torch, {"ranks": world, "reps": args.reps, "variants": rows})
    dist.destroy_process_group()
    return 0


def _variants(
    torch: Any, dist: Any, world: int, local: int, previous: Any
) -> Dict[str, Callable[[], Any]]:
    """The transports, each a call that returns every rank's row as lists of ints (or
    None where it has no rows to give)."""
    import gpukeeper
    from gpukeeper.distributed.rank_memory import RankMemory
    from gpukeeper.frameworks import ranks

    device = torch.device("cuda", local)
    values = RankMemory.from_report(gpukeeper.memory_report(scope="rank")).to_vector()
    n = len(values)
    flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    stream = torch.cuda.current_stream(device)

    def kept_set() -> Dict[str, Any]:
        return {
            "row": torch.empty(n, dtype=torch.int64, device=device),
            "out": torch.empty(world * n, dtype=torch.int64, device=device),
            "host_in": torch.empty(n, dtype=torch.int64, pin_memory=True),
            "host_out": torch.empty(world * n, dtype=torch.int64, pin_memory=True),
            "sent": torch.cuda.Event(),
        }

    pageable, pinned, guarded = kept_set(), kept_set(), kept_set()

    def made(direct: bool) -> Any:
        if direct:
            row = torch.tensor(values, dtype=torch.int64, device=device)
        else:
            row = torch.tensor(values, dtype=torch.int64).to(device)
        out = torch.empty(world * n, dtype=torch.int64, device=device)
        flat(out, row)
        return out.view(world, -1).tolist()

    def kept_pageable() -> Any:
        pageable["row"].copy_(torch.tensor(values, dtype=torch.int64))
        flat(pageable["out"], pageable["row"])
        return pageable["out"].view(world, -1).tolist()

    def kept_pinned(kept: Dict[str, Any], event: bool) -> Any:
        if event:
            kept["sent"].synchronize()
        kept["host_in"].copy_(torch.tensor(values, dtype=torch.int64))
        kept["row"].copy_(kept["host_in"], non_blocking=True)
        if event:
            kept["sent"].record(stream)
        flat(kept["out"], kept["row"])
        kept["host_out"].copy_(kept["out"], non_blocking=True)
        stream.synchronize()
        return kept["host_out"].view(world, -1).tolist()

    bare_in = torch.tensor(values, dtype=torch.int64, device=device)
    bare_out = torch.empty(world * n, dtype=torch.int64, device=device)

    def bare(to_host: bool) -> None:
        flat(bare_out, bare_in)
        if to_host:
            bare_out.tolist()
        else:
            torch.cuda.synchronize()
    out: Dict[str, Callable[[], Any]] = {
        "gpukeeper all_gather_int64": lambda: ranks.all_gather_int64(values, None, None),
    }
    if previous:
        spec = importlib.util.spec_from_file_location("previous_ranks", previous)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out["previous all_gather_int64"] = lambda: module.all_gather_int64(values, None, None)
    out.update({
        "tensors made each call (.to)": lambda: made(False),
        "tensors made each call (device=)": lambda: made(True),
        "kept, pageable copies": kept_pageable,
        "kept, pinned twins": lambda: kept_pinned(pinned, False),
        "kept, pinned twins, event before reuse": lambda: kept_pinned(guarded, True),
        "bare collective + synchronize": lambda: bare(False),
        "bare collective + .tolist()": lambda: bare(True),
        "a synchronize alone": lambda: torch.cuda.synchronize(),
    })
    return out


if __name__ == "__main__":
    raise SystemExit(main())

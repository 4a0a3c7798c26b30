"""One rank of the gloo tests in test_distributed.py, run under torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node=N distributed_child.py SCENARIO OUT [BACKEND]

Each rank writes what it saw to OUT/rank{R}.json; the test reads them. Scenarios:
``api`` (every function of gpukeeper.distributed), ``outliers`` (each rank holds the
MiB that GPUKEEPER_TEST_HOLD_MIB lists for it, and times the ms GPUKEEPER_TEST_MS lists:
which rank do the tables name), ``sigterm`` (the exit guard when the launcher ends the
job while one rank waits in a collective), ``buffers`` (the summary's transport tensors
kept across calls, one pair per group). BACKEND: gloo (default, CPU tensors) or nccl
(one GPU per rank, CUDA tensors).
"""

import atexit
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import gpukeeper
from gpukeeper import distributed as gkd
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.frameworks import ranks


DEVICE = "cpu"


def api(out: Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    seen: dict = {"rank": rank, "world": world, "backend": str(dist.get_backend())}
    info = gkd.rank_info()
    seen["rank_info"] = [info.rank, info.world_size, info.source]

    # Memory: to rank 0, to everyone in summary form, within a sub-group to its last rank.
    keep = torch.ones(256 * 1024 * (rank + 1), device=DEVICE)  # unequal host tensors: the table differs by rank
    reports = gkd.gather_memory_reports()
    if rank == 0:
        seen["reports"] = [[r.rank, r.world_size, r.pid, type(r).__name__] for r in reports]
        seen["table"] = gkd.format_rank_table(reports)
    else:
        seen["reports"] = reports
    summaries = gkd.gather_memory_reports(dst=None, summary=True)
    seen["summaries"] = [[s.rank, s.pid, type(s).__name__] for s in summaries]
    seen["summary_devices"] = [[s.devices, s.other_devices, s.hostname] for s in summaries]
    seen["summary_ages"] = [s.process_age_ms for s in summaries]
    fresh = gkd.gather_memory_reports(dst=None, summary=True, fresh=True)
    seen["fresh_ages"] = [s.process_age_ms for s in fresh]
    seen["hostname"] = socket.gethostname()
    seen["summary_table"] = gkd.format_rank_table(summaries)
    pair = dist.new_group([0, 1])
    if rank in (0, 1):
        got = gkd.gather_memory_reports(group=pair, dst=1, summary=True)
        seen["pair"] = None if got is None else [s.rank for s in got]
    errors = {}
    for label, call in {
        "dst_outside": lambda: gkd.gather_memory_reports(dst=world),
        "dst_type": lambda: gkd.gather_memory_reports(dst="0"),
        "group_type": lambda: gkd.gather_memory_reports(group="world"),
        "aggregate_type": lambda: gkd.aggregate(42),
        "barrier_type": lambda: gpukeeper.benchmark_function(lambda: None, barrier="yes"),
    }.items():
        try:
            call()
            errors[label] = None
        except InvalidInputError as e:
            errors[label] = str(e)
    seen["errors"] = errors
    del keep

    # Timings: a function with a collective, ranks stopping at different points; the last
    # rank is slower. Every call is counted: a mismatch would hang the all_reduce.
    calls = {"n": 0}
    flag = torch.zeros(1, device=DEVICE)

    def step():
        calls["n"] += 1
        dist.all_reduce(flag)
        if rank == world - 1:
            if DEVICE == "cpu":
                time.sleep(0.02)  # far above what 4 processes on 2 cores add to an all_reduce
            else:  # CUDA timing counts the device's work, not a host sleep: the GPU waits
                torch.cuda._sleep(40_000_000)  # about 20 ms of clock cycles

    # device=DEVICE: gloo's tensors are host ones, timed on the host even where CUDA exists.
    result = gpukeeper.benchmark_function(step, n_calls=5 + 5 * rank, warmup=2, barrier=True,
                                          name="allreduce", device=DEVICE)
    seen["bench"] = {"n_calls": len(result.host_times_ms), "calls": calls["n"], "stop_reason": result.stop_reason,
                     "timing_method": result.timing_method, "median_ms": result.median_ms,
                     "loop_calls": result.loop_calls, "work": result.work}
    agg = gkd.aggregate(result)
    seen["aggregate"] = agg.to_dict()
    seen["aggregate_text"] = agg.table()

    sub = dist.new_group(list(range(world)))
    result2 = gpukeeper.benchmark_function(step, n_calls=4, warmup=1, barrier=sub, device=DEVICE)
    seen["bench_group"] = len(result2.host_times_ms)

    def md_step(_positions):
        if DEVICE == "cpu":
            time.sleep(0.003 * (1 + rank))
        else:
            torch.cuda._sleep(6_000_000 * (1 + rank))  # about 3 ms per step and rank

    traj = gpukeeper.benchmark_md_trajectory(md_step, [None] * 22, warmup_steps=2, timestep_fs=2.0,
                                             n_atoms=100, device=DEVICE)
    tagg = gkd.aggregate(traj)
    seen["trajectory"] = tagg.to_dict()

    # GPUContext knows the rank; OOM snapshots go to one file per rank.
    with gpukeeper.GPUContext() as ctx:
        pass
    seen["context"] = [ctx.report.rank, ctx.report.world_size, ctx.report.summary()]
    snap = gkd.write_oom_snapshot(out / "oom", MemoryError("test"))
    seen["oom_file"] = snap.name
    seen["oom"] = json.loads(snap.read_text())["rank"]
    dist.barrier()
    return seen


def outliers(out: Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    hold = [int(v) for v in os.environ["GPUKEEPER_TEST_HOLD_MIB"].split(",")][rank]
    ms = [float(v) for v in os.environ["GPUKEEPER_TEST_MS"].split(",")][rank]
    if DEVICE == "cpu":  # CPU mode counts gpukeeper's host pools as the frameworks' memory
        pool = gpukeeper.MemoryPool("host")
        held = pool.get_managed_buffer(0, max(hold, 1) << 20, gpukeeper.Precision.Uint8)
    else:
        held = torch.empty(hold << 20, dtype=torch.uint8, device=DEVICE)
    seen: dict = {"rank": rank, "world": world}
    full = gkd.gather_memory_reports()
    summaries = gkd.gather_memory_reports(summary=True, dst=None)
    seen["summary_table"] = gkd.format_rank_table(summaries)
    seen["summary_allocated"] = [s.allocated for s in summaries]
    if rank == 0:
        seen["table"] = gkd.format_rank_table(full)
    # A planted timing: the loop is not what is tested here, the rule over ranks is.
    result = gpukeeper.BenchmarkResult(name="planted", times_ms=[ms - 0.01, ms, ms + 0.01])
    agg = gkd.aggregate(result)
    seen["aggregate"] = {"outlier_rank": agg.outlier_rank, "outlier_how": agg.outlier_how,
                         "slowest_rank": agg.slowest_rank, "text": agg.table()}
    del held
    dist.barrier()
    return seen


def sigterm(out: Path) -> dict:
    rank = dist.get_rank()
    # Registered before the guard, so it runs after the guard's exit-time cleanup: the
    # file says the rank unwound through atexit (not a forced os._exit) and whether the
    # guard left the process group destroyed.
    atexit.register(lambda: (out / f"atexit{rank}").write_text(str(dist.is_initialized())))
    gpukeeper.install_exit_guard(exit_timeout=5.0)
    (out / f"pid{rank}").write_text(str(os.getpid()))
    if rank == 0:
        flag = torch.zeros(1, device=DEVICE)
        dist.all_reduce(flag)  # waits for rank 1, which never comes
        flag.cpu()  # NCCL's all_reduce returns at once; the wait is here
    else:
        time.sleep(120)
    return {}


def buffers(out: Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    kept = ranks.GATHER_BUFFERS
    kept.clear()
    made = kept.made
    seen: dict = {"rank": rank, "world": world}

    def pairs():
        return [[p.data_ptr() for p in pair] + [pair[1].numel()] for pair in kept.tensors()]

    first = gkd.gather_memory_reports(summary=True, dst=None)
    after_first = pairs()
    for _ in range(3):
        again = gkd.gather_memory_reports(summary=True, dst=None)
    seen["default"] = {"made": kept.made - made, "same": pairs() == after_first,
                       "ranks": [r.rank for r in again], "first": [r.rank for r in first],
                       "out_numel": after_first[0][2]}
    # A group of one rank (every rank makes it; rank 0 gathers in it), then a group of
    # the same size as the world that is not the default group.
    alone = dist.new_group([0])
    if rank == 0:
        got = gkd.gather_memory_reports(group=alone, summary=True, dst=None)
        seen["alone"] = {"ranks": [r.rank for r in got], "made": kept.made - made,
                         "sizes": sorted(k["size"] for k in kept.keys())}
    everyone = dist.new_group(list(range(world)))
    got = gkd.gather_memory_reports(group=everyone, summary=True, dst=None)
    ptrs = [set(p[:2]) for p in pairs()]
    seen["everyone"] = {"ranks": [r.rank for r in got], "pairs": len(ptrs),
                        "disjoint": all(not (a & b) for i, a in enumerate(ptrs) for b in ptrs[i + 1:]),
                        "groups": len({k["group"] for k in kept.keys()})}
    dist.barrier()
    return seen


def main() -> None:
    global DEVICE
    scenario, out = sys.argv[1], Path(sys.argv[2])
    backend = sys.argv[3] if len(sys.argv) > 3 else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        DEVICE = f"cuda:{torch.cuda.current_device()}"
    dist.init_process_group(backend)
    seen = {"api": api, "outliers": outliers, "sigterm": sigterm, "buffers": buffers}[scenario](out)
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(seen, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

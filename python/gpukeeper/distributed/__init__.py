"""gpukeeper under torch.distributed: memory and timings across ranks, and OOM forensics.

torch.distributed is the engine (``all_gather`` of one tensor for summaries,
``gather_object`` for full reports, ``all_reduce``); these functions are collectives
over a group (None: the default group) that every rank of it must call. Nothing here
starts a process group: call ``torch.distributed.init_process_group()`` first, under
``torchrun`` or your launcher.

- :func:`gather_memory_reports` and :func:`format_rank_table`: every rank's
  :func:`gpukeeper.memory_report` (of the device the rank drives) on one rank, and one
  table (min, max, sum, outlier). A summary's per-process figure is NVML's reading kept
  by a background thread, sent with its age (:mod:`gpukeeper.distributed.process_figure`;
  ``fresh=True`` reads it during the call).
- :func:`aggregate`: one ``BenchmarkResult`` or ``TrajectoryResult`` per rank combined
  (spread across ranks, the slowest rank, ns/day per replica and in total).
  ``benchmark_function(..., barrier=group)`` puts the ranks in step before each call.
- :func:`pick_outlier`: the one rule that names the rank standing out (the high one for
  memory and time; with two ranks the larger, said so).
- :func:`enable_oom_snapshots`: a per-rank snapshot file on an out-of-memory error.
- :func:`rank_info`: this process's rank, from the process group or the launcher.

``GPUContext`` reports and the exit guard know the rank without this module.
"""

from __future__ import annotations

from typing import Optional

from gpukeeper.distributed.oom_snapshots import (
    disable_oom_snapshots,
    enable_oom_snapshots,
    oom_snapshots_enabled,
    write_oom_snapshot,
)
from gpukeeper.distributed.rank_memory import RankMemory, format_rank_table, gather_memory_reports
from gpukeeper.distributed.rank_outliers import OutlierPick, pick_outlier
from gpukeeper.distributed.rank_timings import RankAggregate, RankTiming, aggregate
from gpukeeper.frameworks.ranks import RankInfo, current_rank

__all__ = [
    "OutlierPick",
    "RankAggregate",
    "RankInfo",
    "RankMemory",
    "RankTiming",
    "aggregate",
    "disable_oom_snapshots",
    "enable_oom_snapshots",
    "format_rank_table",
    "gather_memory_reports",
    "oom_snapshots_enabled",
    "pick_outlier",
    "rank_info",
    "write_oom_snapshot",
]


def rank_info() -> Optional[RankInfo]:
    """This process's rank and world size: from the initialised process group, else from
    a launcher's RANK/WORLD_SIZE variables (torchrun sets them), else None."""
    return current_rank()

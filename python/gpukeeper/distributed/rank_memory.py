"""Memory across ranks: every rank's report gathered to one rank, and one table of them.

>>> reports = gather_memory_reports()          # a collective: every rank calls it
>>> if reports is not None:                    # the destination rank (0)
...     print(format_rank_table(reports))
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

from gpukeeper.account.account_reader import memory_report
from gpukeeper.account.process_account import DevicesReport
from gpukeeper.base.byte_figures import fmt_bytes
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.text_table import text_table
from gpukeeper.frameworks import ranks

__all__ = ["RankMemory", "format_rank_table", "gather_memory_reports"]


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory in totals over its devices: the payload of a summary gather,
    and a row of :func:`format_rank_table`. Sizes in bytes; None where unknown.

    ``allocated``/``reserved``: the frameworks' bytes in live objects and held from the
    driver; ``peak``: the most allocated since the frameworks' peaks were last reset;
    ``context``: the CUDA context and libraries (this process's device memory as NVML
    sees it, minus what the frameworks reserved); ``process``: NVML's figure for the
    process (RSS in CPU mode).
    """

    rank: int
    world_size: Optional[int]
    hostname: str
    pid: int
    devices: List[int]
    allocated: Optional[int]
    reserved: Optional[int]
    peak: Optional[int]
    context: Optional[int]
    process: Optional[int]

    @classmethod
    def from_report(cls, report: DevicesReport, rank: Optional[int] = None) -> "RankMemory":
        """The totals of ``report``; ``rank`` when the report carries none."""
        r = report.rank if report.rank is not None else rank
        if r is None:
            raise InvalidInputError(
                "RankMemory.from_report: the report has no rank and none was given"
            )
        return cls(
            rank=int(r),
            world_size=report.world_size,
            hostname=report.hostname,
            pid=report.pid,
            devices=[d.device for d in report.devices if d.device is not None],
            allocated=report.frameworks_allocated_bytes,
            reserved=report.frameworks_reserved_bytes,
            peak=report.peak_allocated_bytes,
            context=report.context_and_libraries_bytes,
            process=report.process_bytes,
        )

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def gather_memory_reports(
    group: Any = None,
    dst: Optional[int] = 0,
    *,
    summary: bool = False,
    use_nvml: bool = True,
) -> Optional[List[Union[DevicesReport, RankMemory]]]:
    """Every rank's memory report, in rank order, on the destination rank.

    A collective over ``group`` (None: the default group): every rank of it must call.
    ``dst``: the global rank that receives the list (the others get None); None gives it
    to every rank. Each report is :func:`gpukeeper.memory_report` over all the devices its
    rank sees, tagged with the rank (``DevicesReport.rank``).

    ``summary=True`` gathers one :class:`RankMemory` per rank instead: a fixed handful of
    totals, so the bytes on the wire do not grow with the devices, frameworks and
    processes a rank sees (what a job of thousands of ranks wants).

    torch.distributed carries the objects (``gather_object``; ``all_gather_object`` for
    ``dst=None``): with NCCL they travel through the current CUDA device, so set it
    (``torch.cuda.set_device(local_rank)``) first, as for any collective. Raises
    ``InvalidInputError`` without a process group, for a group that is not a
    ``ProcessGroup``, or for a ``dst`` outside the job or the group.
    """
    what = "gather_memory_reports"
    group = ranks.check_group(group, what)
    dst = ranks.check_dst(dst, group, what)
    if not isinstance(summary, bool):
        raise InvalidInputError(f"{what}: summary must be a bool, got {summary!r}")
    if not isinstance(use_nvml, bool):
        raise InvalidInputError(f"{what}: use_nvml must be a bool, got {use_nvml!r}")
    report = memory_report(use_nvml=use_nvml)  # tagged with this rank
    payload: Any = RankMemory.from_report(report).to_dict() if summary else report.to_dict()
    gathered = ranks.gather_objects(payload, group, dst)
    if gathered is None:
        return None
    if summary:
        return [RankMemory(**d) for d in gathered]
    return [DevicesReport.from_dict(d) for d in gathered]


# ------------------------------------------------------------------------ the table

_COLUMNS = (
    ("allocated", "allocated"),
    ("reserved", "reserved"),
    ("peak", "peak"),
    ("context", "context"),
    ("process", "process"),
)

#: A rank is the outlier of a column when it is this far from the median of the others
#: (and at least OUTLIER_MIN_BYTES away): ranks of one job usually differ by a few
#: percent at most, a leak or an imbalance by much more.
OUTLIER_FRACTION = 0.10
OUTLIER_MIN_BYTES = 64 << 20


def _rows(reports: Sequence[Any]) -> List[RankMemory]:
    if isinstance(reports, (str, bytes)) or not isinstance(reports, Sequence):
        raise InvalidInputError(
            "format_rank_table: reports must be a list of DevicesReport or RankMemory, "
            f"got {type(reports).__name__}"
        )
    if not reports:
        raise InvalidInputError("format_rank_table: no reports")
    rows = []
    for i, r in enumerate(reports):
        if isinstance(r, RankMemory):
            rows.append(r)
        elif isinstance(r, DevicesReport):
            rows.append(RankMemory.from_report(r, rank=i))
        else:
            raise InvalidInputError(
                f"format_rank_table: reports[{i}] is a {type(r).__name__}, "
                "not a DevicesReport or RankMemory"
            )
    return rows


def outlier(rows: Sequence[RankMemory], column: str) -> Optional[RankMemory]:
    """The rank furthest from the median of ``column`` when it stands out
    (``OUTLIER_FRACTION`` of the median and ``OUTLIER_MIN_BYTES``), else None."""
    known = [r for r in rows if getattr(r, column) is not None]
    if len(known) < 2:
        return None
    mid = statistics.median(getattr(r, column) for r in known)
    far = max(known, key=lambda r: abs(getattr(r, column) - mid))
    gap = abs(getattr(far, column) - mid)
    if gap >= OUTLIER_MIN_BYTES and gap >= OUTLIER_FRACTION * abs(mid):
        return far
    return None


def format_rank_table(reports: Sequence[Union[DevicesReport, RankMemory]]) -> str:
    """One table of memory across ranks: a row per rank (allocated, reserved, peak,
    context and the process's own figure, NVML's or in CPU mode its RSS, in totals over
    the rank's devices), then min, max and sum of each column,
    and the outlier rank of each column: the one furthest from the median, named when it
    is at least 10 % and 64 MiB away from it ("-" when no rank stands out).

    ``reports``: what :func:`gather_memory_reports` returned (either kind), or any list
    of ``DevicesReport`` (ranks taken from the reports, else their positions).
    """
    rows = _rows(reports)
    header = ["rank", "host", "devices"] + [title for _, title in _COLUMNS]
    body = []
    for r in sorted(rows, key=lambda r: r.rank):
        devices = ",".join(str(d) for d in r.devices) or "cpu"
        body.append(
            [str(r.rank), r.hostname, devices] + [fmt_bytes(getattr(r, col)) for col, _ in _COLUMNS]
        )
    for label, pick in (("min", min), ("max", max), ("sum", sum)):
        cells = []
        for col, _ in _COLUMNS:
            values = [getattr(r, col) for r in rows]
            cells.append("?" if any(v is None for v in values) else fmt_bytes(pick(values)))
        body.append([label, "", ""] + cells)
    cells = []
    for col, _ in _COLUMNS:
        odd = outlier(rows, col)
        cells.append("-" if odd is None else f"rank {odd.rank}")
    body.append(["outlier", "", ""] + cells)
    world = next((r.world_size for r in rows if r.world_size is not None), None)
    title = (
        f"gpukeeper memory across ranks "
        f"({len(rows)} of {world if world is not None else len(rows)})"
    )
    return title + "\n" + text_table(header, body, left=3)

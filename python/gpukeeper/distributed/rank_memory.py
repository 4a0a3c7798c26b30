"""Memory across ranks: every rank's report gathered to one rank, and one table of them.

>>> reports = gather_memory_reports()          # a collective: every rank calls it
>>> if reports is not None:                    # the destination rank (0)
...     print(format_rank_table(reports))
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from gpukeeper.account.account_reader import memory_report, rank_totals_report
from gpukeeper.account.process_account import DevicesReport
from gpukeeper.base.arg_checks import check_choice
from gpukeeper.base.byte_figures import fmt_bytes
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.text_table import text_table
from gpukeeper.distributed.fixed_rows import (
    HOSTNAME_BYTES,
    text_word_count,
    text_words,
    words_text,
)
from gpukeeper.distributed.process_figure import ProcessFigures
from gpukeeper.distributed.rank_outliers import TWO_RANKS_NOTE, pick_outlier
from gpukeeper.frameworks import ranks

__all__ = [
    "HOSTNAME_BYTES",
    "VECTOR_LENGTH",
    "RankMemory",
    "format_rank_table",
    "gather_memory_reports",
    "outlier",
]


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory in totals over its devices: the payload of a summary gather,
    and a row of :func:`format_rank_table`. Sizes in bytes; None where unknown.

    ``allocated``/``reserved``: the frameworks' bytes in live objects and held from the
    driver; ``peak``: the most allocated since the frameworks' peaks were last reset;
    ``context``: the CUDA context and libraries (this process's device memory as NVML
    sees it, minus what the frameworks reserved); ``process``: NVML's figure for the
    process (RSS in CPU mode). ``devices``: the devices the totals cover (empty in CPU
    mode); ``other_devices``: other devices this process holds memory on when the report
    covered only the rank's own device (``scope="rank"``), None when not asked or unknown.
    ``process_age_ms``: how long before the rank sent its row ``process`` was read (and
    so ``context``, which is computed from it), in milliseconds: 0 for a figure read
    during the gather, more for a summary that sent the background reading
    (:mod:`gpukeeper.distributed.process_figure`); None when not said (a row made from a
    full report) or when there is no figure. Microseconds travel.
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
    other_devices: Optional[List[int]] = None
    process_age_ms: Optional[float] = None

    @classmethod
    def from_report(
        cls,
        report: DevicesReport,
        rank: Optional[int] = None,
        process_age_ms: Optional[float] = None,
    ) -> "RankMemory":
        """The totals of ``report``; ``rank`` when the report carries none;
        ``process_age_ms``: how old its process figure is, where the caller knows."""
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
            other_devices=None if report.other_devices is None else list(report.other_devices),
            process_age_ms=None if report.process_bytes is None else process_age_ms,
        )

    def to_dict(self) -> Dict[str, Any]:
        """The fields as JSON-ready builtins."""
        return asdict(self)

    def to_vector(self) -> List[int]:
        """The summary as :data:`VECTOR_LENGTH` int64s, the row a summary gather carries.

        Layout: a format mark, rank, world size, pid, a mask of ``devices``, a mask of
        ``other_devices``, the five sizes, the process figure's age in microseconds, the
        host name's length in bytes and its first :data:`HOSTNAME_BYTES` bytes (UTF-8)
        packed 8 to a word. Unknown values are -1 (sizes, world size, age) and a mask of
        -1 is None. Device indices 0-62 travel; a
        larger one is left out of the masks (the sizes still count it).
        """
        sizes = [self.allocated, self.reserved, self.peak, self.context, self.process]
        return [
            _VECTOR_MARK,
            self.rank,
            _UNKNOWN if self.world_size is None else self.world_size,
            self.pid,
            _mask(self.devices),
            _UNKNOWN if self.other_devices is None else _mask(self.other_devices),
            *(_UNKNOWN if v is None else int(v) for v in sizes),
            _UNKNOWN if self.process_age_ms is None else max(0, round(self.process_age_ms * 1000)),
            *text_words(self.hostname, HOSTNAME_BYTES),
        ]

    @classmethod
    def from_vector(cls, row: Sequence[int]) -> "RankMemory":
        """Reads back :meth:`to_vector`. A host name longer than :data:`HOSTNAME_BYTES`
        bytes comes back cut there (at a character boundary). Raises ``InvalidInputError``
        for a row of another length or without the format mark."""
        if len(row) != VECTOR_LENGTH or row[0] != _VECTOR_MARK:
            raise InvalidInputError(
                f"RankMemory.from_vector: not a summary row (want {VECTOR_LENGTH} int64s "
                f"starting with {_VECTOR_MARK}, got {len(row)} starting with "
                f"{row[0] if len(row) else None})"
            )
        _, rank, world, pid, devices, others = row[:6]
        sizes = [None if v == _UNKNOWN else int(v) for v in row[6:11]]
        age_us = row[11]
        hostname = _hostname(tuple(row[12:]))
        return cls(
            rank=int(rank),
            world_size=None if world == _UNKNOWN else int(world),
            hostname=hostname,
            pid=int(pid),
            devices=_unmask(devices),
            allocated=sizes[0],
            reserved=sizes[1],
            peak=sizes[2],
            context=sizes[3],
            process=sizes[4],
            other_devices=None if others == _UNKNOWN else _unmask(others),
            process_age_ms=None if age_us == _UNKNOWN else int(age_us) / 1000.0,
        )


#: int64s in a summary row: 12 words of figures, then the host name.
VECTOR_LENGTH = 12 + text_word_count(HOSTNAME_BYTES)
# Marks a row as this layout ("gk" and a version), so a row of another layout fails
# loudly instead of reading as figures.
_VECTOR_MARK = 0x676B_0002
_UNKNOWN = -1
_MASK_BITS = 63  # bit 63 would make the word negative, and -1 means unknown


@lru_cache(maxsize=256)
def _hostname(words: Tuple[int, ...]) -> str:
    # A job's rows carry a few host names over and over: each is decoded once.
    return words_text(words, HOSTNAME_BYTES)


def _mask(devices: Sequence[int]) -> int:
    return sum(1 << d for d in set(devices) if 0 <= d < _MASK_BITS)


def _unmask(mask: int) -> List[int]:
    out = []
    while mask > 0:  # one step per set bit: a rank's row names one device or a few
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def gather_memory_reports(
    group: Any = None,
    dst: Optional[int] = 0,
    *,
    summary: bool = False,
    use_nvml: bool = True,
    scope: str = "rank",
    fresh: bool = False,
) -> Optional[List[Union[DevicesReport, RankMemory]]]:
    """Every rank's memory report, in rank order, on the destination rank.

    A collective over ``group`` (None: the default group): every rank of it must call.
    ``dst``: the global rank that receives the list (the others get None); None gives it
    to every rank. Each report is :func:`gpukeeper.memory_report` tagged with its rank
    (``DevicesReport.rank``).

    ``scope="rank"`` (the default): each rank reports the device it drives (its current
    CUDA device, ``torch.cuda.set_device(local_rank)``), and ``other_devices`` lists any
    other device it holds memory on (a stray context on device 0 is the usual one).
    ``scope="visible"``: each rank reports every device it sees, as a single process's
    ``memory_report()`` does. In CPU mode both give the host report.

    ``summary=True`` gathers one :class:`RankMemory` per rank instead: a fixed row of
    :data:`VECTOR_LENGTH` int64s, carried by one tensor ``all_gather``, so the bytes on the
    wire do not grow with the devices, frameworks and processes a rank sees, and nothing
    is pickled. The host name travels cut to :data:`HOSTNAME_BYTES` bytes.

    A summary's ``process`` figure (and ``context``, computed from it) is NVML's, read off
    the collective's critical path: the first summary reads NVML's process list for this
    process, then a background thread reads it again every 20 ms while summaries keep
    coming (:mod:`gpukeeper.distributed.process_figure`), and each summary sends the
    latest reading with its age (``RankMemory.process_age_ms``; the table says how old
    the oldest is). A figure can thus miss memory taken or given back in the last
    milliseconds. ``fresh=True`` reads NVML during the call instead (age 0), at the cost
    of the driver call on every rank. Full reports always read NVML during the call.

    Full reports travel through torch.distributed's ``gather_object``
    (``all_gather_object`` for ``dst=None``). With NCCL every collective here runs on the
    current CUDA device, so set it (``torch.cuda.set_device(local_rank)``) first, as for
    any collective. Raises ``InvalidInputError`` without a process group, for a group that
    is not a ``ProcessGroup``, for a ``dst`` outside the job or the group, or for an
    unknown ``scope``.
    """
    what = "gather_memory_reports"
    group = ranks.check_group(group, what)
    dst = ranks.check_dst(dst, group, what)
    if not isinstance(summary, bool):
        raise InvalidInputError(f"{what}: summary must be a bool, got {summary!r}")
    if not isinstance(use_nvml, bool):
        raise InvalidInputError(f"{what}: use_nvml must be a bool, got {use_nvml!r}")
    if not isinstance(fresh, bool):
        raise InvalidInputError(f"{what}: fresh must be a bool, got {fresh!r}")
    check_choice(scope, f"{what}: scope", ("rank", "visible"))
    if summary:
        figures = ProcessFigures(fresh=fresh)
        totals = rank_totals_report(use_nvml, scope, figures)  # tagged with this rank
        age_s = figures.age_s
        age_ms = 0.0 if age_s is None else age_s * 1000.0  # None: read during the call
        row = RankMemory.from_report(totals, process_age_ms=age_ms)
        rows = ranks.all_gather_int64(row.to_vector(), group, dst)
        return None if rows is None else [RankMemory.from_vector(row) for row in rows]
    report = memory_report(use_nvml=use_nvml, scope=scope)  # tagged with this rank
    gathered = ranks.gather_objects(report.to_dict(), group, dst)
    if gathered is None:
        return None
    return [DevicesReport.from_dict(d) for d in gathered]


# ------------------------------------------------------------------------ the table

_COLUMNS = (
    ("allocated", "allocated"),
    ("reserved", "reserved"),
    ("peak", "peak"),
    ("context", "context"),
    ("process", "process"),
)

#: A rank is the outlier of a column when it is above the median of the ranks by this
#: fraction of the median and at least OUTLIER_MIN_BYTES (with two ranks: above the other
#: rank): ranks of one job usually differ by a few percent at most, a leak or an
#: imbalance by much more.
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
    """The rank that holds the most of ``column`` when it stands out, else None: the rule
    of :func:`gpukeeper.distributed.pick_outlier` (direction high), with the thresholds
    ``OUTLIER_FRACTION`` of the median and ``OUTLIER_MIN_BYTES``. With two ranks it is the
    larger one; :func:`format_rank_table` marks that."""
    by_rank = {r.rank: r for r in rows}
    pick = pick_outlier(
        {r.rank: getattr(r, column) for r in rows},
        direction="high",
        min_gap=OUTLIER_MIN_BYTES,
        min_fraction=OUTLIER_FRACTION,
    )
    return None if pick is None else by_rank[pick.rank]


def format_rank_table(reports: Sequence[Union[DevicesReport, RankMemory]]) -> str:
    """One table of memory across ranks: a row per rank (allocated, reserved, peak,
    context and the process's own figure, NVML's or in CPU mode its RSS, in totals over
    the rank's devices), then min, max and sum of each column, and the outlier rank of
    each column ("-" when no rank stands out).

    The outlier is the rank holding the most, above the median by at least 10 % of it and
    64 MiB; a rank far below the others is never named. With two ranks the median lies
    halfway and cannot tell, so the larger one is named (10 % and 64 MiB above the other),
    marked ``*`` and explained under the table. The devices cell lists the devices the
    row covers and, as ``(+ 0)``, other devices the rank holds memory on. Under the table
    a line says how old the oldest process figure is when a summary sent a background
    reading (``RankMemory.process_age_ms``).

    ``reports``: what :func:`gather_memory_reports` returned (either kind), or any list
    of ``DevicesReport`` (ranks taken from the reports, else their positions).
    """
    rows = _rows(reports)
    header = ["rank", "host", "devices"] + [title for _, title in _COLUMNS]
    body = []
    for r in sorted(rows, key=lambda r: r.rank):
        devices = ",".join(str(d) for d in r.devices) or "cpu"
        if r.other_devices:
            devices += " (+ " + ",".join(str(d) for d in r.other_devices) + ")"
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
    of_two = False
    for col, _ in _COLUMNS:
        odd = outlier(rows, col)
        mark = "*" if odd is not None and _known_count(rows, col) == 2 else ""
        of_two = of_two or bool(mark)
        cells.append("-" if odd is None else f"rank {odd.rank}{mark}")
    body.append(["outlier", "", ""] + cells)
    world = next((r.world_size for r in rows if r.world_size is not None), None)
    title = (
        f"gpukeeper memory across ranks "
        f"({len(rows)} of {world if world is not None else len(rows)})"
    )
    text = title + "\n" + text_table(header, body, left=3)
    if of_two:
        text = text.rstrip("\n") + "\n* " + TWO_RANKS_NOTE + "\n"
    ages = [(r.process_age_ms, r.rank) for r in rows if r.process_age_ms is not None]
    if ages and max(ages)[0] >= 0.05:  # shown to 0.1 ms
        age, rank = max(ages)
        text = text.rstrip("\n") + (
            f"\nprocess figures read up to {age:.1f} ms before the gather "
            f"(rank {rank}); context follows them\n"
        )
    return text


def _known_count(rows: Sequence[RankMemory], column: str) -> int:
    return sum(getattr(r, column) is not None for r in rows)

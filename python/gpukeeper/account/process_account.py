"""The whole process's account: every visible device's report and their totals.

>>> everything = gpukeeper.memory_report()     # a DevicesReport (memory_report(0): one device)
>>> print(everything)                          # one section per device, then the total
>>> everything.frameworks_reserved_bytes       # summed over the devices
>>> everything[1].context_and_libraries_bytes  # device 1's MemoryReport
>>> everything.for_device("cuda:1")            # the same, by its device spelling
>>> DevicesReport.from_dict(everything.to_dict())   # to_json() for text

A :class:`DevicesReport` holds one :class:`~gpukeeper.account.device_account.MemoryReport`
per visible CUDA device (the single CPU-mode report without CUDA) and the process's
identity: host name, pid, and, once :mod:`gpukeeper.distributed` fills them in, its rank
and world size. Its totals carry the names of ``MemoryReport``'s figures and are plain
sums; a total is ``None`` when one device's figure is unknown, since leaving a device out
would make the total look smaller than it is.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union, overload

from gpukeeper.account.device_account import MemoryReport, framework_rows
from gpukeeper.base import device_names
from gpukeeper.base.arg_checks import check_optional_int
from gpukeeper.base.byte_figures import figure_table, fmt_bytes, sum_known
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.html_table import html_fields, html_table
from gpukeeper.frameworks import FrameworkMemory, memory_dict

__all__ = ["DevicesReport"]

# Keys from_dict needs; rank and world_size may be absent (a report of a single process).
_REQUIRED = ("devices", "hostname", "pid", "timestamp")


@dataclass
class DevicesReport:
    """Who holds the memory of every visible device in this process, with totals.

    ``devices``: one :class:`~gpukeeper.account.device_account.MemoryReport` per visible
    CUDA device, in device order (in CPU mode, the one host-memory report). ``rank`` and
    ``world_size``: this process's place in a distributed job, None outside one.
    ``other_devices``: for a report of only the device a rank drives
    (``memory_report(scope="rank")``), the other devices this process holds memory on
    (their figures are not in the report); None when the report covers every visible
    device, or when that could not be told. All sizes are in bytes; ``None`` means unknown.

    It is a sequence of its device reports: ``len(r)``, ``r[i]``, ``for d in r``.
    """

    devices: List[MemoryReport]
    rank: Optional[int] = None
    world_size: Optional[int] = None
    hostname: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    timestamp: float = field(default_factory=time.time)
    other_devices: Optional[List[int]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.devices, list) or not all(
            isinstance(d, MemoryReport) for d in self.devices
        ):
            raise InvalidInputError("DevicesReport devices must be a list of MemoryReport")
        for name in ("rank", "world_size"):
            check_optional_int(getattr(self, name), f"DevicesReport {name}", 0)
        if self.world_size == 0:
            raise InvalidInputError("DevicesReport world_size must be at least 1")
        if self.other_devices is not None and (
            not isinstance(self.other_devices, list)
            or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0
                for d in self.other_devices
            )
        ):
            raise InvalidInputError(
                "DevicesReport other_devices must be None or a list of device indices, "
                f"got {self.other_devices!r}"
            )
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise InvalidInputError(
                f"DevicesReport rank {self.rank} is not below world_size {self.world_size}"
            )

    # ----------------------------------------------------------------- the devices

    def __len__(self) -> int:
        return len(self.devices)

    def __iter__(self) -> Iterator[MemoryReport]:
        return iter(self.devices)

    @overload
    def __getitem__(self, i: int) -> MemoryReport: ...

    @overload
    def __getitem__(self, i: slice) -> List[MemoryReport]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[MemoryReport, List[MemoryReport]]:
        """The ``i``-th device report (list position, which is the device index in
        CUDA mode); a list for a slice."""
        return self.devices[i]

    def for_device(self, device: Any) -> MemoryReport:
        """The report of ``device``: an index, ``"cuda:N"``, a ``torch.device``, or
        ``"cpu"`` for the CPU-mode report. Raises ``InvalidInputError`` naming the device
        when this report has none such, or when ``device`` names no particular one."""
        kind, index = device_names.parse_device(device, "device")
        for report in self.devices:
            if (kind == "cpu" and report.mode == "cpu") or (
                kind == "cuda"
                and index is not None
                and report.mode == "cuda"
                and report.device == index
            ):
                return report
        if kind != "cpu" and index is None:
            raise InvalidInputError(
                f"for_device needs a particular device (an index, 'cuda:N' or 'cpu'), "
                f"got {device!r}"
            )
        held = ", ".join(_where(r) for r in self.devices) or "none"
        raise InvalidInputError(f"this report has no device {device!r} (it has: {held})")

    # ----------------------------------------------------------------- totals

    @property
    def mode(self) -> str:
        """``"cuda"`` when the reports are of CUDA devices, else ``"cpu"``."""
        return "cuda" if any(r.mode == "cuda" for r in self.devices) else "cpu"

    @property
    def total_bytes(self) -> int:
        """Total memory of the devices (the host's in CPU mode)."""
        return sum(r.total_bytes for r in self.devices)

    @property
    def free_bytes(self) -> int:
        """Free memory of the devices (the host's available memory in CPU mode)."""
        return sum(r.free_bytes for r in self.devices)

    @property
    def used_bytes(self) -> int:
        """Used memory of the devices (total - free), every process included."""
        return sum(r.used_bytes for r in self.devices)

    @property
    def process_bytes(self) -> Optional[int]:
        """This process's memory on the devices (NVML; the resident set in CPU mode)."""
        return sum_known(r.process_bytes for r in self.devices)

    @property
    def frameworks(self) -> Dict[str, FrameworkMemory]:
        """Each framework's allocated and reserved bytes over the devices: a framework
        absent from a device's report holds nothing there."""
        names: List[str] = []
        for r in self.devices:
            names += [n for n in r.frameworks if n not in names]
        return {
            name: FrameworkMemory(
                name,
                sum_known(
                    r.frameworks[name].allocated for r in self.devices if name in r.frameworks
                ),
                sum_known(
                    r.frameworks[name].reserved for r in self.devices if name in r.frameworks
                ),
            )
            for name in names
        }

    @property
    def frameworks_allocated_bytes(self) -> Optional[int]:
        """The frameworks' allocated bytes over the devices."""
        return sum_known(r.frameworks_allocated_bytes for r in self.devices)

    @property
    def frameworks_reserved_bytes(self) -> Optional[int]:
        """The frameworks' reserved bytes over the devices."""
        return sum_known(r.frameworks_reserved_bytes for r in self.devices)

    @property
    def peak_allocated_bytes(self) -> Optional[int]:
        """The sum of each device's
        :attr:`~gpukeeper.account.device_account.MemoryReport.peak_allocated_bytes`; None
        when one device has no framework that keeps a peak."""
        return sum_known(r.peak_allocated_bytes for r in self.devices)

    @property
    def context_and_libraries_bytes(self) -> Optional[int]:
        """The CUDA contexts and libraries over the devices (None in CPU mode)."""
        return sum_known(r.context_and_libraries_bytes for r in self.devices)

    @property
    def other_processes_bytes(self) -> Optional[int]:
        """What other processes hold on the devices (0 in CPU mode)."""
        return sum_known(r.other_processes_bytes for r in self.devices)

    @property
    def unaccounted_bytes(self) -> Optional[int]:
        """This process's device memory beyond what its frameworks reserved, over the
        devices (None in CPU mode)."""
        return sum_known(r.unaccounted_bytes for r in self.devices)

    # ----------------------------------------------------------------- conversions

    def _totals(self) -> Dict[str, Any]:
        return {
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
            "used_bytes": self.used_bytes,
            "frameworks": memory_dict(self.frameworks),
            "frameworks_allocated_bytes": self.frameworks_allocated_bytes,
            "frameworks_reserved_bytes": self.frameworks_reserved_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "process_bytes": self.process_bytes,
            "context_and_libraries_bytes": self.context_and_libraries_bytes,
            "other_processes_bytes": self.other_processes_bytes,
            "unaccounted_bytes": self.unaccounted_bytes,
        }

    def to_dict(self) -> Dict[str, Any]:
        """The report as JSON-ready builtins: the process's identity, ``mode``, each
        device's ``MemoryReport.to_dict()`` under ``"devices"`` and the totals under
        ``"total"`` (derived: ``from_dict`` recomputes them), and ``"other_devices"`` when
        it is known (a report of ``scope="rank"``)."""
        data: Dict[str, Any] = {
            "rank": self.rank,
            "world_size": self.world_size,
            "hostname": self.hostname,
            "pid": self.pid,
            "timestamp": self.timestamp,
            "mode": self.mode,
            "devices": [r.to_dict() for r in self.devices],
            "total": self._totals(),
        }
        if self.other_devices is not None:  # only a rank's report has it: others keep their keys
            data["other_devices"] = self.other_devices
        return data

    def to_json(self, indent: Optional[int] = 2) -> str:
        """``to_dict()`` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "DevicesReport":
        """Reads back ``to_dict()`` (or parsed ``to_json()``); ``mode`` and ``total`` are
        derived and ignored. Raises ``InvalidInputError`` naming what is missing or
        malformed (a key of the report, or of one device's report)."""
        if not isinstance(data, dict):
            raise InvalidInputError(
                f"DevicesReport.from_dict takes a dict, got {type(data).__name__}"
            )
        missing = [key for key in _REQUIRED if key not in data]
        if missing:
            raise InvalidInputError(
                f"DevicesReport.from_dict: the report lacks {', '.join(map(repr, missing))}"
            )
        if not isinstance(data["devices"], list):
            raise InvalidInputError(
                "DevicesReport.from_dict: 'devices' must be a list of device reports"
            )
        reports = []
        for i, device in enumerate(data["devices"]):
            try:
                reports.append(MemoryReport.from_dict(device))
            except InvalidInputError as exc:
                raise InvalidInputError(f"DevicesReport.from_dict: devices[{i}]: {exc}") from None
        return cls(
            devices=reports,
            rank=data.get("rank"),
            world_size=data.get("world_size"),
            hostname=data["hostname"],
            pid=data["pid"],
            timestamp=data["timestamp"],
            other_devices=data.get("other_devices"),
        )

    # ----------------------------------------------------------------- text and HTML

    def _title(self) -> str:
        parts = []
        if self.rank is not None:
            parts.append(
                f"rank {self.rank}"
                + (f" of {self.world_size}" if self.world_size is not None else "")
            )
        elif self.world_size is not None:
            parts.append(f"world size {self.world_size}")
        parts += [f"host {self.hostname}", f"pid {self.pid}"]
        if self.mode == "cuda":
            parts.append(f"{len(self.devices)} CUDA device{'s' if len(self.devices) != 1 else ''}")
        else:
            parts.append("CPU mode")
        if self.other_devices:
            held = ", ".join(str(d) for d in self.other_devices)
            parts.append(
                f"also holds memory on device{'s' if len(self.other_devices) > 1 else ''} {held}"
            )
        return "gpukeeper memory report of the process: " + ", ".join(parts)

    def _total_parts(self) -> Tuple[str, List[Tuple[str, str, str]]]:
        """The total table's title and rows (label, allocated, reserved): what
        ``table()`` writes as text and ``_repr_html_()`` as HTML."""
        cuda = self.mode == "cuda"
        where = ", ".join(_where(r) for r in self.devices)
        title = f"total over {where}" if cuda else "total (CPU mode, host memory)"
        rows = framework_rows(self.frameworks, self.mode)
        rows.append(
            (
                "frameworks",
                fmt_bytes(self.frameworks_allocated_bytes, unknown="unknown"),
                fmt_bytes(self.frameworks_reserved_bytes, unknown="unknown"),
            )
        )
        if self.peak_allocated_bytes is not None:
            rows.append(
                ("peak allocated", fmt_bytes(self.peak_allocated_bytes, unknown="unknown"), "")
            )
        if cuda:
            rows.append(
                (
                    "CUDA contexts + libraries",
                    "",
                    fmt_bytes(self.context_and_libraries_bytes, unknown="unknown"),
                )
            )
            rows.append(
                ("this process (NVML)", "", fmt_bytes(self.process_bytes, unknown="unknown"))
            )
            rows.append(
                ("other processes", "", fmt_bytes(self.other_processes_bytes, unknown="unknown"))
            )
        else:
            rows.append(
                ("this process (resident)", "", fmt_bytes(self.process_bytes, unknown="unknown"))
            )
        rows.append(("used", "", fmt_bytes(self.used_bytes, unknown="unknown")))
        rows.append(
            ("free" if cuda else "available", "", fmt_bytes(self.free_bytes, unknown="unknown"))
        )
        rows.append(("total", "", fmt_bytes(self.total_bytes, unknown="unknown")))
        return title, rows

    def table(self) -> str:
        """A readable text: the process's title, each device's ``MemoryReport.table()``,
        then the total table."""
        title, rows = self._total_parts()
        sections = [self._title()] + [r.table() for r in self.devices]
        sections.append(figure_table(title, ("allocated", "reserved"), rows))
        return "\n\n".join(sections)

    def _repr_html_(self) -> str:
        """The same sections as ``table()``, as compact HTML for Jupyter."""
        header = html_fields(
            self._title(), [("devices", ", ".join(_where(r) for r in self.devices))]
        )
        title, rows = self._total_parts()
        # HTML collapses the leading spaces that indent a framework under "frameworks".
        cells = [("\u00a0\u00a0" + a[2:] if a.startswith("  ") else a, b, c) for a, b, c in rows]
        total = html_table(title, ["", "allocated", "reserved"], cells)
        return header + "".join(r._repr_html_() for r in self.devices) + total

    def __str__(self) -> str:
        return self.table()


def _where(report: MemoryReport) -> str:
    """How a device report is named in titles: ``"CUDA device 1"`` or ``"host"``."""
    return f"CUDA device {report.device}" if report.mode == "cuda" else "host"

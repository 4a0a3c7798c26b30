"""``MemoryReport``: one device's account, who holds its memory, as figures, a table and JSON.

The report splits this process's device memory into

* each framework's **allocated** bytes (live tensors, arrays, buffers) and **reserved**
  bytes (held from the driver, cache included): PyTorch, CuPy, JAX and gpukeeper's own
  pools, read through :mod:`gpukeeper.frameworks` (nothing is imported to read it);
* each framework's **peak** of allocated bytes since ``frameworks.reset_peaks``, where
  it keeps one (PyTorch, gpukeeper's pools; CuPy does not): ``peaks`` and their sum
  ``peak_allocated_bytes``;
* the **CUDA context and libraries**: this process's device memory as NVML sees it minus
  what the frameworks reserved (the context itself, loaded kernels, cuBLAS/cuDNN
  handles and anything allocated behind the frameworks' backs);
* **other contexts in this process**: the CUDA contexts that are not the primary one
  the frameworks share (an engine such as OpenMM makes its own with ``cuCtxCreate``).
  The driver cannot list a process's contexts, so they are counted from what can be
  seen (``cuda_contexts``, a lower bound): the primary context's state, a non-primary
  context current on the calling thread, NVML listing the process on a device whose
  primary context does not exist. Their memory (``other_contexts_bytes``) is the
  process's figure minus the frameworks' when the primary context does not exist; when
  both exist NVML's one figure per process cannot be split, and the report says so
  (``unaccounted_bytes`` is then the sum of contexts, libraries and engines);
* **other processes** on the device (NVML's per-process list), and the device's **free**
  and **total** memory.

NVML comes from nvidia-ml-py (``import pynvml``), imported and initialised once, lazily.
Without it, or when NVML fails, the report says so in its ``nvml`` field (e.g.
``"unavailable: No module named 'pynvml' (install nvidia-ml-py)"``) and fills what it
can: frameworks, free and total (from ``cudaMemGetInfo``); the process figure, the
context and the other processes are then ``None``. No call here raises for a missing
or failing NVML.

Without CUDA (CPU-only build, no driver, no device) the report is in **CPU mode**:
``mode == "cpu"``, free and total are the host's (``MemAvailable`` and physical
memory), ``frameworks`` holds gpukeeper's host pools, ``process_bytes`` is this
process's resident set size, and ``notes`` says why CUDA is unavailable.

NVML access (loading, device matching, per-process figures) lives in
:mod:`gpukeeper.base.nvml`; the report is read by
:mod:`gpukeeper.account.account_reader`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from gpukeeper import frameworks
from gpukeeper.base.byte_figures import figure_table, fmt_bytes, sum_known
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.html_table import html_table
from gpukeeper.base.nvml import ProcessMemory
from gpukeeper.frameworks import FrameworkMemory

__all__ = ["MemoryReport", "framework_rows"]


@dataclass
class MemoryReport:
    """Who holds a device's memory (see the module's docstring for each figure).

    All sizes are in bytes. ``None`` means unknown, with the reason in ``nvml`` or
    ``notes``, never a guess.
    """

    mode: str  # "cuda" or "cpu"
    device: Optional[int]  # CUDA device index; None in CPU mode
    name: str
    total_bytes: int
    free_bytes: int
    memory_source: str  # "nvml", "cudaMemGetInfo" or "host"
    frameworks: Dict[str, FrameworkMemory]
    process_bytes: Optional[int]  # NVML's figure for this process; RSS in CPU mode
    process_source: str
    this_process: str  # how this process was found in NVML's list, or why not
    other_processes: List[ProcessMemory]
    nvml: str
    host: Dict[str, Optional[int]]
    pid: int = field(default_factory=os.getpid)
    notes: List[str] = field(default_factory=list)
    timestamp: float = field(default_factory=time.time)
    # This process's CUDA contexts on the device (frameworks.context_census): whether the
    # primary context exists, a lower bound of the others (0: none seen) and the evidence.
    primary_context: Optional[bool] = None
    other_contexts: Optional[int] = None
    contexts_how: str = ""
    # Each framework's most allocated bytes on the device since frameworks.reset_peaks
    # (only those that keep a resettable peak: PyTorch, gpukeeper's pools; not CuPy).
    peaks: Dict[str, int] = field(default_factory=dict)
    # How much was read (memory_report's ``detail``): "full", "counters" (no process
    # list, name, contexts or host section) or "device" (free and total alone: the
    # frameworks were not read, so their sums are None).
    detail: str = "full"

    # ----------------------------------------------------------------- derived figures

    @property
    def used_bytes(self) -> int:
        """Device-wide used memory (total - free), every process included."""
        return self.total_bytes - self.free_bytes

    @property
    def frameworks_allocated_bytes(self) -> Optional[int]:
        """Sum of the frameworks' allocated bytes; None if any framework cannot tell (or
        none was read: ``detail="device"``)."""
        return self._frameworks_sum("allocated")

    @property
    def frameworks_reserved_bytes(self) -> Optional[int]:
        """Sum of the frameworks' reserved bytes; None if any framework cannot tell (or
        none was read: ``detail="device"``)."""
        return self._frameworks_sum("reserved")

    def _frameworks_sum(self, figure: str) -> Optional[int]:
        if self.detail == "device":
            return None  # not read, so not zero
        return sum_known(getattr(m, figure) for m in self.frameworks.values())

    @property
    def peak_allocated_bytes(self) -> Optional[int]:
        """Sum of the frameworks' peaks of allocated bytes (``peaks``); None when no
        framework keeps one. Each peak is its own framework's, reached at its own time,
        so the sum bounds the joint peak from above."""
        return sum(self.peaks.values()) if self.peaks else None

    @property
    def cuda_contexts(self) -> Optional[int]:
        """CUDA contexts this process holds on the device, as far as can be seen (a lower
        bound: the primary context, plus 1 when another one is seen). None in CPU mode
        or when nothing could be asked."""
        if self.mode != "cuda" or (self.primary_context is None and self.other_contexts is None):
            return None
        return int(bool(self.primary_context)) + (self.other_contexts or 0)

    @property
    def unaccounted_bytes(self) -> Optional[int]:
        """This process's device memory (NVML) minus what the frameworks reserved: every
        CUDA context of the process, loaded modules, library workspaces and what engines
        allocate behind the frameworks' backs. None in CPU mode or when unknown."""
        reserved = self.frameworks_reserved_bytes
        if self.mode != "cuda" or self.process_bytes is None or reserved is None:
            return None
        return self.process_bytes - reserved

    @property
    def other_contexts_bytes(self) -> Optional[int]:
        """Device memory of the CUDA contexts that are not the primary one (those an
        engine such as OpenMM makes with ``cuCtxCreate``) and of what is allocated in
        them. 0 when no other context is seen; all of :attr:`unaccounted_bytes` when the
        primary context does not exist; None when both exist (NVML gives one figure per
        process: it cannot be split between contexts) or when unknown."""
        if self.mode != "cuda":
            return None
        if self.other_contexts == 0:
            return 0
        if self.other_contexts is None or self.primary_context is not False:
            return None
        return self.unaccounted_bytes

    @property
    def context_and_libraries_bytes(self) -> Optional[int]:
        """This process's device memory (NVML) minus what the frameworks reserved and
        what other contexts hold: the primary CUDA context, loaded modules and library
        workspaces. None in CPU mode or when a figure is unknown (also when the primary
        context and another one share the process's figure)."""
        unaccounted = self.unaccounted_bytes
        others = self.other_contexts_bytes
        if unaccounted is None or others is None:
            return None
        return unaccounted - others

    @property
    def other_processes_bytes(self) -> Optional[int]:
        """Device memory of the other processes; None when this process could not be
        told apart from them, or NVML does not say how much one of them uses."""
        if self.mode != "cuda":
            return 0
        if self.this_process.startswith("unknown"):
            return None
        return sum_known(p.used_bytes for p in self.other_processes)

    # ----------------------------------------------------------------- conversions

    def to_dict(self) -> Dict[str, Any]:
        """The report as JSON-ready builtins; derived figures included."""
        return {
            "mode": self.mode,
            "device": self.device,
            "name": self.name,
            "pid": self.pid,
            "timestamp": self.timestamp,
            "nvml": self.nvml,
            "memory_source": self.memory_source,
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
            "used_bytes": self.used_bytes,
            "frameworks": frameworks.memory_dict(self.frameworks),
            "frameworks_allocated_bytes": self.frameworks_allocated_bytes,
            "frameworks_reserved_bytes": self.frameworks_reserved_bytes,
            "peaks": dict(self.peaks),
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "process_bytes": self.process_bytes,
            "process_source": self.process_source,
            "context_and_libraries_bytes": self.context_and_libraries_bytes,
            "primary_context": self.primary_context,
            "other_contexts": self.other_contexts,
            "contexts_how": self.contexts_how,
            "cuda_contexts": self.cuda_contexts,
            "other_contexts_bytes": self.other_contexts_bytes,
            "unaccounted_bytes": self.unaccounted_bytes,
            "this_process": self.this_process,
            "other_processes": [
                {"pid": p.pid, "name": p.name, "used_bytes": p.used_bytes}
                for p in self.other_processes
            ],
            "other_processes_bytes": self.other_processes_bytes,
            "host": dict(self.host),
            "notes": list(self.notes),
            "detail": self.detail,
        }

    def to_json(self, indent: Optional[int] = 2) -> str:
        """``to_dict()`` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "MemoryReport":
        """Reads back ``to_dict()`` (or parsed ``to_json()``); derived keys are ignored.
        Keys added later (the contexts, ``peaks``, ``detail``) may be absent, as in older
        reports.

        Raises ``InvalidInputError`` naming the first missing key, or when ``data`` is
        not a dict.
        """
        if not isinstance(data, dict):
            raise InvalidInputError(
                f"MemoryReport.from_dict takes a dict, got {type(data).__name__}"
            )
        try:
            return cls._from_dict(data)
        except KeyError as exc:
            raise InvalidInputError(
                f"MemoryReport.from_dict: the report lacks the key {exc}"
            ) from None
        except (TypeError, AttributeError, ValueError) as exc:
            raise InvalidInputError(f"MemoryReport.from_dict: malformed report ({exc})") from None

    @classmethod
    def _from_dict(cls, data: Dict[str, Any]) -> "MemoryReport":
        return cls(
            mode=data["mode"],
            device=data["device"],
            name=data["name"],
            total_bytes=data["total_bytes"],
            free_bytes=data["free_bytes"],
            memory_source=data["memory_source"],
            frameworks={
                name: FrameworkMemory(name, m["allocated_bytes"], m["reserved_bytes"])
                for name, m in data["frameworks"].items()
            },
            process_bytes=data["process_bytes"],
            process_source=data["process_source"],
            this_process=data["this_process"],
            other_processes=[
                ProcessMemory(p["pid"], p["name"], p["used_bytes"]) for p in data["other_processes"]
            ],
            nvml=data["nvml"],
            host=dict(data["host"]),
            pid=data["pid"],
            notes=list(data["notes"]),
            timestamp=data["timestamp"],
            primary_context=data.get("primary_context"),
            other_contexts=data.get("other_contexts"),
            contexts_how=data.get("contexts_how", ""),
            peaks={name: int(b) for name, b in (data.get("peaks") or {}).items()},
            detail=data.get("detail", "full"),
        )

    def _table_parts(self) -> Tuple[str, List[Tuple[str, str, str]], List[str]]:
        """The title, the rows (label, allocated, reserved) and the lines under them:
        what ``table()`` writes as text and ``_repr_html_()`` as HTML."""
        if self.mode == "cpu":
            title = "gpukeeper memory report: CPU mode, host memory"
        else:
            title = f"gpukeeper memory report: CUDA device {self.device} ({self.name})"
        if self.detail == "device":
            rows = [("  (not read: detail='device')", "", "")]
        else:
            rows = framework_rows(self.frameworks, self.mode)
        allocated, reserved = self.frameworks_allocated_bytes, self.frameworks_reserved_bytes
        rows.append(
            (
                "frameworks",
                fmt_bytes(allocated, unknown="unknown"),
                fmt_bytes(reserved, unknown="unknown"),
            )
        )
        if self.peaks:
            rows.append(
                (
                    f"peak allocated ({', '.join(self.peaks)})",
                    fmt_bytes(self.peak_allocated_bytes, unknown="unknown"),
                    "",
                )
            )
        if self.mode == "cuda":
            if self.other_contexts and self.primary_context is not False:
                # Both exist: NVML's one figure per process cannot be split between them.
                rows.append(
                    (
                        "CUDA contexts + libraries + engines",
                        "",
                        fmt_bytes(self.unaccounted_bytes, unknown="unknown"),
                    )
                )
            else:
                rows.append(
                    (
                        "CUDA context + libraries",
                        "",
                        fmt_bytes(self.context_and_libraries_bytes, unknown="unknown"),
                    )
                )
            if self.other_contexts:
                rows.append(
                    (
                        "other contexts in this process",
                        "",
                        fmt_bytes(self.other_contexts_bytes, unknown="unknown"),
                    )
                )
            rows.append(
                (
                    f"this process (pid {self.pid}, NVML)",
                    "",
                    fmt_bytes(self.process_bytes, unknown="unknown"),
                )
            )
            others = f"other processes ({len(self.other_processes)})"
            rows.append((others, "", fmt_bytes(self.other_processes_bytes, unknown="unknown")))
            for p in self.other_processes:
                rows.append(
                    (
                        f"  pid {p.pid} {p.name or '?'}",
                        "",
                        fmt_bytes(p.used_bytes, unknown="unknown"),
                    )
                )
        else:
            rows.append(
                (
                    f"this process (pid {self.pid}, resident)",
                    "",
                    fmt_bytes(self.process_bytes, unknown="unknown"),
                )
            )
        whole = "used (whole device)" if self.mode == "cuda" else "used (whole host)"
        rows.append((whole, "", fmt_bytes(self.used_bytes, unknown="unknown")))
        rows.append(
            (
                "free" if self.mode == "cuda" else "available",
                "",
                fmt_bytes(self.free_bytes, unknown="unknown"),
            )
        )
        rows.append(("total", "", fmt_bytes(self.total_bytes, unknown="unknown")))
        lines = [f"NVML: {self.nvml}; free/total from {self.memory_source}"]
        if self.mode == "cuda":
            lines.append(f"this process in NVML's list: {self.this_process}")
            if self.cuda_contexts is not None:
                lines.append(
                    f"CUDA contexts of this process on the device: {self.cuda_contexts}"
                    f"{' or more' if not self.other_contexts else ''} ({self.contexts_how})"
                )
        lines += [f"note: {n}" for n in self.notes]
        return title, rows, lines

    def table(self) -> str:
        """A readable table: one row per holder, then used, free and total."""
        title, rows, footer = self._table_parts()
        return figure_table(title, ("allocated", "reserved"), rows, footer)

    def _repr_html_(self) -> str:
        """The same table as ``table()``, as compact HTML for Jupyter."""
        title, rows, footer = self._table_parts()
        # HTML collapses the leading spaces that indent a framework under "frameworks".
        cells = [("\u00a0\u00a0" + a[2:] if a.startswith("  ") else a, b, c) for a, b, c in rows]
        return html_table(title, ["", "allocated", "reserved"], cells, notes=footer)

    def __str__(self) -> str:
        return self.table()


def framework_rows(memory: Dict[str, FrameworkMemory], mode: str) -> List[Tuple[str, str, str]]:
    """The table rows (label, allocated, reserved) of each framework, indented under the
    "frameworks" row; one row saying so when none holds memory. ``mode`` ("cuda" or
    "cpu") names gpukeeper's pools: host pools stand for the device in CPU mode."""
    rows: List[Tuple[str, str, str]] = []
    for name, m in memory.items():
        label = name
        if name == "gpukeeper":
            label = "gpukeeper host pools" if mode == "cpu" else "gpukeeper pools"
        rows.append(
            (
                f"  {label}",
                fmt_bytes(m.allocated, unknown="unknown"),
                fmt_bytes(m.reserved, unknown="unknown"),
            )
        )
    if not memory:
        rows.append(("  (no framework holds memory)", "", ""))
    return rows

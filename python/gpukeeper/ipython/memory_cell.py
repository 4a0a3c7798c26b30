"""What ``%%gpu_memory`` shows: per framework and location, the memory before, at peak
and after a cell run inside a ``GPUContext``, and what the cell left behind.

Before and after come from the context's ``CleanupReport``; peaks from the frameworks'
resettable counters (``cleanup.measure.reset_peaks`` / ``peaks``: PyTorch's
``max_memory_allocated``, gpukeeper pools' ``peak_allocated_bytes``); a framework
without one (CuPy, JAX) shows "n/a". Leaks are the report's named tensors and arrays,
plus the gpukeeper ``ManagedBuffer``s that names bound in the cell still hold (the
report names tensors and arrays only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Set, Tuple

from gpukeeper.base.byte_figures import fmt_bytes
from gpukeeper.base.html_table import html_table
from gpukeeper.cleanup import CleanupReport
from gpukeeper.cleanup.cleanup_report import snapshot_pairs
from gpukeeper.cleanup.measure import HOST
from gpukeeper.pool.memory_pool import ManagedBuffer

__all__ = ["BufferWatch", "CellMemory"]

_HOST_KINDS = ("host", "pinned")

# location -> framework -> bytes
Figures = Dict[str, Dict[str, int]]


_MAX_ITEMS = 1000  # items of one list, tuple or dict looked at for buffers


def _items(name: str, value: Any) -> List[Tuple[str, Any]]:
    """``(label, item)`` for a list, tuple or dict bound to ``name`` (its first items)."""
    if isinstance(value, (list, tuple)):
        return [(f"{name}[{i}]", v) for i, v in enumerate(value[:_MAX_ITEMS])]
    if isinstance(value, dict):
        return [(f"{name}[{k!r}]", v) for k, v in list(value.items())[:_MAX_ITEMS]]
    return []


def _named_buffers(namespace: Dict[str, Any]) -> List[Tuple[str, ManagedBuffer]]:
    """The unreleased ManagedBuffers the notebook's names hold: a name bound to one, or
    an item of a list, tuple or dict bound to a name (IPython's ``_`` history names
    left out). A look at the namespace, not a walk of the heap: that costs seconds in a
    large kernel, and a leak a notebook shows is a name the user can ``del``."""
    found: List[Tuple[str, ManagedBuffer]] = []
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        for label, item in [(name, value)] + _items(name, value):
            if type(item) is ManagedBuffer and not item.released:
                found.append((label, item))
    return found


def _key(buf: ManagedBuffer) -> Tuple[int, int]:
    return id(buf), int(buf.ptr)


class BufferWatch:
    """Which ``ManagedBuffer``s the notebook's names held when the cell started, so that
    those the cell bound can be named at its end."""

    def __init__(self, namespace: Dict[str, Any]) -> None:
        self.namespace = namespace
        self.before: Set[Tuple[int, int]] = {_key(b) for _, b in _named_buffers(namespace)}

    def new_buffers(self, locations: Set[str]) -> List[str]:
        """One line per buffer bound in the cell and still alive at ``locations``,
        largest first: ``kept: gpukeeper ManagedBuffer (1048576,) fp32, 4.0 MiB on host``."""
        lines = []
        for label, buf in sorted(_named_buffers(self.namespace), key=lambda nb: -int(nb[1].nbytes)):
            loc = HOST if buf.kind in _HOST_KINDS else f"cuda:{buf.device}"
            if loc in locations and _key(buf) not in self.before:
                lines.append(
                    f"{label}: gpukeeper ManagedBuffer ({buf.size},) {buf.precision.label}, "
                    f"{fmt_bytes(int(buf.nbytes))} on {loc}"
                )
        return lines


_HEADER = ("where", "framework", "allocated before", "peak", "after", "reserved before", "after")


@dataclass
class CellMemory:
    """One ``%%gpu_memory`` cell: the context's report, the peaks, the buffers the cell
    left alive and how long it ran. Displays as a table (``table()``)."""

    report: CleanupReport
    peaks: Figures
    tolerance_bytes: int
    wall_s: float
    buffers: List[str] = field(default_factory=list)

    @property
    def leaked_bytes(self) -> int:
        """Bytes still allocated above the values before the cell, after cleanup."""
        return self.report.held_bytes

    @property
    def leaked(self) -> bool:
        """True when more than the tolerance is still held after the cell."""
        return self.leaked_bytes > self.tolerance_bytes

    def rows(self) -> List[Tuple[str, str, str, str, str, str, str]]:
        """(where, framework, allocated before, peak, after, reserved before, after)."""
        out = []
        for loc, name, b, a in snapshot_pairs(self.report.before, self.report.after):
            peak = self.peaks.get(loc, {}).get(name)
            out.append(
                (
                    loc,
                    name,
                    fmt_bytes(b.allocated) if b else "0 B",
                    fmt_bytes(peak) if peak is not None else "n/a",
                    fmt_bytes(a.allocated) if a else "-",
                    fmt_bytes(b.reserved) if b else "0 B",
                    fmt_bytes(a.reserved) if a else "-",
                )
            )
        return out

    def _head(self) -> str:
        head = f"gpu_memory: cell ran in {self.wall_s * 1e3:.1f} ms"
        if self.report.exc_type:
            head += f" and raised {self.report.exc_type}"
        return head

    def table(self) -> str:
        """The readable table: a row per framework and location, then the verdict."""
        lines = [self._head()]
        rows = self.rows()
        if rows:
            rows.insert(0, _HEADER)
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            lines += [
                "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows
            ]
        else:
            lines.append(
                "  no memory to watch (no framework holds device memory, no gpukeeper pool)"
            )
        lines.extend(self._verdict())
        lines += [f"  note: {n}" for n in self.report.notes]
        return "\n".join(lines)

    def _verdict(self) -> List[str]:
        if not self.report.leaked:
            return ["  no leak: everything the cell allocated was given back"]
        held = ", ".join(
            f"{name} {fmt_bytes(b)} on {loc}"
            for loc, per in self.report.held.items()
            for name, b in per.items()
        )
        word = "LEAK" if self.leaked else "within tolerance"
        lines = [
            f"  {word}: {fmt_bytes(self.leaked_bytes)} still held after the cell ({held}; "
            f"tolerance {fmt_bytes(self.tolerance_bytes)})"
        ]
        named = [leak.describe() for leak in self.report.leaks] + self.buffers
        lines += [f"    {text}" for text in named]
        if self.report.leaks_found > len(self.report.leaks):
            lines.append(f"    ... and {self.report.leaks_found - len(self.report.leaks)} more")
        if named:
            lines.append(
                "    (del the names that hold them, or call gpukeeper.cleanup_models(...))"
            )
        return lines

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.table())

    def _repr_html_(self) -> str:
        """The same table as HTML, as the other results show in a notebook: the rows, then
        the verdict (a leak in red) and the notes."""
        rows = self.rows()
        verdict = [line.strip() for line in self._verdict()]
        return html_table(
            self._head(),
            _HEADER if rows else None,
            rows,
            warnings=[v for v in verdict if v.startswith("LEAK")],
            notes=[v for v in verdict if not v.startswith("LEAK")] + list(self.report.notes),
        )

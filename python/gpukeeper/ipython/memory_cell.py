"""What ``%%gpu_memory`` shows: per framework and location, the memory before, at peak
and after a cell run inside a ``GPUContext``, and what the cell left behind.

Before and after come from the context's ``CleanupReport``; peaks from the frameworks'
resettable counters (``cleanup.measure.reset_peaks`` / ``peaks``: PyTorch's
``max_memory_allocated``, gpukeeper pools' ``peak_allocated_bytes``); a framework
without one (CuPy, JAX) shows "n/a". Leaks are the report's named tensors and arrays,
plus the gpukeeper ``ManagedBuffer``s made in the cell and still alive (the report
names tensors and arrays only).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any, Dict, List, Set, Tuple

from gpukeeper import frameworks
from gpukeeper.cleanup import CleanupReport
from gpukeeper.cleanup.measure import HOST
from gpukeeper.cleanup.report import fmt_bytes
from gpukeeper.memory import ManagedBuffer

__all__ = ["BufferWatch", "CellMemory"]

_HOST_KINDS = ("host", "pinned")

# location -> framework -> bytes
Figures = Dict[str, Dict[str, int]]


def _live_buffers() -> List[ManagedBuffer]:
    """Unreleased ManagedBuffers reachable from objects the collector tracks (buffers
    are not tracked themselves; a namespace, list or object holding one is)."""
    found: Dict[int, ManagedBuffer] = {}
    for obj in gc.get_referents(*gc.get_objects()):
        if type(obj) is ManagedBuffer and not obj.released:
            found[id(obj)] = obj
    return list(found.values())


def _key(buf: ManagedBuffer) -> Tuple[int, int]:
    return id(buf), int(buf.ptr)


class BufferWatch:
    """Which ``ManagedBuffer``s existed when the cell started, so that those alive at the
    end can be told apart. The heap is walked at the start only when gpukeeper's pools
    hold memory then (with none allocated, every live buffer at the end is new)."""

    def __init__(self) -> None:
        self.before: Set[Tuple[int, int]] = set()
        if any(_allocated(pool) for pool in frameworks.live_pools()):
            self.before = {_key(b) for b in _live_buffers()}

    def new_buffers(self, locations: Set[str]) -> List[str]:
        """One line per buffer made since the start and still alive at ``locations``,
        largest first."""
        lines = []
        for buf in sorted(_live_buffers(), key=lambda b: -int(b.nbytes)):
            loc = HOST if buf.kind in _HOST_KINDS else f"cuda:{buf.device}"
            if loc in locations and _key(buf) not in self.before:
                lines.append(f"gpukeeper ManagedBuffer ({buf.size},) {buf.precision.label}, "
                             f"{fmt_bytes(int(buf.nbytes))} on {loc}")
        return lines


def _allocated(pool: Any) -> int:
    total = 0
    for d in pool.devices():
        stats = pool.stats(d)
        total += stats.allocated_bytes if stats is not None else 0
    return total


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
        before, after = self.report.before, self.report.after
        out = []
        for loc in sorted(set(before) | set(after)):
            for name in sorted(set(before.get(loc, {})) | set(after.get(loc, {}))):
                b = before.get(loc, {}).get(name)
                a = after.get(loc, {}).get(name)
                peak = self.peaks.get(loc, {}).get(name)
                out.append((
                    loc, name,
                    fmt_bytes(b.allocated) if b else "0 B",
                    fmt_bytes(peak) if peak is not None else "n/a",
                    fmt_bytes(a.allocated) if a else "-",
                    fmt_bytes(b.reserved) if b else "0 B",
                    fmt_bytes(a.reserved) if a else "-",
                ))
        return out

    def table(self) -> str:
        """The readable table: a row per framework and location, then the verdict."""
        head = f"gpu_memory: cell ran in {self.wall_s * 1e3:.1f} ms"
        if self.report.exc_type:
            head += f" and raised {self.report.exc_type}"
        lines = [head]
        rows = self.rows()
        if rows:
            rows.insert(0, ("where", "framework", "allocated before", "peak", "after",
                            "reserved before", "after"))
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        else:
            lines.append("  no memory to watch (no framework holds device memory, no gpukeeper pool)")
        lines.extend(self._verdict())
        lines += [f"  note: {n}" for n in self.report.notes]
        return "\n".join(lines)

    def _verdict(self) -> List[str]:
        if not self.report.leaked:
            return ["  no leak: everything the cell allocated was given back"]
        held = ", ".join(f"{name} {fmt_bytes(b)} on {loc}"
                         for loc, per in self.report.held.items() for name, b in per.items())
        word = "LEAK" if self.leaked else "within tolerance"
        lines = [f"  {word}: {fmt_bytes(self.leaked_bytes)} still held after the cell ({held}; "
                 f"tolerance {fmt_bytes(self.tolerance_bytes)})"]
        named = [leak.describe() for leak in self.report.leaks] + self.buffers
        lines += [f"    {text}" for text in named]
        if self.report.leaks_found > len(self.report.leaks):
            lines.append(f"    ... and {self.report.leaks_found - len(self.report.leaks)} more")
        if named:
            lines.append("    (del the names that hold them, or call gpukeeper.cleanup_models(...))")
        return lines

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.table())

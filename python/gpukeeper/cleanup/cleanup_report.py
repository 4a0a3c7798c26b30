"""What a cleanup did and what it could not give back: ``CleanupReport``, the
``LeakedArray`` entries that name what is still held, and the text made of them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from gpukeeper import frameworks
from gpukeeper.base.byte_figures import fmt_bytes
from gpukeeper.base.html_table import html_table
from gpukeeper.frameworks import FrameworkMemory
from gpukeeper.frameworks.adapter import ArrayDescription

# location ("cuda:0", "host") -> framework name -> its memory
Snapshot = Dict[str, Dict[str, FrameworkMemory]]


def snapshot_pairs(
    before: Snapshot, after: Snapshot
) -> Iterator[Tuple[str, str, Optional[FrameworkMemory], Optional[FrameworkMemory]]]:
    """(location, framework, its memory before, after) for each framework seen at each
    location in either snapshot, sorted; None where it was not there."""
    for loc in sorted(set(before) | set(after)):
        then, now = before.get(loc, {}), after.get(loc, {})
        for name in sorted(set(then) | set(now)):
            yield loc, name, then.get(name), now.get(name)


@dataclass(frozen=True)
class LeakedArray(ArrayDescription):
    """A live tensor or array still holding memory after cleanup.

    ``inside``: True when it was created inside the context (known from the allocation
    tracker, or because the framework held nothing on entry), False when the tracker did
    not see it being made (so it most likely predates the context), None when unknown.
    ``created_at``: the creating lines, innermost first, as ``"file:line in function"``
    (only with ``track_allocations=True``). ``grad_fn``: the tensor carries an autograd
    graph, which keeps the tensors saved for its backward alive too.
    """

    inside: Optional[bool] = None
    created_at: Tuple[str, ...] = ()
    grad_fn: bool = False  # a result of autograd: its graph (and what it saved) lives on

    def _shape(self) -> str:
        return (
            "("
            + ", ".join(str(s) for s in self.shape)
            + ("," if len(self.shape) == 1 else "")
            + ")"
        )

    def describe(self) -> str:
        """One line: ``torch Tensor (64, 128) float32, 32.0 KiB on cuda:0, created at ...``."""
        text = (
            f"{self.framework} {self.kind} {self._shape()} {self.dtype}, "
            f"{fmt_bytes(self.nbytes)} on {self.device}"
        )
        if self.created_at:
            text += f", created at {self.created_at[0]}"
            if len(self.created_at) > 1:
                text += " (called from " + "; ".join(self.created_at[1:]) + ")"
        elif self.inside is False:
            text += " (made before the context, or where the tracker could not see)"
        return text

    def cells(self) -> Tuple[str, str, str, str, str, str]:
        """The entry as table cells: what (framework and kind), shape, dtype, size,
        location and the creating line ("" when unknown; "before the context?" when the
        tracker did not see it made)."""
        if self.created_at:
            where = self.created_at[0]
        else:
            where = "before the context?" if self.inside is False else ""
        return (
            f"{self.framework} {self.kind}",
            self._shape(),
            self.dtype,
            fmt_bytes(self.nbytes),
            self.device,
            where,
        )


@dataclass
class CleanupReport:
    """What a cleanup did and what it could not give back.

    ``before``/``after``: per location (``"cuda:0"``, ``"host"`` for gpukeeper's host and
    pinned pools) and framework, the allocated and reserved bytes on entry (or when
    ``cleanup_cuda`` was called) and after cleanup. ``released``: bytes each framework's
    cache gave back to the driver. ``held``: per location and framework, the bytes still
    allocated above the baseline after cleanup (above zero for ``cleanup_cuda`` and the
    exit guard); ``leaks``: the live objects that hold them, largest first (at most
    ``max_listed``; ``leaks_found`` counts all). ``gc_runs``/``gc_objects``: collections
    run and unreachable objects they found (0 on the fast path). ``deferred``: objects
    still holding memory at a ``GPUContext`` exit that were armed to release the caches
    when they die (0 when nothing was held; see ``GPUContext``). ``rank``/``world_size``:
    this process's place under torch.distributed (or a launcher such as torchrun), None
    outside one; the text then starts with "rank R of W", as the ranks share a terminal.
    """

    source: str
    devices: List[int]
    before: Snapshot
    after: Snapshot
    released: Dict[str, int]
    held: Dict[str, Dict[str, int]]
    leaks: List[LeakedArray]
    leaks_found: int
    gc_runs: int
    gc_objects: int
    synchronized: bool
    duration_s: float
    exc_type: Optional[str] = None
    notes: List[str] = field(default_factory=list)
    deferred: int = 0
    rank: Optional[int] = None
    world_size: Optional[int] = None

    @property
    def held_bytes(self) -> int:
        """Bytes still allocated above the baseline, all locations and frameworks."""
        return sum(sum(per.values()) for per in self.held.values())

    @property
    def released_bytes(self) -> int:
        """Bytes the frameworks' caches gave back, in total."""
        return sum(self.released.values())

    @property
    def unreturnable(self) -> Dict[str, Dict[str, int]]:
        """Per location and framework, the bytes a framework still reserves beyond what
        its live arrays use after cleanup, when gpukeeper cannot make it give them back
        (JAX's allocator keeps its pool for the life of the process). Not a leak: the
        memory is free for that framework, and for no one else."""
        out: Dict[str, Dict[str, int]] = {}
        for loc, per in self.after.items():
            for name, mem in per.items():
                if mem.reserved is None or frameworks.release_hint(name) is None:
                    continue
                kept = mem.reserved - (mem.allocated or 0)
                if kept > 0:
                    out.setdefault(loc, {})[name] = kept
        return out

    def release_hints(self) -> Dict[str, str]:
        """For each framework in :attr:`unreturnable`, how to make its memory returnable."""
        names = {name for per in self.unreturnable.values() for name in per}
        return {name: frameworks.release_hint(name) or "" for name in sorted(names)}

    def _unreturnable_text(self) -> str:
        parts = [
            f"{name} keeps {fmt_bytes(b)} reserved on {loc} that it never gives back"
            for loc, per in self.unreturnable.items()
            for name, b in per.items()
        ]
        return "; ".join(parts)

    @property
    def leaked(self) -> bool:
        """True when anything is still held above the baseline."""
        return self.held_bytes > 0

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready: plain dicts, lists, numbers and strings."""

        def snap(s: Snapshot) -> Dict[str, Any]:
            return {
                loc: {n: dataclasses.asdict(m) for n, m in fws.items()} for loc, fws in s.items()
            }

        return {
            "source": self.source,
            "devices": list(self.devices),
            "before": snap(self.before),
            "after": snap(self.after),
            "released": dict(self.released),
            "released_bytes": self.released_bytes,
            "held": {loc: dict(per) for loc, per in self.held.items()},
            "held_bytes": self.held_bytes,
            "leaks": [
                {**dataclasses.asdict(a), "shape": list(a.shape), "created_at": list(a.created_at)}
                for a in self.leaks
            ],
            "leaks_found": self.leaks_found,
            "gc_runs": self.gc_runs,
            "gc_objects": self.gc_objects,
            "synchronized": self.synchronized,
            "duration_s": self.duration_s,
            "exc_type": self.exc_type,
            "notes": list(self.notes),
            "unreturnable": {loc: dict(per) for loc, per in self.unreturnable.items()},
            "release_hints": self.release_hints(),
            "deferred": self.deferred,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def summary(self) -> str:
        """One line: what is still held, or that nothing is."""
        kept = self._unreturnable_text()
        if kept:
            kept = f"; {kept} ({'; '.join(self.release_hints().values())})"
        source = (
            self.source
            if self.rank is None
            else f"rank {self.rank} of {self.world_size}: {self.source}"
        )
        if not self.leaked:
            return f"{source}: nothing held above the baseline{kept}"
        parts = [
            f"{name} {fmt_bytes(b)} on {loc}"
            for loc, per in self.held.items()
            for name, b in per.items()
        ]
        return (
            f"{source}: {fmt_bytes(self.held_bytes)} still held after cleanup "
            f"({', '.join(parts)}){kept}"
        )

    def _memory_rows(self) -> List[Tuple[str, str, str, str, str, str]]:
        """(location, framework, allocated before, after, reserved before, after) as text,
        for each framework seen at each location ("-" where it was not there)."""
        return [
            (
                loc,
                name,
                fmt_bytes(b.allocated) if b else "-",
                fmt_bytes(a.allocated) if a else "-",
                fmt_bytes(b.reserved) if b else "-",
                fmt_bytes(a.reserved) if a else "-",
            )
            for loc, name, b, a in snapshot_pairs(self.before, self.after)
        ]

    def _head(self) -> str:
        head = f"{self.source} cleanup in {self.duration_s * 1e3:.2f} ms"
        if self.exc_type:
            head += f" (the block raised {self.exc_type})"
        return head

    def _released_text(self) -> str:
        released = {k: v for k, v in self.released.items() if v}
        return "released: " + (
            ", ".join(f"{k} {fmt_bytes(v)}" for k, v in released.items())
            if released
            else "nothing cached"
        )

    def cause_lines(self) -> List[str]:
        """The causes the held memory points to: an autograd graph kept with a result,
        memory outside every framework (an engine's or an extension's)."""
        lines = []
        graphs = sum(1 for a in self.leaks if a.grad_fn)
        if graphs:
            lines.append(
                f"{graphs} of the tensors still held carry a grad_fn: an autograd graph survives "
                "with them, and the tensors it saved for backward hold memory no list shows; a "
                "result kept without .detach() is the usual cause"
            )
        outside = sum(per.get(frameworks.OUTSIDE, 0) for per in self.held.values())
        if outside:
            lines.append(
                f"{fmt_bytes(outside)} outside every framework (NVML's figure for this process "
                "less the frameworks' reserved bytes): an engine or an extension in this process "
                "allocates it (its own CUDA context, or cudaMalloc past the frameworks' "
                "allocators)"
            )
        return lines

    def _trailing_lines(self) -> List[str]:
        """What the leaks list leaves out: how many more, or that no visible object
        holds the memory; and the causes it points to."""
        lines = []
        if self.leaks_found > len(self.leaks):
            lines.append(f"... and {self.leaks_found - len(self.leaks)} more")
        in_frameworks = any(n != frameworks.OUTSIDE for per in self.held.values() for n in per)
        if in_frameworks and self.leaks_found == 0:
            lines.append(
                "(no live tensor or array visible to Python holds it: autograd graphs, "
                "C++ caches or objects of another library)"
            )
        return lines + self.cause_lines()

    def table(self) -> str:
        """A readable multi-line table."""
        lines = [self._head()]
        rows = [("where", "framework", "allocated before", "after", "reserved before", "after")]
        rows += self._memory_rows()
        if len(rows) == 1:
            lines.append("  no device memory to watch (no framework holds a CUDA context)")
        else:
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            for r in rows:
                lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        lines.append("  " + self._released_text())
        if self.gc_runs:
            lines.append(
                f"  garbage collection: {self.gc_runs} run(s), "
                f"{self.gc_objects} unreachable objects"
            )
        lines.append("  " + self.summary())
        for leak in self.leaks:
            lines.append("    " + leak.describe())
        lines += ["    " + line for line in self._trailing_lines()]
        for note in self.notes:
            lines.append("  note: " + note)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """The table as compact HTML for Jupyter: memory per location and framework
        (before, after, held), then the leaks that hold it, then the notes."""
        rows = []
        for cells in self._memory_rows():
            held = self.held.get(cells[0], {}).get(cells[1])
            rows.append(cells + (fmt_bytes(held) if held else "-",))
        header = [
            "where",
            "framework",
            "allocated before",
            "allocated after",
            "reserved before",
            "reserved after",
            "held",
        ]
        notes = [self._released_text()]
        if self.gc_runs:
            notes.append(
                f"garbage collection: {self.gc_runs} run(s), {self.gc_objects} unreachable objects"
            )
        if not rows:
            notes.insert(0, "no device memory to watch (no framework holds a CUDA context)")
        summary = self.summary()
        if not self.leaked:
            notes.append(summary)
        if not self.leaks:
            notes += self._trailing_lines()
        notes += [f"note: {n}" for n in self.notes]
        out = html_table(
            self._head(), header, rows, warnings=[summary] if self.leaked else [], notes=notes
        )
        if self.leaks:
            out += html_table(
                None,
                ["leaked", "shape", "dtype", "bytes", "on", "created at"],
                [leak.cells() for leak in self.leaks],
                notes=self._trailing_lines(),
            )
        return out

    __str__ = table


def leak_message(report: CleanupReport, tracking: bool, hint: Optional[str] = None) -> str:
    lines = [report.summary()]
    shown = report.leaks[:5]
    for leak in shown:
        lines.append("  " + leak.describe())
    if report.leaks_found > len(shown):
        lines.append(f"  ... and {report.leaks_found - len(shown)} more (see the report)")
    lines += ["  " + line for line in report.cause_lines()]
    hints = hint or (
        "del the names bound in the block, build the model inside a function, "
        "or call cleanup_models()"
    )
    if not tracking and report.leaks and hint is None:
        hints += "; GPUContext(track_allocations=True) names the creating lines"
    lines.append(f"  ({hints})")
    return "\n".join(lines)

"""``--gpu-memory``: each test's peak memory and GPU time, and the table of them.

Per test: the allocated bytes on entry and at the peak, summed over every framework and
device in use and gpukeeper's pools (host pools included). The peak is exact where the
framework keeps a resettable one (PyTorch, gpukeeper's pools; their peaks are reset at the
start of each test, so a test that reads ``torch.cuda.max_memory_allocated()`` itself sees
that reset). CuPy and JAX keep none: for them the larger of the levels on entry and at
the end stands in, and the row is marked ``>=``. The time is a ``CUDATimer`` around the
test's call on the current stream: the stream's elapsed time between two events, idle
gaps included, and the host clock where no framework uses CUDA.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from gpukeeper.base.byte_figures import fmt_bytes
from gpukeeper.cleanup.cleanup_report import Snapshot
from gpukeeper.cleanup.measure import devices_in_use, level_of, measure, peaks, reset_peaks
from gpukeeper.timing.timer import CUDATimer, timing_device

__all__ = ["MemoryRow", "RegionProbe", "format_rows"]


@dataclass(frozen=True)
class MemoryRow:
    """One test's figures: bytes allocated on entry and at the peak, whether that peak is
    exact, and the call's time (ms) with its source (``"torch"``, ``"cupy"``, ``"cpu"``)."""

    nodeid: str
    start_bytes: int
    peak_bytes: int
    peak_exact: bool
    time_ms: float
    timer: str

    @property
    def added_bytes(self) -> int:
        """What the test itself took at its peak, above what was allocated on entry."""
        return max(0, self.peak_bytes - self.start_bytes)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _total(snapshot: Snapshot) -> int:
    return sum(level_of(mem) or 0 for per in snapshot.values() for mem in per.values())


def _peak_total(
    start: Snapshot, end: Snapshot, found: Dict[str, Dict[str, int]]
) -> "tuple[int, bool]":
    """(sum over locations and frameworks of each peak, whether every one was exact)."""
    total, exact = 0, True
    for loc in set(start) | set(end) | set(found):
        names = set(start.get(loc, {})) | set(end.get(loc, {})) | set(found.get(loc, {}))
        for name in names:
            peak = found.get(loc, {}).get(name)
            if peak is None:
                exact = False
                peak = max(
                    level_of(start.get(loc, {}).get(name)) or 0,
                    level_of(end.get(loc, {}).get(name)) or 0,
                )
            total += peak
    return total, exact


class RegionProbe:
    """Peak memory and time of one region (a test's call); one per session, reused.

    The timer of each timing device is made once: its events are reused by every test.
    """

    def __init__(self) -> None:
        self._timers: Dict[Any, CUDATimer] = {}
        self._timer: Optional[CUDATimer] = None
        self._devices: List[int] = []
        self._start: Snapshot = {}

    def start(self) -> None:
        """Resets the peaks and starts the clock."""
        self._devices = devices_in_use(None)
        self._start = measure(self._devices)
        reset_peaks(self._devices)
        spec = timing_device(None)
        timer = self._timers.get(spec)
        if timer is None:
            timer = self._timers[spec] = CUDATimer("gpukeeper --gpu-memory", device=spec)
        self._timer = timer.start()

    def finish(self, nodeid: str) -> MemoryRow:
        """Stops the clock (waiting for the stream) and reads the peaks."""
        timer, self._timer = self._timer, None
        elapsed = 0.0
        if timer is not None:
            timer.stop()
            elapsed = timer.elapsed_ms
        devices = sorted(set(self._devices) | set(devices_in_use(None)))
        end = measure(devices)
        peak, exact = _peak_total(self._start, end, peaks(devices))
        start = _total(self._start)
        return MemoryRow(
            nodeid,
            start,
            max(peak, start),
            exact,
            elapsed,
            timer.backend if timer is not None else "cpu",
        )


def format_rows(rows: List[MemoryRow], limit: int) -> List[str]:
    """The table's lines, worst first (most memory taken above the entry level, then
    the longest): at most ``limit`` rows (0: all)."""
    ordered = sorted(rows, key=lambda r: (-r.added_bytes, -r.peak_bytes, -r.time_ms))
    shown = ordered[:limit] if limit else ordered
    width = max([len(r.nodeid) for r in shown] + [4])
    lines = [f"{'test':<{width}}  {'peak':>12}  {'added':>12}  {'time ms':>10}  timer"]
    for r in shown:
        mark = "" if r.peak_exact else ">="
        lines.append(
            f"{r.nodeid:<{width}}  {mark + fmt_bytes(r.peak_bytes):>12}  "
            f"{fmt_bytes(r.added_bytes):>12}  {r.time_ms:>10.3f}  {r.timer}"
        )
    if len(ordered) > len(shown):
        lines.append(f"... and {len(ordered) - len(shown)} more (--gpu-memory=0 shows all)")
    return lines

"""``LeakCheck``: the per-test leak check, as light as a counter read when nothing is held.

A ``GPUContext`` always synchronizes and releases the caches at exit: that is what it is
for, and it costs a few hundred microseconds with CUDA. A check run around every test of
a suite must cost almost nothing when the test gave everything back, so ``LeakCheck``
reads each framework's allocated-bytes counters before and after, and NVML's figure for
the process on each device a framework uses (the memory outside every framework: an
engine's or an extension's ``cudaMalloc``), and stops there when none is above its
baseline (beyond the tolerance). Those counters are kept on the host
and move when a tensor is freed, queued work or not, so no synchronize is needed to read
them. Only when memory is held does it run the full cleanup (synchronize, release,
collect garbage, measure again) against the same baseline, which tells a real leak from
garbage in a reference cycle or a cuBLAS workspace, and names what is held.

A limit: the baseline is taken without a garbage collection (it would cost every test
milliseconds). Garbage that predates the region and is collected by the full cleanup
lowers the level after it, and can offset a leak of the same size or smaller.
"""

from __future__ import annotations

import time
from typing import List, Optional

from gpukeeper.base.arg_checks import check_bool, check_int
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.cleanup.cleanup_report import CleanupReport, Snapshot
from gpukeeper.cleanup.measure import devices_in_use, held_above, measure
from gpukeeper.cleanup.run import run_cleanup
from gpukeeper.cleanup.tracking import AllocationTracker

__all__ = ["LeakCheck"]


class LeakCheck:
    """Counts what a region leaves allocated, every device in use and gpukeeper's pools.

    ``start()`` takes the baseline (and starts the allocation tracker with
    ``track_allocations``); ``finish()`` returns None when no more than
    ``tolerance_bytes`` are allocated above it, else the ``CleanupReport`` of the full
    cleanup run to make sure (its ``held_bytes`` may then be within the tolerance: the
    memory was garbage or a cache). Nothing is synchronized or released on the light path.
    """

    def __init__(
        self, tolerance_bytes: int = 0, *, track_allocations: bool = False, max_listed: int = 20
    ) -> None:
        check_int(tolerance_bytes, "LeakCheck: tolerance_bytes", 0)
        check_bool(track_allocations, "LeakCheck: track_allocations")
        self.tolerance_bytes = tolerance_bytes
        self.track_allocations = track_allocations
        self.max_listed = max_listed
        self._devices: List[int] = []
        self._baseline: Optional[Snapshot] = None
        self._tracker: Optional[AllocationTracker] = None

    def start(self) -> None:
        """Takes the baseline: one counter read per framework and device in use."""
        self._devices = devices_in_use(None)
        self._baseline = measure(self._devices, outside=True)
        if self.track_allocations:
            self._tracker = AllocationTracker(4)
            self._tracker.start()

    def stop_tracking(self) -> None:
        """Stops the allocation tracker (if any) without checking: for a region that failed."""
        if self._tracker is not None:
            self._tracker.stop()

    def finish(self) -> Optional[CleanupReport]:
        """None when the region left at most ``tolerance_bytes`` allocated; else the
        report of the full cleanup against the same baseline."""
        if self._baseline is None:
            raise InvalidInputError("LeakCheck.finish() without start()")
        baseline, self._baseline = self._baseline, None
        self.stop_tracking()
        devices = sorted(set(self._devices) | set(devices_in_use(None)))
        held = held_above(baseline, measure(devices, outside=True))
        if sum(n for per in held.values() for n in per.values()) <= self.tolerance_bytes:
            return None
        report, error = run_cleanup(
            "LeakCheck",
            fixed=None,
            devices=devices,
            before=baseline,
            baseline=baseline,
            started=time.perf_counter(),
            collect=None,
            find_leaks=True,
            max_listed=self.max_listed,
            tracker=self._tracker,
            outside=True,
        )
        if error is not None:
            report.notes.append(f"cleanup failed: {type(error).__name__}: {error}")
        return report

"""The cleanup itself, shared by ``GPUContext``, ``cleanup_cuda`` and the exit guard:
synchronize, release, measure; collect and repeat only while memory is held."""

from __future__ import annotations

import gc
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpukeeper.base.process_life import device_stuck
from gpukeeper.cleanup.cleanup_report import CleanupReport, LeakedArray, Snapshot
from gpukeeper.cleanup.measure import (
    devices_in_use,
    held_above,
    measure,
    outside_notes,
    release_caches,
    synchronize_devices,
)
from gpukeeper.cleanup.tracking import AllocationTracker, name_leaks
from gpukeeper.frameworks.ranks import current_rank


def cleanup_from_now(
    source: str, fixed: Optional[List[int]], **options: Any
) -> Tuple[CleanupReport, Optional[BaseException]]:
    """:func:`run_cleanup` of what is held now, against no baseline: the devices in use
    (``fixed``, or every one when None) measured first, as ``cleanup_cuda`` and the exit
    guard ask for it. ``options``: the rest of ``run_cleanup``'s (``collect``,
    ``find_leaks``, ``max_listed``, ``sync``)."""
    started = time.perf_counter()
    devices = devices_in_use(fixed)
    before = measure(devices)
    return run_cleanup(
        source,
        fixed=fixed,
        devices=devices,
        before=before,
        baseline=None,
        started=started,
        **options,
    )


def run_cleanup(
    source: str,
    *,
    fixed: Optional[List[int]],
    devices: List[int],
    before: Snapshot,
    baseline: Optional[Snapshot],
    started: float,
    collect: Optional[bool],
    find_leaks: bool,
    max_listed: int,
    tracker: Optional[AllocationTracker] = None,
    exc_type: Optional[str] = None,
    sync: Optional[Callable[[], bool]] = None,
    outside: bool = False,
) -> Tuple[CleanupReport, Optional[BaseException]]:
    """Synchronize, release, measure; collect and repeat only while memory is held.
    ``outside``: measure the memory outside every framework too (the baseline did).

    Returns the report and the first error a framework raised (the caller decides whether
    to raise it: never over an exception already propagating from the block).
    """
    notes: List[str] = []
    released: Dict[str, int] = {}
    now_devices = devices_in_use(fixed)
    devices = sorted(set(devices) | set(now_devices))

    synchronized, error = _synchronize(fixed, now_devices, sync, notes)
    can_release = synchronized  # releasing after a failed or timed-out sync would block or fail

    def release_and_measure() -> Snapshot:
        nonlocal error
        after, error = _release_and_measure(
            can_release, fixed, now_devices, devices, released, notes, error, outside
        )
        return after

    after = release_and_measure()
    held = held_above(baseline, after)
    after, held, gc_runs, gc_objects = _collect_while_held(
        collect, baseline, after, held, release_and_measure
    )
    if outside:
        notes += outside_notes(baseline, after)
    leaks: List[LeakedArray] = []
    found = 0
    if held and find_leaks:
        leaks, found = name_leaks(held, baseline, tracker, max_listed)
    report = CleanupReport(
        source=source,
        devices=devices,
        before=before,
        after=after,
        released=released,
        held=held,
        leaks=leaks,
        leaks_found=found,
        gc_runs=gc_runs,
        gc_objects=gc_objects,
        synchronized=synchronized,
        duration_s=time.perf_counter() - started,
        exc_type=exc_type,
        notes=notes,
    )
    info = current_rank()
    if info is not None:
        report.rank, report.world_size = info.rank, info.world_size
    return report, error


def _synchronize(
    fixed: Optional[List[int]],
    now_devices: List[int],
    sync: Optional[Callable[[], bool]],
    notes: List[str],
) -> Tuple[bool, Optional[BaseException]]:
    """(synchronized, the error synchronizing raised)."""
    if device_stuck():
        notes.append(
            "an earlier synchronization timed out and has not finished: the device is presumed "
            "hung, so nothing was synchronized or released (either would block)"
        )
        return False, None
    synchronized = False
    try:
        if sync is not None:
            synchronized = sync()
            if not synchronized:
                notes.append("synchronization timed out: caches not released (it would block)")
        else:
            synchronize_devices(fixed, now_devices)
            synchronized = True
    except Exception as e:  # a sticky CUDA error from the block's work, typically
        notes.append(f"synchronize failed: {type(e).__name__}: {e}")
        return synchronized, e
    return synchronized, None


def _release_and_measure(
    can_release: bool,
    fixed: Optional[List[int]],
    now_devices: List[int],
    devices: List[int],
    released: Dict[str, int],
    notes: List[str],
    error: Optional[BaseException],
    outside: bool,
) -> Tuple[Snapshot, Optional[BaseException]]:
    """(the snapshot after releasing, the first error so far)."""
    if can_release:
        try:
            release_caches(fixed, now_devices, released)
        except Exception as e:
            if error is None:
                error = e
            notes.append(f"release failed: {type(e).__name__}: {e}")
    return measure(devices, outside), error


def _collect_while_held(
    collect: Optional[bool],
    baseline: Optional[Snapshot],
    after: Snapshot,
    held: Dict[str, Dict[str, int]],
    release_and_measure: Callable[[], Snapshot],
) -> Tuple[Snapshot, Dict[str, Dict[str, int]], int, int]:
    """(after, held, gc runs, objects collected) once garbage collection is done."""
    gc_runs = gc_objects = 0
    if collect is True or (collect is None and held):
        # Young generations first: a cycle made inside a short block is usually still
        # there, and collecting them costs microseconds instead of a full collection's
        # tens of milliseconds.
        for generation in (1, 2) if collect is None else (2,):
            gc_objects += gc.collect(generation)
            gc_runs += 1
            after = release_and_measure()
            held = held_above(baseline, after)
            if not held:
                break
    return after, held, gc_runs, gc_objects

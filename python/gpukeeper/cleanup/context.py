"""``GPUContext``, which returns a block's GPU memory on exit, and ``cleanup_cuda``."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, List, Optional

from gpukeeper.cleanup.measure import _active, _measure
from gpukeeper.cleanup.report import CleanupReport, Snapshot, _leak_message
from gpukeeper.cleanup.run import _run_cleanup
from gpukeeper.cleanup.tracking import _AllocationTracker
from gpukeeper.errors import InvalidInputError, LeakWarning, MemoryLeakError


def _parse_device(device: Any) -> Optional[List[int]]:
    """None (every device in use) or the list of named CUDA ordinals ([] for the CPU)."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise InvalidInputError(f"GPUContext: device must be an int, a str or a torch.device, got {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise InvalidInputError(f"GPUContext: device must not be negative, got {device}")
        return [device]
    kind: Optional[str] = None
    index: Optional[int] = None
    if isinstance(device, str):
        text = device.strip().lower()
        kind, _, rest = text.partition(":")
        if rest:
            if not rest.isdigit():
                raise InvalidInputError(f"GPUContext: cannot read device {device!r}")
            index = int(rest)
    elif hasattr(device, "type") and hasattr(device, "index"):  # torch.device and alikes
        kind, index = str(device.type), device.index
    else:
        raise InvalidInputError(
            f"GPUContext: device must be an int, a str or a torch.device, got {type(device).__name__}"
        )
    if kind == "cpu":
        return []
    if kind != "cuda":
        raise InvalidInputError(f"GPUContext: device {device!r} is neither a CUDA device nor the CPU")
    if index is None:
        torch = sys.modules.get("torch")
        try:
            initialized = torch is not None and torch.cuda.is_initialized()
            index = int(torch.cuda.current_device()) if initialized else 0
        except Exception:
            index = 0
    return [index]


@dataclass
class _Frame:
    devices: List[int]
    baseline: Snapshot
    started: float
    tracker: Optional[_AllocationTracker]


class GPUContext(contextlib.ContextDecorator):
    """Returns a block's GPU memory on exit and says what could not be returned.

    ``device``: None (every device the process uses, including those first used inside
    the block), a CUDA ordinal, ``"cuda:N"``, a ``torch.device``, or the CPU (then only
    gpukeeper's host pools are watched). On entry a baseline is taken per framework and
    device; on exit (normal, exception, KeyboardInterrupt) the context synchronizes,
    releases every framework's cache and leaves ``ctx.report`` (a ``CleanupReport``).

    Options:
      ``warn_on_leak``: warn (``LeakWarning``) when more than ``tolerance_bytes`` are
      still allocated above the baseline after cleanup; ``raise_on_leak``: raise
      ``MemoryLeakError`` instead (only when the block itself did not raise: its exception
      is never replaced; the leak is then a warning). ``track_allocations``: record where
      each tensor/array is created (a TorchDispatchMode and a CuPy memory hook; costs
      microseconds per op), so that leaks name their creating line. ``collect``: None
      runs the garbage collector only when memory is still held after the cheap steps,
      True always, False never. ``max_listed``: leaks named at most. ``stack_depth``:
      user frames kept per creation site. ``keep_traceback_locals``: when the block
      raises, the exception's traceback holds the locals of the functions that raised
      (often the tensors of a failed step), which would stay allocated until the
      exception is dropped, after this context's cleanup; by default those frames are
      cleared (``traceback.clear_frames``; the block's own frame and the exception are
      kept), True keeps them for post-mortem debugging.

    Contexts nest (each keeps its own baseline; one instance may be re-entered) and work
    as decorators. A block's names outlive it: ``del`` them, or build inside a function.

    What is "held" is the net change of each framework's allocated bytes on each device:
    memory allocated before the context and freed inside it offsets memory leaked inside
    it. ``report.duration_s`` is the time the exit took. Tracking is per thread (the
    thread that entered, and autograd's), sees only frameworks imported before entry and
    may not mix with ``torch.compile`` or other dispatch modes entered inside the block.
    """

    def __init__(
        self,
        device: Any = None,
        *,
        warn_on_leak: bool = True,
        raise_on_leak: bool = False,
        tolerance_bytes: int = 1 << 20,
        track_allocations: bool = False,
        collect: Optional[bool] = None,
        max_listed: int = 20,
        stack_depth: int = 4,
        keep_traceback_locals: bool = False,
    ) -> None:
        self._fixed = _parse_device(device)
        if isinstance(tolerance_bytes, bool) or not isinstance(tolerance_bytes, int) or tolerance_bytes < 0:
            raise InvalidInputError(f"GPUContext: tolerance_bytes must be an int >= 0, got {tolerance_bytes!r}")
        if collect not in (None, True, False):
            raise InvalidInputError(f"GPUContext: collect must be None, True or False, got {collect!r}")
        for name, value in (("max_listed", max_listed), ("stack_depth", stack_depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInputError(f"GPUContext: {name} must be an int >= 0, got {value!r}")
        self.device = device
        self.warn_on_leak = bool(warn_on_leak)
        self.raise_on_leak = bool(raise_on_leak)
        self.tolerance_bytes = tolerance_bytes
        self.track_allocations = bool(track_allocations)
        self.collect = collect
        self.max_listed = max_listed
        self.stack_depth = stack_depth
        self.keep_traceback_locals = bool(keep_traceback_locals)
        self.report: Optional[CleanupReport] = None
        # Entered frames per thread: one instance may be re-entered (nested, or used as a
        # decorator on a recursive function) and each exit must find its own baseline.
        self._local = threading.local()

    def __enter__(self) -> "GPUContext":
        started = time.perf_counter()
        devices = _active(self._fixed)
        baseline = _measure(devices)
        tracker = None
        if self.track_allocations:
            tracker = _AllocationTracker(self.stack_depth)
            tracker.start()
        frames = getattr(self._local, "frames", None)
        if frames is None:
            frames = self._local.frames = []
        frames.append(_Frame(devices, baseline, started, tracker))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        frame: _Frame = self._local.frames.pop()
        if tb is not None and not self.keep_traceback_locals:
            traceback.clear_frames(tb)  # frees what the failed calls' locals hold
        if frame.tracker is not None:
            frame.tracker.stop()  # before cleanup, so that its own work is not recorded
        report, error = _run_cleanup(
            "GPUContext",
            fixed=self._fixed,
            devices=frame.devices,
            before=frame.baseline,
            baseline=frame.baseline,
            started=time.perf_counter(),
            collect=self.collect,
            find_leaks=True,
            max_listed=self.max_listed,
            tracker=frame.tracker,
            exc_type=exc_type.__name__ if exc_type is not None else None,
        )
        self.report = report
        if error is not None and exc_type is None:
            raise error
        if report.held_bytes > self.tolerance_bytes:
            message = _leak_message(report, self.track_allocations)
            if self.raise_on_leak and exc_type is None:
                raise MemoryLeakError(message, report)
            if self.warn_on_leak or self.raise_on_leak:
                warnings.warn(message, LeakWarning, stacklevel=2)
        elif error is not None:
            warnings.warn(
                f"GPUContext: cleanup after the block's {exc_type.__name__} failed: {error}",
                RuntimeWarning,
                stacklevel=2,
            )
        return False

    def __repr__(self) -> str:
        where = "all devices in use" if self._fixed is None else (
            "cpu" if not self._fixed else ", ".join(f"cuda:{d}" for d in self._fixed)
        )
        return f"GPUContext({where}, tolerance_bytes={self.tolerance_bytes})"



def cleanup_cuda(device: Any = None) -> CleanupReport:
    """Synchronizes, releases every framework's cached memory, collects garbage, releases
    again. Returns a ``CleanupReport`` whose ``before`` is the state at the call and whose
    ``held`` is everything still allocated afterwards (by live objects)."""
    started = time.perf_counter()
    fixed = _parse_device(device)
    devices = _active(fixed)
    before = _measure(devices)
    report, error = _run_cleanup(
        "cleanup_cuda",
        fixed=fixed,
        devices=devices,
        before=before,
        baseline=None,
        started=started,
        collect=True,
        find_leaks=False,
        max_listed=0,
    )
    if error is not None:
        raise error
    return report

"""``GPUContext``, which returns a block's GPU memory on exit, and ``cleanup_cuda``."""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Literal, Optional

from gpukeeper.base.arg_checks import check_bool, check_int
from gpukeeper.base.byte_figures import fmt_bytes
from gpukeeper.base.device_names import resolve_device
from gpukeeper.base.errors import InvalidInputError, LeakWarning, MemoryLeakError
from gpukeeper.cleanup import deferred
from gpukeeper.cleanup.cleanup_report import CleanupReport, Snapshot, leak_message
from gpukeeper.cleanup.frames import caller_frame, clear_traceback_frames
from gpukeeper.cleanup.measure import devices_in_use, measure
from gpukeeper.cleanup.names import NameSnapshot, release_new_names, snapshot_names
from gpukeeper.cleanup.run import cleanup_from_now, run_cleanup
from gpukeeper.cleanup.tracking import AllocationTracker


def _parse_device(device: Any) -> Optional[List[int]]:
    """None (every device in use) or the list of named CUDA ordinals ([] for the CPU)."""
    if device is None:
        return None
    spec = resolve_device(device, what="GPUContext device")
    return [] if spec.index is None else [spec.index]


@dataclass
class ExitListener:
    """What an interactive shell wants to hear from a GPUContext exit: that finalizers were
    armed on what still holds memory (``deferred_armed``), and that the block raised
    (``block_failed``), whose traceback the shell keeps. GPUContext knows no shell: the
    IPython support (cleanup/ipython_refs.py) adds its listener when the package loads."""

    deferred_armed: Callable[[], None]
    block_failed: Callable[[BaseException], None]


_listeners: List[ExitListener] = []


def add_exit_listener(listener: ExitListener) -> None:
    """Adds ``listener`` to every later GPUContext exit (once per listener)."""
    if listener not in _listeners:
        _listeners.append(listener)


@dataclass
class _Frame:
    devices: List[int]
    baseline: Snapshot
    started: float
    tracker: Optional[AllocationTracker]
    names: Optional[NameSnapshot]


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

    **Names that outlive the block.** A ``with`` block is not a scope: ``model`` bound
    inside it is still alive at exit, so its memory cannot be given back then. When
    memory is still held above the baseline at exit (``report.held``), the context arms
    a finalizer (a weak reference) on each live object that may hold it: the tensors
    and arrays on those devices (those made before the block too, as nothing tells them
    apart) and gpukeeper ``ManagedBuffer``s there. When the held memory is gone (every
    armed allocation died, or the allocated bytes are back at the baseline), the
    context's devices are synchronized and their caches released, right after the
    statement that freed it::

        with GPUContext():
            model = MyModel().cuda()
            ...
        del model                          # the caches are released here
        torch.cuda.memory_reserved()       # back down, without another call

    When only part of it dies, one release follows after a short quiet time (a loop of
    ``del`` costs one release). ``report.deferred`` counts the objects armed (a note
    says so); nothing is armed, and nothing costs anything, when nothing is held. The
    finalizers keep nothing alive and never raise; they are disarmed once the memory is
    back, when a later context on the same devices arms its own (it takes over, keeping
    the older baseline), at interpreter exit and in a forked child. The release right
    after the statement uses a one-shot statement hook (``sys.monitoring`` on Python
    3.12+, a profile function in the thread that freed the memory before); where that
    hook is taken by a profiler it comes a few milliseconds later, from a timer.
    ``deferred_release=False`` arms nothing.

    ``release_names=True`` (opt-in): at exit, the objects the block bound to new or
    rebound names of the frame that runs the ``with`` statement are emptied as
    ``cleanup_models`` empties them (torch modules, optimizers and tensors, gpukeeper
    ``ManagedBuffer``s, and containers of those; other values are left alone), before
    the cleanup measures. It is opt-in because it destroys objects the caller may mean
    to keep using after the block, or that something else still refers to (``w =
    model.weight`` empties the model's weight); a later use fails loudly
    (``EmptiedObjectError`` for a module or optimizer, ``InvalidInputError`` for a
    released buffer, an empty tensor otherwise). Values bound to a name on entry
    (``alias = model``) are left alone. The note in ``report.notes`` names what was
    emptied.

    **IPython.** A failed cell's traceback (``sys.last_traceback``) and the output
    history (``Out``, ``_``...) would keep memory alive. After a cell whose exception
    left a GPUContext, the traceback's frames are cleared and the caches released; a
    displayed result holding armed objects is dropped from the output history once
    nothing else refers to it. ``release_ipython_references()`` drops every result
    holding device memory from the history.

    Contexts nest (each keeps its own baseline; one instance may be re-entered) and work
    as decorators.

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
        deferred_release: bool = True,
        release_names: bool = False,
    ) -> None:
        self._fixed = _parse_device(device)
        flags = (
            ("warn_on_leak", warn_on_leak),
            ("raise_on_leak", raise_on_leak),
            ("track_allocations", track_allocations),
            ("keep_traceback_locals", keep_traceback_locals),
            ("deferred_release", deferred_release),
            ("release_names", release_names),
        )
        for name, flag in flags:
            check_bool(flag, f"GPUContext: {name}")
        check_int(tolerance_bytes, "GPUContext: tolerance_bytes", 0)
        if collect not in (None, True, False):
            raise InvalidInputError(
                f"GPUContext: collect must be None, True or False, got {collect!r}"
            )
        check_int(max_listed, "GPUContext: max_listed", 0)
        check_int(stack_depth, "GPUContext: stack_depth", 0)
        self.device = device
        self.warn_on_leak = bool(warn_on_leak)
        self.raise_on_leak = bool(raise_on_leak)
        self.tolerance_bytes = tolerance_bytes
        self.track_allocations = bool(track_allocations)
        self.collect = collect
        self.max_listed = max_listed
        self.stack_depth = stack_depth
        self.keep_traceback_locals = bool(keep_traceback_locals)
        self.deferred_release = deferred_release
        self.release_names = release_names
        self.report: Optional[CleanupReport] = None
        # Entered frames per thread: one instance may be re-entered (nested, or used as a
        # decorator on a recursive function) and each exit must find its own baseline.
        self._local = threading.local()

    def __enter__(self) -> "GPUContext":
        started = time.perf_counter()
        devices = devices_in_use(self._fixed)
        baseline = measure(devices, outside=True)
        names = snapshot_names(caller_frame(1)) if self.release_names else None
        tracker = None
        if self.track_allocations:
            tracker = AllocationTracker(self.stack_depth)
            tracker.start()
        frames = getattr(self._local, "frames", None)
        if frames is None:
            frames = self._local.frames = []
        frames.append(_Frame(devices, baseline, started, tracker, names))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        frames = getattr(self._local, "frames", None)
        if not frames:
            raise InvalidInputError(
                "GPUContext.__exit__ without a matching __enter__ (on this thread): "
                "use it as `with GPUContext():`"
            )
        frame: _Frame = frames.pop()
        if tb is not None and not self.keep_traceback_locals:
            clear_traceback_frames(tb)  # frees what the failed calls' locals hold
        if frame.tracker is not None:
            frame.tracker.stop()  # before cleanup, so that its own work is not recorded
        caller = caller_frame(1)
        emptied: List[str] = []
        freed = 0
        name_error: Optional[BaseException] = None
        if frame.names is not None:
            try:
                emptied, freed = release_new_names(frame.names, caller)
            except Exception as e:  # the cleanup below must run all the same
                name_error = e
        report, error = run_cleanup(
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
            outside=True,
        )
        if emptied:
            report.notes.append(
                f"release_names: emptied {', '.join(emptied)} ({fmt_bytes(freed)} freed)"
            )
        if name_error is not None:
            report.notes.append(f"release_names failed: {type(name_error).__name__}: {name_error}")
            error = error or name_error
        if report.held and self.deferred_release:
            try:
                report.deferred, note = deferred.arm(
                    fixed=self._fixed, baseline=frame.baseline, after=report.after, frame=caller
                )
            except Exception as e:  # arming is a convenience: it must not fail the exit
                note = f"arming the deferred release failed: {type(e).__name__}: {e}"
            if note:
                report.notes.append(note)
            if report.deferred:
                for listener in _listeners:
                    listener.deferred_armed()
        if exc is not None and not self.keep_traceback_locals:
            for listener in _listeners:
                listener.block_failed(exc)
        del caller
        self.report = report
        if error is not None and exc_type is None:
            raise error
        if report.held_bytes > self.tolerance_bytes:
            message = leak_message(report, self.track_allocations)
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
        where = (
            "all devices in use"
            if self._fixed is None
            else ("cpu" if not self._fixed else ", ".join(f"cuda:{d}" for d in self._fixed))
        )
        return f"GPUContext({where}, tolerance_bytes={self.tolerance_bytes})"


def cleanup_cuda(device: Any = None) -> CleanupReport:
    """Synchronizes, releases every framework's cached memory, collects garbage, releases
    again. Returns a ``CleanupReport`` whose ``before`` is the state at the call and whose
    ``held`` is everything still allocated afterwards (by live objects)."""
    report, error = cleanup_from_now(
        "cleanup_cuda", _parse_device(device), collect=True, find_leaks=False, max_listed=0
    )
    if error is not None:
        raise error
    return report

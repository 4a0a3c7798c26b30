"""Where each tensor/array was made (``track_allocations``) and which live ones still hold
memory after a cleanup."""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import gpukeeper._core as _core
from gpukeeper import frameworks
from gpukeeper.cleanup.cleanup_report import LeakedArray, Snapshot
from gpukeeper.cleanup.measure import level_of
from gpukeeper.frameworks import LiveArray

_INTERNAL_DIRS: Optional[Tuple[str, ...]] = None


def _internal_dirs() -> Tuple[str, ...]:
    global _INTERNAL_DIRS
    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep]
    # The libraries the stack passes through on its way to the user's line: the
    # frameworks', and pytest's runner and hooks, which frame every test.
    dirs += frameworks.framework_dirs()
    for name in ("_pytest", "pluggy"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    _INTERNAL_DIRS = tuple(dirs)
    return _INTERNAL_DIRS


def _user_stack(depth: int) -> Tuple[str, ...]:
    """The innermost ``depth`` frames outside torch, CuPy and gpukeeper."""
    internal = _INTERNAL_DIRS or _internal_dirs()
    out: List[str] = []
    frame: Optional[FrameType] = sys._getframe(2)
    while frame is not None and len(out) < depth:
        code = frame.f_code
        name = code.co_filename
        if not name.startswith(internal) and not name.startswith("<frozen"):
            out.append(f"{name}:{frame.f_lineno} in {code.co_name}")
        frame = frame.f_back
    return tuple(out) if out else ("<no Python frame: another thread, e.g. autograd's>",)


_dispatch_mode_class: Any = None


def _recorder_class(torch_types: Tuple[type, type]) -> Any:
    """A TorchDispatchMode that records where each new storage was made (made once), from
    what ``frameworks.torch_dispatch_mode()`` gives."""
    global _dispatch_mode_class
    if _dispatch_mode_class is None:
        tensor_type, TorchDispatchMode = torch_types

        class _Recorder(TorchDispatchMode):  # type: ignore[misc, valid-type]
            def __init__(self, tracker: "AllocationTracker") -> None:
                super().__init__()
                self.tracker = tracker

            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                out = func(*args, **(kwargs or {}))
                # Views and in-place ops make no new storage: only the others are recorded
                # (a storage's address, reused later by the allocator, is overwritten then).
                if not func.is_view and not func._schema.is_mutable:
                    if isinstance(out, tensor_type):
                        self.tracker.record_torch((out,))
                    elif isinstance(out, (tuple, list)):
                        self.tracker.record_torch([t for t in out if isinstance(t, tensor_type)])
                return out

        _dispatch_mode_class = _Recorder
    return _dispatch_mode_class


class AllocationTracker:
    """Creation sites of the storages/arrays made while it runs (``track_allocations``).

    PyTorch: a TorchDispatchMode sees every ATen op of the thread that entered it (and of
    autograd's threads, which inherit it) and records the Python stack for each new
    storage. CuPy: a ``cupy.cuda.MemoryHook`` records each allocation from CuPy's memory
    pool. Both cost microseconds per op: for finding leaks, not for production loops.
    Only frameworks imported before the context is entered are tracked.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.sites: Dict[Tuple[str, int], Tuple[str, ...]] = {}
        self._mode: Any = None
        self._hook: Any = None
        self.frameworks: Set[str] = set()

    def record_buffer(self, buffer: Any) -> None:
        """Called by gpukeeper with each new ``ManagedBuffer`` while tracking."""
        self.sites[("gpukeeper", int(buffer.ptr))] = _user_stack(self.depth)

    def record_torch(self, tensors: Sequence[Any]) -> None:
        stack = None
        for t in tensors:
            try:
                ptr = int(t.untyped_storage().data_ptr())
            except Exception:
                continue  # sparse/meta/fake: no storage to attribute
            if ptr:
                if stack is None:
                    stack = _user_stack(self.depth)
                self.sites[("torch", ptr)] = stack

    def start(self) -> None:
        _internal_dirs()
        _core._set_buffer_hook(self.record_buffer)
        self.frameworks.add("gpukeeper")
        torch_types = frameworks.torch_dispatch_mode()
        if torch_types is not None:
            mode = _recorder_class(torch_types)(self)
            mode.__enter__()
            self._mode = mode
            self.frameworks.add("torch")
        hook_base = frameworks.cupy_memory_hook()
        if hook_base is not None:
            tracker = self

            class _CupyRecorder(hook_base):  # type: ignore[misc, valid-type]
                def malloc_postprocess(self, **kwargs: Any) -> None:
                    ptr = kwargs.get("mem_ptr")
                    if ptr:
                        tracker.sites[("cupy", int(ptr))] = _user_stack(tracker.depth)

            hook = _CupyRecorder()
            hook.name = f"gpukeeper-tracker-{id(self)}"  # hook names must be unique per thread
            try:
                hook.__enter__()
                self._hook = hook
                self.frameworks.add("cupy")
            except Exception:
                pass  # CuPy's hooks unavailable: its arrays are listed without sites

    def stop(self) -> None:
        if "gpukeeper" in self.frameworks:
            _core._set_buffer_hook(None)
        if self._hook is not None:
            try:
                self._hook.__exit__(None, None, None)
            except Exception:
                pass
            self._hook = None
        if self._mode is not None:
            try:
                self._mode.__exit__(None, None, None)
            except Exception:
                pass
            self._mode = None


def name_leaks(
    held: Dict[str, Dict[str, int]],
    baseline: Optional[Snapshot],
    tracker: Optional[AllocationTracker],
    max_listed: int,
) -> Tuple[List[LeakedArray], int]:
    """The live tensors/arrays on the devices where memory is still held (slow: gc walk)."""
    wanted = {
        (loc, name)
        for loc, per in held.items()
        for name in per
        if name in ("torch", "cupy", "gpukeeper")
    }
    if not wanted:
        return [], 0
    locations = sorted({loc for loc, _ in wanted})
    candidates: List[LeakedArray] = []
    for loc in locations:
        found: List[LiveArray] = []
        if (loc, "gpukeeper") in wanted:
            found += frameworks.live_buffers(loc)
        if loc.startswith("cuda:") and ({(loc, "torch"), (loc, "cupy")} & wanted):
            found += frameworks.live_arrays(int(loc.split(":", 1)[1]))
        for arr in found:
            if (loc, arr.framework) not in wanted:
                continue
            candidates.append(_leaked(arr, loc, baseline, tracker))
    # What the tracker did not see made is most likely older than the context: drop it.
    kept = [c for c in candidates if c.inside is not False]
    kept.sort(key=lambda c: (c.inside is not True, -c.nbytes))
    return kept[:max_listed], len(kept)


def _leaked(
    arr: LiveArray, loc: str, baseline: Optional[Snapshot], tracker: Optional[AllocationTracker]
) -> LeakedArray:
    site: Tuple[str, ...] = ()
    inside: Optional[bool] = None
    if tracker is not None and arr.framework in tracker.frameworks:
        site = tracker.sites.get((arr.framework, arr.data_ptr), ())
        inside = bool(site)
    if not inside:
        base = (baseline or {}).get(loc, {}).get(arr.framework)
        if baseline is not None and level_of(base) == 0:
            inside = True  # the framework held nothing there on entry
    return LeakedArray(
        arr.framework,
        arr.device,
        arr.kind,
        arr.shape,
        arr.dtype,
        arr.nbytes,
        inside,
        site,
        bool(arr.grad_fn),
    )

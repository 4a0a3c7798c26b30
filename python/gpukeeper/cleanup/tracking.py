"""Where each tensor/array was made (``track_allocations``) and which live ones still hold
memory after a cleanup."""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from gpukeeper import frameworks
from gpukeeper.cleanup.cleanup_report import LeakedArray, Snapshot
from gpukeeper.cleanup.measure import level_of
from gpukeeper.frameworks import LiveArray

#: The name gpukeeper's own buffers are reported under (its pools' adapter).
BUFFERS = frameworks.PoolsAdapter.name

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


class AllocationTracker:
    """Creation sites of the storages/arrays made while it runs (``track_allocations``).

    Each framework's adapter records where its allocations are made
    (``record_allocations``): for PyTorch a TorchDispatchMode that sees every ATen op of
    the thread that entered it (and of autograd's threads, which inherit it), for CuPy a
    ``cupy.cuda.MemoryHook`` on its memory pool, for gpukeeper's pools a hook on every new
    ``ManagedBuffer``; the tracker keeps the Python stack of each. They cost microseconds
    per op: for finding leaks, not for production loops. Only frameworks imported before
    the context is entered are tracked.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.sites: Dict[Tuple[str, int], Tuple[str, ...]] = {}
        self._stops: List[Callable[[], None]] = []
        self.frameworks: Set[str] = set()

    def _recorder(self, name: str) -> Callable[[Sequence[int]], None]:
        """What ``name``'s adapter calls with the addresses of its new allocations."""
        sites = self.sites

        def record(addresses: Sequence[int]) -> None:
            stack = _user_stack(self.depth)
            for address in addresses:
                sites[(name, address)] = stack

        return record

    def start(self) -> None:
        _internal_dirs()
        for name, fw in frameworks.ADAPTERS.items():
            stop = fw.record_allocations(self._recorder(name))
            if stop is not None:
                self._stops.append(stop)
                self.frameworks.add(name)

    def stop(self) -> None:
        while self._stops:
            self._stops.pop()()


def name_leaks(
    held: Dict[str, Dict[str, int]],
    baseline: Optional[Snapshot],
    tracker: Optional[AllocationTracker],
    max_listed: int,
) -> Tuple[List[LeakedArray], int]:
    """The live tensors/arrays on the devices where memory is still held (slow: gc walk)."""
    array_frameworks = frameworks.array_frameworks()
    listed = set(array_frameworks) | {BUFFERS}
    wanted = {(loc, name) for loc, per in held.items() for name in per if name in listed}
    if not wanted:
        return [], 0
    locations = sorted({loc for loc, _ in wanted})
    candidates: List[LeakedArray] = []
    for loc in locations:
        found: List[LiveArray] = []
        if (loc, BUFFERS) in wanted:
            found += frameworks.live_buffers(loc)
        if loc.startswith("cuda:") and any((loc, name) in wanted for name in array_frameworks):
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

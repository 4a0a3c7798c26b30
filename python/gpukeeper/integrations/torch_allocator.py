"""PyTorch's CUDA allocations on gpukeeper's pool: ``use_torch_allocator()``.

>>> import gpukeeper
>>> gpukeeper.use_torch_allocator()        # before the first CUDA tensor
>>> x = torch.randn(1024, 1024, device="cuda")
>>> torch.cuda.memory_allocated()          # answered from gpukeeper's pool
4194304

While it is active, PyTorch's memory API (``memory_allocated``, ``memory_stats``,
``memory_summary``, ``reset_peak_memory_stats``, ``empty_cache``, ``memory_snapshot``
...) answers from the pool behind PyTorch (``torch_memory_api``); gpukeeper's own
``stats``, ``memory_report`` and ``GPUContext`` read the same books. An allocation that
fails after the pool released its cache and asked the other frameworks for theirs raises
``torch.cuda.OutOfMemoryError`` with gpukeeper's full message, so ``except
torch.cuda.OutOfMemoryError``, ``accelerate.utils.find_executable_batch_size`` and
``gpukeeper.retry_on_oom`` work as with PyTorch's own allocator.

PyTorch reaches the pool by one of two routes (``route()``). The allocator component
(``torch_component``: one build per supported PyTorch release in the wheel, or built at
first use for another release) is a full ``CUDAAllocator``: cuDNN's benchmark mode, CUDA
graph trees (``torch.compile(mode="reduce-overhead")``), CUDA IPC, memory history and the
OOM observer all work. PyTorch's pluggable-allocator interface, taken only when asked for,
carries allocation and free alone.

CUDA graphs (``torch.cuda.graph``, ``make_graphed_callables``, ``torch.compile`` with
``mode="reduce-overhead"``) get private pools as under PyTorch's own allocator: what a
capture allocates is never handed to other tensors while its graph lives, since every
replay writes to those addresses again. On the pluggable route PyTorch tells the
allocator about captures only through C++ callbacks, which ``use_torch_allocator()`` sets
by finding them in PyTorch's libraries; ``graph_capture_status()`` says whether that
worked. Where it did not, a capture raises ``GpuError`` rather than record a graph whose
memory would be reused under it.
"""

from __future__ import annotations

import glob
import os
import sys
import warnings
from typing import Any, List, Optional, Tuple, Union

import gpukeeper._core as _core
from gpukeeper import frameworks
from gpukeeper._core import PoolStats
from gpukeeper.base.arg_checks import check_choice
from gpukeeper.base.errors import GpuError, InvalidInputError
from gpukeeper.integrations import torch_component, torch_ipc, torch_memory_api

__all__ = [
    "use_torch_allocator",
    "route",
    "is_active",
    "stats",
    "pool_usage",
    "release",
    "install_memory_api",
    "restore_memory_api",
    "oom_error_status",
    "graph_capture_status",
    "graph_pools",
]

_active = False
_route = ""
_oom_status = "use_torch_allocator() has not run"
_graph_status = "use_torch_allocator() has not run"


def _torch_library_paths(torch: Any) -> List[str]:
    """PyTorch's shared libraries loaded in this process (libc10 first), from the process
    map; without one (not Linux), those in its lib folder."""
    lib_dir = os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib"))
    found: List[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ")[-1]
                if path.endswith(".so") and "/" in path and path not in found:
                    if os.path.dirname(os.path.realpath(path)) == lib_dir:
                        found.append(path)
    except OSError:
        found = sorted(glob.glob(os.path.join(lib_dir, "*.so")))
    return sorted(found, key=lambda p: (not os.path.basename(p).startswith("libc10"), p))


def _link_oom_error(torch: Any) -> str:
    """Lets a failed allocation raise torch.cuda.OutOfMemoryError; '' or why not."""
    return _core._link_torch_oom(_torch_library_paths(torch))


def _reclaim(needed: int) -> int:
    """Run when a torch pool is out of memory: other frameworks drop their caches."""
    released = 0
    for name, amount in frameworks.release_all_caches(None).items():
        if name != "torch":  # our own pool already released its cache before asking
            released += amount
    return released


def _link_graph_pools(torch: Any) -> str:
    """Gives PyTorch's pluggable allocator the graph-pool callbacks; '' or why not. Where
    they cannot be set, CUDA graph capture is refused with that reason."""
    paths = _torch_library_paths(torch)
    why = _core._link_torch_graph_pools(paths)
    if why:
        _refuse_graph_capture(torch, why)
    return why


def _refuse_graph_capture(torch: Any, why: str) -> None:
    graph_cls = torch.cuda.CUDAGraph
    original = graph_cls.capture_begin

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise GpuError(
            "CUDA graph capture under gpukeeper.use_torch_allocator() needs PyTorch to tell "
            f"the allocator when captures begin and end, and it cannot here: {why}. A graph "
            "captured anyway would have its memory handed to other tensors while it replays; "
            "run graphs without use_torch_allocator()"
        )

    capture_begin.__wrapped__ = original  # type: ignore[attr-defined]
    graph_cls.capture_begin = capture_begin


ROUTES = ("auto", "component", "pluggable")


def use_torch_allocator(
    memory_api: bool = True, route: str = "auto", expandable: Union[bool, str] = "auto"
) -> None:
    """Routes PyTorch's CUDA allocations through gpukeeper's caching pool.

    Must run before PyTorch allocates CUDA memory (its allocator cannot be swapped once
    used): raises ``GpuError`` saying so otherwise, and when PyTorch has no CUDA. Calling
    it again once active does nothing.

    ``route`` picks how PyTorch reaches the pool:

    - ``"component"``: gpukeeper's allocator component (``torch_component``), a
      ``CUDAAllocator`` built against the installed PyTorch. Every allocator feature
      works: ``cudnn.benchmark``, ``torch.compile(mode="reduce-overhead")``, CUDA tensors
      through ``torch.multiprocessing``, memory history with stack frames, the OOM
      observer.
    - ``"pluggable"``: PyTorch's pluggable-allocator interface, which carries allocate and
      free only: the features above raise in PyTorch.
    - ``"auto"`` (default): the component, which the wheel carries for every supported
      PyTorch release and which is built at first use for another release where a C++
      compiler is present. Where neither can be had, ``GpuError`` says why and how to build
      it, rather than falling back to an interface under which everyday PyTorch features
      would raise later, deep inside PyTorch.

    ``memory_api`` (default True) makes PyTorch's memory counters answer from the pool
    directly (``install_memory_api``): well under a microsecond a read.

    ``expandable`` chooses where the pool keeps blocks, as ``MemoryPool``'s does:
    ``"auto"`` (requests over 1 MiB in expandable ranges where the driver has virtual
    memory management, which keeps reserved memory within a few percent of the peak
    allocated), ``False`` (fixed cudaMalloc segments, as PyTorch's own allocator), ``True``
    or ``"hybrid"`` (also ``"fixed"`` and ``"expandable"``; the former ``"large"``
    warns). CUDA tensors cross ``torch.multiprocessing`` from either layout on the
    component route: a block in an expandable range travels as PyTorch's own expandable
    segments do (its pages' descriptors, which the receiver takes with ``pidfd_getfd``).

    While active, a tensor that cannot be shared through ``torch.multiprocessing`` reaches
    the receiver as a ``GpuError`` raised by its ``get()``, with the sender's reason,
    rather than being dropped by the queue's feeder thread (``torch_ipc``).
    """
    global _active, _oom_status, _graph_status, _route
    check_choice(route, "route", ROUTES)
    if _active:
        if memory_api:
            install_memory_api()
        return
    import torch

    if not torch.cuda.is_available():
        raise GpuError(
            "use_torch_allocator(): PyTorch sees no CUDA device "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda})"
        )
    why_not = torch_component.status(torch) if route != "pluggable" else "route='pluggable'"
    if route != "pluggable" and why_not:
        raise GpuError(
            f"use_torch_allocator(route={route!r}): {why_not}. route='pluggable' puts "
            "allocation alone on the pool through PyTorch's pluggable-allocator interface, "
            "under which cudnn.benchmark, torch.compile(mode='reduce-overhead'), CUDA tensors "
            "sent between processes and memory history raise in PyTorch"
        )
    try:
        _core._torch_pool_set_layout(expandable)
    except InvalidInputError as exc:
        raise InvalidInputError(f"use_torch_allocator(expandable={expandable!r}): {exc}") from exc
    if not why_not:
        torch_component.install(torch)
        _core._set_torch_reclaim(_reclaim)
        _active, _route = True, "component"
        _oom_status = _graph_status = ""
    else:
        _install_pluggable(torch)
    torch_ipc.install(torch)
    if memory_api:
        install_memory_api()


def _install_pluggable(torch: Any) -> None:
    global _active, _oom_status, _graph_status, _route
    malloc_name, free_name = _core._torch_malloc_symbols()
    allocator = torch.cuda.memory.CUDAPluggableAllocator(_core.__file__, malloc_name, free_name)
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as exc:
        raise GpuError(
            "use_torch_allocator() must run before the first CUDA tensor is made: PyTorch's "
            f"caching allocator is already in use ({exc})"
        ) from exc
    _core._set_torch_reclaim(_reclaim)
    _active, _route = True, "pluggable"
    _oom_status = _link_oom_error(torch)
    _graph_status = _link_graph_pools(torch)
    if _oom_status:
        warnings.warn(
            "use_torch_allocator(): an allocation that fails will raise RuntimeError, not "
            f"torch.cuda.OutOfMemoryError ({_oom_status}); its message still starts with "
            "'CUDA out of memory.'",
            RuntimeWarning,
            stacklevel=3,
        )


def route() -> str:
    """How PyTorch reaches the pool: ``"component"``, ``"pluggable"``, or ``""`` before
    ``use_torch_allocator()`` ran."""
    return _route


def install_memory_api() -> None:
    """Answers torch.cuda's memory functions from the pool behind PyTorch (see
    ``torch_memory_api``). Done by ``use_torch_allocator()``; a no-op when done. Under the
    component only the counters are replaced: PyTorch's own primitives reach the pool."""
    torch_memory_api.install(sys.modules["torch"], primitives=_route != "component")


def restore_memory_api() -> None:
    """Puts PyTorch's own memory functions back (they then raise under this allocator)."""
    torch_memory_api.restore()


def oom_error_status() -> str:
    """'' when a failed allocation raises torch.cuda.OutOfMemoryError, else why not."""
    return _oom_status


def graph_capture_status() -> str:
    """'' when CUDA graphs captured under the allocator get private pools, else why not
    (and captures are refused)."""
    return _graph_status


def graph_pools(device: int = 0) -> List[dict]:
    """The private pools of the CUDA graphs PyTorch captured on ``device`` through
    gpukeeper: each a dict with ``id`` (PyTorch's pool id), ``uses`` (graphs holding it),
    ``capturing``, and its bytes (``allocated_bytes``, ``reserved_bytes``, peaks)."""
    return list(_core._torch_graph_pools(device))


def is_active() -> bool:
    """Whether PyTorch allocates through gpukeeper in this process."""
    return _active


def stats(device: int = 0) -> Optional[PoolStats]:
    """Statistics of the pool behind PyTorch on ``device`` (None before its first use)."""
    return _core._torch_pool_stats(device)


def peak_allocated(device: int = 0) -> Optional[int]:
    """Most bytes in live tensors on ``device`` since the pool's last peak reset (None
    before the pool's first use there)."""
    s = stats(device)
    return None if s is None else int(s.peak_allocated_bytes)


def reset_peak(device: int = 0) -> bool:
    """Starts a new peak of allocated bytes in the pool behind PyTorch on ``device``
    (``torch.cuda.reset_peak_memory_stats`` under this allocator); False when the pool
    has not been used there."""
    if stats(device) is None:
        return False
    _core._torch_pool_reset(device, True, False)
    return True


def pool_usage(device: int = 0) -> Tuple[int, int]:
    """(allocated, reserved) bytes of the pool behind PyTorch on ``device``."""
    s = stats(device)
    return (0, 0) if s is None else (s.allocated_bytes, s.reserved_bytes)


def release(device: Optional[int] = None) -> int:
    """Returns the cached memory of the pools behind PyTorch to the driver; bytes."""
    return torch_memory_api.release_pools(device)

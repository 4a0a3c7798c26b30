"""PyTorch's memory API answered from gpukeeper's books while ``use_torch_allocator()`` is on.

Under a pluggable allocator PyTorch's own statistics raise ("CUDAPluggableAllocator does
not yet support getDeviceStats"), so the first ``torch.cuda.memory_allocated()`` of a
training loop (Hugging Face Trainer, Lightning's DeviceStatsMonitor, accelerate, most
hand-written loops) would crash. ``install()`` (called by ``use_torch_allocator()``)
answers them from the pool behind PyTorch instead, per device:

- ``memory_allocated``, ``memory_reserved``, ``max_memory_allocated``,
  ``max_memory_reserved``: one read of the pool's counters (well under a microsecond);
- ``memory_stats`` / ``memory_stats_as_nested_dict`` / ``memory_summary``: the pool's
  history in PyTorch's keys (``allocated_bytes.all.current`` ...; see
  ``memory_stats_dict``), ``memory_stats`` flattened directly (tens of microseconds
  instead of PyTorch's ~120);
- ``reset_peak_memory_stats``, ``reset_max_memory_allocated``,
  ``reset_accumulated_memory_stats``; ``empty_cache`` (releases the pool's cache);
  ``set_per_process_memory_fraction`` / ``get_per_process_memory_fraction`` (the pool's
  limit); ``memory_snapshot`` and ``torch.cuda.memory._snapshot()`` in PyTorch's format,
  which ``torch.cuda._memory_viz`` reads. ``mem_get_info`` asks the driver and needs
  nothing.

The route: PyTorch's Python functions all reach a handful of ``torch._C`` primitives
(``_cuda_memoryStats``, ``_cuda_resetPeakMemoryStats``, ``_cuda_emptyCache`` ...) that
they look up at each call. Replacing those primitives covers every function, also names
imported before the hook (``from torch.cuda import memory_stats``), with no C++ linked
against PyTorch; the four hot counters and ``memory_stats`` are also replaced in ``torch.cuda`` and
``torch.cuda.memory`` by direct reads, because PyTorch's versions flatten the whole stats
dict on each call. ``restore()`` puts PyTorch's own functions back.

What differs from PyTorch's allocator: a block freed on a stream is cached at once (no
"awaiting free" state), so ``active_*`` equals ``allocated_*``; ``inactive_split*`` has
current values only; there is no ``max_split_size`` (reported as -1, PyTorch's "none"),
so ``oversize_*`` is 0. Under the pluggable route memory history recording
(``_record_memory_history``) is not supported, so these snapshots carry no stack frames
or trace entries; the allocator component (``torch_component``) records them.
"""

from __future__ import annotations

import collections
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import gpukeeper._core as _core
from gpukeeper.base.errors import InvalidInputError

__all__ = [
    "install",
    "restore",
    "is_installed",
    "memory_stats_dict",
    "memory_stats_flat",
    "snapshot_dict",
]

# torch._C primitives replaced while installed, and the functions that replace them.
_PRIMITIVES = (
    "_cuda_memoryStats",
    "_cuda_resetPeakMemoryStats",
    "_cuda_resetAccumulatedMemoryStats",
    "_cuda_emptyCache",
    "_cuda_memorySnapshot",
    "_cuda_setMemoryFraction",
    "_cuda_getMemoryFraction",
)
# Public functions replaced by direct reads (in torch.cuda and torch.cuda.memory).
_FAST = (
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_stats",
)

_saved: List[Tuple[Any, str, Any]] = []  # (owner, name, original) while installed


# --------------------------------------------------------------------- formats


_ZERO = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
# PyTorch's family names for PoolHistory's; "active" ones are the allocated ones here.
_FAMILIES = (
    ("allocated_bytes", "allocated_bytes"),
    ("active_bytes", "allocated_bytes"),
    ("requested_bytes", "requested_bytes"),
    ("reserved_bytes", "reserved_bytes"),
    ("inactive_split_bytes", "inactive_split_bytes"),
    ("allocation", "allocations"),
    ("active", "allocations"),
    ("segment", "segments"),
    ("inactive_split", "inactive_splits"),
)
_EVENTS = (
    ("num_alloc_retries", "alloc_retries"),
    ("num_ooms", "ooms"),
    ("num_sync_all_streams", "device_syncs"),
    ("num_device_alloc", "device_allocs"),
    ("num_device_free", "device_frees"),
    ("num_oom_rejections", "limit_rejections"),
)
_POOLS = ("all", "large_pool", "small_pool")
_METRICS = ("current", "peak", "allocated", "freed")


def memory_stats_dict(history: Any) -> Dict[str, Any]:
    """A pool's ``PoolHistory`` as ``torch.cuda.memory_stats_as_nested_dict()`` gives it.

    ``history`` is what ``MemoryPool.history(device)`` or the pool behind PyTorch returns.
    The keys are PyTorch's (``allocated_bytes``, ``reserved_bytes``, ``active_bytes``,
    ``requested_bytes``, ``inactive_split_bytes``, their counts ``allocation``,
    ``segment``, ``active``, ``inactive_split``, each with ``all``/``large_pool``/
    ``small_pool`` and ``current``/``peak``/``allocated``/``freed``; ``num_alloc_retries``,
    ``num_ooms``, ``num_sync_all_streams``, ``num_device_alloc``, ``num_device_free``,
    ``num_oom_rejections``, ``max_split_size``, ``oversize_allocations``,
    ``oversize_segments``).
    """
    raw = history.to_dict()
    out: Dict[str, Any] = {}
    for torch_name, ours in _FAMILIES:
        family = raw[ours]
        out[torch_name] = {pool: dict(family[pool]) for pool in _POOLS}
    for torch_name, ours in _EVENTS:
        out[torch_name] = raw[ours]
    out["max_split_size"] = -1
    out["oversize_allocations"] = dict(_ZERO)
    out["oversize_segments"] = dict(_ZERO)
    return out


def _flat_plan() -> List[Tuple[str, Any]]:
    """memory_stats()'s keys in its (sorted) order, each with where its value comes from."""
    plan: List[Tuple[str, Any]] = []
    for torch_name, ours in _FAMILIES:
        for pool in _POOLS:
            for metric in _METRICS:
                plan.append((f"{torch_name}.{pool}.{metric}", (ours, pool, metric)))
    for torch_name, ours in _EVENTS:
        plan.append((torch_name, ours))
    plan.append(("max_split_size", -1))
    for name in ("oversize_allocations", "oversize_segments"):
        for metric in _METRICS:
            plan.append((f"{name}.{metric}", 0))
    plan.sort()
    return plan


_FLAT_PLAN = _flat_plan()


def memory_stats_flat(history: Any) -> "collections.OrderedDict[str, int]":
    """``memory_stats_dict`` flattened as ``torch.cuda.memory_stats()`` does (sorted
    "family.pool.metric" keys), without building the nested form first."""
    raw = history.to_dict()
    items = []
    for key, source in _FLAT_PLAN:
        if type(source) is tuple:
            ours, pool, metric = source
            items.append((key, raw[ours][pool][metric]))
        elif type(source) is str:
            items.append((key, raw[source]))
        else:
            items.append((key, source))
    return collections.OrderedDict(items)


def snapshot_dict(segments_by_device: Dict[int, List[Any]]) -> Dict[str, Any]:
    """Pools' ``SegmentSnapshot`` lists as ``torch.cuda.memory._snapshot()`` gives them.

    ``segments_by_device`` maps a device ordinal to ``MemoryPool.snapshot(device)`` (or
    the pool behind PyTorch's). The result has ``segments`` (each with ``device``,
    ``address``, ``total_size``, ``allocated_size``, ``active_size``,
    ``requested_size``, ``stream``, ``segment_type``, ``segment_pool_id``,
    ``is_expandable``, ``frames`` and ``blocks`` of ``address``, ``size``,
    ``requested_size``, ``state``, ``frames``) and ``device_traces`` (empty: no history
    is recorded), which ``torch.cuda._memory_viz`` reads.
    """
    segments = []
    for device in sorted(segments_by_device):
        for seg in segments_by_device[device]:
            blocks: List[Dict[str, Any]] = []
            allocated = requested = 0
            for b in seg.blocks:
                if b.allocated:
                    allocated += b.size
                    requested += b.requested
                blocks.append(
                    {
                        "address": int(b.address),
                        "size": int(b.size),
                        "requested_size": int(b.requested),
                        "state": "active_allocated" if b.allocated else "inactive",
                        "frames": [],
                    }
                )
            segments.append(
                {
                    "device": int(device),
                    "address": int(seg.address),
                    "total_size": int(seg.size),
                    "allocated_size": allocated,
                    "active_size": allocated,
                    "requested_size": requested,
                    "stream": int(seg.stream),
                    "segment_type": "small" if seg.small else "large",
                    "segment_pool_id": (0, 0),
                    "is_expandable": bool(seg.expandable),
                    "frames": [],
                    "blocks": blocks,
                }
            )
    n_devices = max(segments_by_device, default=-1) + 1
    return {
        "segments": segments,
        "device_traces": [[] for _ in range(n_devices)],
        "allocator_settings": {"backend": "gpukeeper"},
    }


# --------------------------------------------------------------------- the replacements


def _device_count(torch: Any) -> int:
    return int(torch.cuda.device_count())


def _current_device(torch: Any) -> Callable[[], int]:
    # The raw getter skips torch.cuda.current_device()'s lazy-init check (a few hundred
    # ns); builds without CUDA lack it.
    return getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _make_index(torch: Any) -> Callable[[Any], int]:
    get_device = _current_device(torch)
    get_index = torch.cuda._utils._get_device_index

    def index(device: Any) -> int:
        if device is None:
            return int(get_device())
        if type(device) is not int:
            device = get_index(device, optional=True)  # str, torch.device, torch.cuda.device
        if not 0 <= device < _device_count(torch):
            raise InvalidInputError(
                f"CUDA device {device} does not exist: "
                f"PyTorch sees {_device_count(torch)} device(s)"
            )
        return device

    return index


def _replacements(torch: Any) -> Dict[str, Callable[..., Any]]:
    """The torch._C primitives and fast public functions, bound to this torch."""
    index = _make_index(torch)
    get_device = _current_device(torch)
    counter = _core._torch_pool_counter

    def _cuda_memoryStats(device: Any) -> Dict[str, Any]:
        return memory_stats_dict(_core._torch_pool_history(index(device)))

    def _cuda_resetPeakMemoryStats(device: Any) -> None:
        _core._torch_pool_reset(index(device), True, False)

    def _cuda_resetAccumulatedMemoryStats(device: Any) -> None:
        _core._torch_pool_reset(index(device), False, True)

    def _cuda_emptyCache() -> None:
        release_pools()

    def _cuda_memorySnapshot(arg: Any = None) -> Dict[str, Any]:
        # arg: None, or (pool id, pool id, include_traces). Only the default pool exists.
        if arg is not None and tuple(arg[:2]) != (0, 0):
            return snapshot_dict({})
        devices = [int(d) for d in _core._torch_pool_devices()]
        return snapshot_dict({d: _core._torch_pool_snapshot(d) for d in devices})

    def _cuda_setMemoryFraction(fraction: float, device: Any) -> None:
        _core._torch_pool_set_fraction(index(device), float(fraction))

    def _cuda_getMemoryFraction(device: Any) -> float:
        return float(_core._torch_pool_fraction(index(device)))

    # The hot four: one counter read each (torch's own flatten ~100 keys per call).
    def memory_allocated(device: Any = None) -> int:
        """Bytes in live tensors on ``device`` (gpukeeper's pool behind PyTorch)."""
        return counter(get_device() if device is None else index(device), 0)

    def memory_reserved(device: Any = None) -> int:
        """Bytes the pool behind PyTorch holds from the driver on ``device``."""
        return counter(get_device() if device is None else index(device), 1)

    def max_memory_allocated(device: Any = None) -> int:
        """Peak of ``memory_allocated`` since the start or the last peak reset."""
        return counter(get_device() if device is None else index(device), 2)

    def max_memory_reserved(device: Any = None) -> int:
        """Peak of ``memory_reserved`` since the start or the last peak reset."""
        return counter(get_device() if device is None else index(device), 3)

    def memory_stats(device: Any = None) -> "collections.OrderedDict[str, int]":
        """PyTorch's flat memory statistics of the pool behind PyTorch on ``device``."""
        return memory_stats_flat(
            _core._torch_pool_history(get_device() if device is None else index(device))
        )

    return {
        "_cuda_memoryStats": _cuda_memoryStats,
        "_cuda_resetPeakMemoryStats": _cuda_resetPeakMemoryStats,
        "_cuda_resetAccumulatedMemoryStats": _cuda_resetAccumulatedMemoryStats,
        "_cuda_emptyCache": _cuda_emptyCache,
        "_cuda_memorySnapshot": _cuda_memorySnapshot,
        "_cuda_setMemoryFraction": _cuda_setMemoryFraction,
        "_cuda_getMemoryFraction": _cuda_getMemoryFraction,
        "memory_allocated": memory_allocated,
        "memory_reserved": memory_reserved,
        "max_memory_allocated": max_memory_allocated,
        "max_memory_reserved": max_memory_reserved,
        "memory_stats": memory_stats,
    }


def release_pools(device: Optional[int] = None) -> int:
    """Returns the cached memory of the pools behind PyTorch to the driver; bytes."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the pool also waits for its streams; this covers others
    return int(_core._torch_pool_cleanup(-1 if device is None else device))


def install(torch: Any = None, primitives: bool = True) -> None:
    """Answers PyTorch's memory API from the pool behind PyTorch (idempotent).

    ``primitives=False`` replaces only the fast reads (``memory_allocated`` ... and
    ``memory_stats``): under the allocator component PyTorch's own primitives already
    reach the pools, and its snapshot carries the stacks of memory history."""
    if _saved:
        return
    torch = torch if torch is not None else sys.modules["torch"]
    funcs = _replacements(torch)
    owners: List[Tuple[Any, Tuple[str, ...]]] = [
        (torch.cuda.memory, _FAST),
        (torch.cuda, _FAST),
    ]
    if primitives:
        owners.insert(0, (torch._C, _PRIMITIVES))
    for owner, names in owners:
        for name in names:
            if hasattr(owner, name):
                _saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, funcs[name])


def restore() -> None:
    """Puts PyTorch's own memory functions back."""
    while _saved:
        owner, name, original = _saved.pop()
        setattr(owner, name, original)


def is_installed() -> bool:
    """Whether PyTorch's memory API is answered by gpukeeper now."""
    return bool(_saved)

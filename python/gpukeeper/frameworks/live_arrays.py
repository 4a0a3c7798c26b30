"""The tensors and arrays Python can reach on a device (PyTorch, CuPy): what holds memory,
for reports and leak hunts."""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from gpukeeper.base.device_names import current_cuda_index, parse_device

__all__ = [
    "LiveArray",
    "device_array_predicate",
    "live_array_holders",
    "live_arrays",
    "live_buffers",
]


@dataclass(frozen=True)
class LiveArray:
    """One allocation held by a live tensor or array that Python can see.

    ``nbytes`` is the whole allocation (the storage for PyTorch, the memory chunk for
    CuPy), counted once however many views share it; ``shape``/``dtype``/``kind`` are
    those of the base tensor or array when a view's base is alive. ``data_ptr`` is the
    allocation's address, the key under which creation sites are recorded.
    """

    framework: str
    device: str
    kind: str
    shape: Tuple[int, ...]
    dtype: str
    nbytes: int
    data_ptr: int
    grad_fn: bool = False  # a PyTorch result that keeps an autograd graph alive


def _device_filter(device: Any) -> Callable[[str, Optional[int]], bool]:
    """None: every CUDA device; ``"cpu"``: host arrays; else that CUDA device."""
    kind, index = parse_device(device, "live_arrays device")
    if kind == "auto":
        return lambda k, i: k == "cuda"
    if kind == "cpu":
        return lambda k, i: k == "cpu"
    if index is None:
        index = current_cuda_index()
    return lambda k, i: k == "cuda" and i == index


def device_array_predicate() -> Callable[[Any], bool]:
    """A test of one object: is it a PyTorch tensor whose storage is on a device and not
    empty, or a CuPy array? Made once per walk over many objects: the types are looked up
    here, not per object."""
    torch = sys.modules.get("torch")
    tensor = getattr(torch, "Tensor", None) if torch is not None else None
    cupy = sys.modules.get("cupy")
    ndarray = getattr(cupy, "ndarray", None) if cupy is not None else None

    def holds(obj: Any) -> bool:
        if tensor is not None and isinstance(obj, tensor):
            try:
                return bool(obj.device.type != "cpu" and obj.untyped_storage().nbytes() > 0)
            except Exception:
                return False
        return ndarray is not None and isinstance(obj, ndarray)

    return holds


def _walk_arrays(device: Any) -> Iterator[Tuple[Tuple[str, str, int], int, LiveArray, Any]]:
    """Each PyTorch tensor and CuPy array on ``device`` that Python can reach, as
    ``(allocation key, rank, entry, object)``; shared by ``live_arrays`` and
    ``live_array_holders``."""
    wanted = _device_filter(device)
    torch = sys.modules.get("torch")
    tensor_type = getattr(torch, "Tensor", None) if torch is not None else None
    cupy = sys.modules.get("cupy")
    cupy_type = getattr(cupy, "ndarray", None) if cupy is not None else None
    if tensor_type is None and cupy_type is None:
        return
    # Classified by type(), cached per type: isinstance() would call __class__ on every
    # object (slower, and some proxies warn when touched).
    kinds: Dict[type, int] = {}
    for obj in gc.get_objects():
        cls = type(obj)
        kind = kinds.get(cls)
        if kind is None:
            if tensor_type is not None and issubclass(cls, tensor_type):
                kind = 1
            elif cupy_type is not None and issubclass(cls, cupy_type):
                kind = 2
            else:
                kind = 0
            kinds[cls] = kind
        if kind == 0:
            continue
        if kind == 1:
            try:
                dev = obj.device
                if not wanted(dev.type, dev.index):
                    continue
                storage = obj.untyped_storage()
                ptr = int(storage.data_ptr())
                nbytes = int(storage.nbytes())
                if ptr == 0 or nbytes == 0:
                    continue  # empty, or a wrapper subclass whose data lives elsewhere
                label = f"{dev.type}:{dev.index}" if dev.index is not None else dev.type
                is_base = obj._base is None
                graph = obj.grad_fn is not None
                rank = (2 if is_base else 0) * (1 << 62) + (1 << 61 if graph else 0)
                rank += obj.numel() * obj.element_size()
                entry = LiveArray(
                    "torch",
                    label,
                    type(obj).__name__,
                    tuple(obj.shape),
                    str(obj.dtype).replace("torch.", ""),
                    nbytes,
                    ptr,
                    obj.grad_fn is not None,
                )
            except Exception:
                continue  # sparse, meta, fake or otherwise storage-less tensors
            yield ("torch", label, ptr), rank, entry, obj
        else:
            try:
                index = int(obj.device.id)
                if not wanted("cuda", index):
                    continue
                mem = obj.data.mem
                ptr = int(mem.ptr)
                nbytes = int(mem.size)
                if ptr == 0 or nbytes == 0:
                    continue
                label = f"cuda:{index}"
                rank = (2 if obj.base is None else 0) * (1 << 62) + int(obj.nbytes)
                entry = LiveArray(
                    "cupy", label, type(obj).__name__, tuple(obj.shape), str(obj.dtype), nbytes, ptr
                )
            except Exception:
                continue
            yield ("cupy", label, ptr), rank, entry, obj


def live_arrays(device: Any = None) -> List[LiveArray]:
    """Every PyTorch tensor and CuPy array Python can reach on ``device``, largest first.

    ``device``: a CUDA ordinal, ``None`` (every CUDA device) or ``"cpu"`` (host tensors).
    A tensor with a ``grad_fn`` ranks above one without for its allocation, so that an
    allocation that keeps an autograd graph alive says so. Walks ``gc.get_objects()``:
    tens of milliseconds, meant for reports and leak hunts,
    never for a fast path. Memory held only from C++ (an autograd graph's saved tensors,
    a library's workspace) is not seen.
    """
    found: Dict[Tuple[str, str, int], Tuple[int, LiveArray]] = {}
    for key, rank, entry, _obj in _walk_arrays(device):
        # Several tensors may share one allocation: keep the one that best describes it
        # (a base over a view, then the largest).
        old = found.get(key)
        if old is None or rank > old[0]:
            found[key] = (rank, entry)
    return sorted(
        (e for _, e in found.values()), key=lambda e: (-e.nbytes, e.framework, e.data_ptr)
    )


def live_array_holders(device: Any = None) -> List[Tuple[LiveArray, List[Any]]]:
    """Like ``live_arrays``, with the Python objects (tensors, views, arrays) that refer to
    each allocation: the allocation is freed once they all die (unless C++ holds it too).

    For cleanup that waits for those objects to die (weak references); the list holds
    them strongly, so drop it promptly.
    """
    found: Dict[Tuple[str, str, int], Tuple[int, LiveArray, List[Any]]] = {}
    for key, rank, entry, obj in _walk_arrays(device):
        old = found.get(key)
        if old is None:
            found[key] = (rank, entry, [obj])
        else:
            old[2].append(obj)
            if rank > old[0]:
                found[key] = (rank, entry, old[2])
    ordered = sorted(found.values(), key=lambda v: (-v[1].nbytes, v[1].framework, v[1].data_ptr))
    return [(entry, objs) for _, entry, objs in ordered]


def live_buffers(location: str) -> List[LiveArray]:
    """gpukeeper's ``ManagedBuffer``s not yet released at ``location`` (``"host"`` for the
    host and pinned pools, ``"cuda:N"`` for device pools), largest first. Buffers are
    not gc-tracked objects: the core keeps the list of live ones."""
    import gpukeeper._core as _core

    found = []
    for obj in _core._live_buffers():
        try:
            if obj.released:
                continue
            where = "host" if obj.kind in ("host", "pinned") else f"cuda:{obj.device}"
            if where != location:
                continue
            found.append(
                LiveArray(
                    "gpukeeper",
                    where,
                    "ManagedBuffer",
                    (int(obj.size),),
                    obj.precision.label,
                    int(obj.nbytes),
                    int(obj.ptr),
                )
            )
        except Exception:
            continue  # a buffer torn down while the walk ran
    return sorted(found, key=lambda e: (-e.nbytes, e.data_ptr))

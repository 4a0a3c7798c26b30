"""The tensors and arrays Python can reach on a device (those of every framework whose
adapter has an ``array_type``: PyTorch, CuPy): what holds memory, for reports and leak
hunts."""

from __future__ import annotations

import gc
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from gpukeeper.base.device_names import current_cuda_index, parse_device
from gpukeeper.frameworks import registry
from gpukeeper.frameworks.adapter import FrameworkAdapter, LiveArray

__all__ = [
    "LiveArray",
    "device_array_predicate",
    "live_array_holders",
    "live_arrays",
    "live_buffers",
]


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


def _array_adapters() -> List[Tuple[type, FrameworkAdapter]]:
    """(array type, adapter) of each loaded framework that has one."""
    found = []
    for fw in registry.ADAPTERS.values():
        array_type = fw.array_type()
        if array_type is not None:
            found.append((array_type, fw))
    return found


def device_array_predicate() -> Callable[[Any], bool]:
    """A test of one object: is it a framework's array that holds device memory (a
    PyTorch tensor whose storage is on a device and not empty, a CuPy array)? Made once
    per walk over many objects: the types are looked up here, not per object."""
    adapters = _array_adapters()

    def holds(obj: Any) -> bool:
        for array_type, fw in adapters:
            if isinstance(obj, array_type):
                return fw.holds_device_memory(obj)
        return False

    return holds


def _walk_arrays(device: Any) -> Iterator[Tuple[Tuple[str, str, int], int, LiveArray, Any]]:
    """Each framework's tensor or array on ``device`` that Python can reach, as
    ``(allocation key, rank, entry, object)``; shared by ``live_arrays`` and
    ``live_array_holders``."""
    wanted = _device_filter(device)
    adapters = _array_adapters()
    if not adapters:
        return
    # Classified by type(), cached per type: isinstance() would call __class__ on every
    # object (slower, and some proxies warn when touched).
    kinds: Dict[type, Optional[FrameworkAdapter]] = {}
    for obj in gc.get_objects():
        cls = type(obj)
        if cls in kinds:
            fw = kinds[cls]
        else:
            fw = next((a for t, a in adapters if issubclass(cls, t)), None)
            kinds[cls] = fw
        if fw is None:
            continue
        described = fw.describe_array(obj, wanted)
        if described is None:
            continue
        rank, entry = described
        yield (entry.framework, entry.device, entry.data_ptr), rank, entry, obj


def live_arrays(device: Any = None) -> List[LiveArray]:
    """Every framework's tensor or array Python can reach on ``device`` (PyTorch's, CuPy's),
    largest first.

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

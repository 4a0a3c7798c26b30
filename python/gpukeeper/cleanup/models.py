"""``cleanup_models``: frees the memory of models, optimizers and tensors whose names live on."""

from __future__ import annotations

from typing import Any, Dict, List, Set, Tuple

from gpukeeper import frameworks
from gpukeeper._core import ManagedBuffer
from gpukeeper.base.errors import EmptiedObjectError, InvalidInputError
from gpukeeper.base.process_life import device_stuck
from gpukeeper.cleanup.emptied import is_emptied, mark_emptied


class _EmptiedCall:
    """Stands in for ``forward``/``step`` of an emptied object: says what happened."""

    def __init__(self, what: str, hint: str) -> None:
        self.what = what
        self.hint = hint

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise EmptiedObjectError(f"{self.what} was emptied by cleanup_models(): {self.hint}")


class _Found:
    def __init__(self) -> None:
        self.modules: List[Any] = []
        self.optimizers: List[Any] = []
        self.tensors: List[Any] = []
        self.buffers: List[Any] = []
        self.seen: Set[int] = set()


def _gather(obj: Any, torch: Any, found: _Found, path: str) -> None:
    if obj is None or id(obj) in found.seen:
        return
    if isinstance(obj, ManagedBuffer):
        found.seen.add(id(obj))
        found.buffers.append(obj)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        found.seen.add(id(obj))
        for i, item in enumerate(obj):
            _gather(item, torch, found, f"{path}[{i}]")
        return
    if isinstance(obj, dict):
        found.seen.add(id(obj))
        for key, item in obj.items():
            _gather(item, torch, found, f"{path}[{key!r}]")
        return
    if torch is not None:
        if isinstance(obj, torch.nn.Module):
            found.seen.add(id(obj))
            found.modules.append(obj)
            return
        if isinstance(obj, torch.optim.Optimizer):
            found.seen.add(id(obj))
            found.optimizers.append(obj)
            return
        if isinstance(obj, torch.Tensor):
            found.seen.add(id(obj))
            found.tensors.append(obj)
            return
    raise InvalidInputError(
        f"cleanup_models: cannot empty {path} (a {type(obj).__name__}): pass torch nn.Modules, "
        "optimizers, tensors, gpukeeper ManagedBuffers, or lists/tuples/dicts of them (del "
        "other objects instead); "
        "nothing was emptied"
    )


def cleanup_models(*objs: Any) -> int:
    """Frees the memory held by models, optimizers and tensors while the caller still
    holds their names; returns the bytes freed.

    Accepts ``torch.nn.Module`` (parameters, buffers, gradients and tensor attributes of
    it and its submodules), ``torch.optim.Optimizer`` (its state: moments, steps), tensors,
    gpukeeper ``ManagedBuffer``s (released: a later use raises ``InvalidInputError``), and
    lists/tuples/sets/dicts of them. ``None`` is skipped, on purpose: the pattern
    ``finally: cleanup_models(model)`` must also run when building the model failed
    (``model = None`` before the ``try``), and an optimizer may be optional. Anything else
    (a string, a generator such as ``model.parameters()``, a NumPy array) raises
    ``InvalidInputError`` naming its position and type, before anything is emptied.

    Each tensor's data is swapped for an empty one of the same dtype and device, on every
    device: GPU memory is the point, and CPU objects are emptied too so that the
    behaviour is the same everywhere. After that, using what was emptied fails loudly:
    calling an emptied module (or a submodule) or stepping an emptied optimizer raises
    ``EmptiedObjectError``, and so does any operation that reads, writes or converts an
    emptied tensor (``t.sum()``, ``t + 1``, ``t[0]``, ``t.cpu()``, ``t.numpy()``,
    ``float(t)``), including the module's parameters and buffers and the optimizer's state.
    What remains answers: ``shape`` (now ``(0,)``), ``dtype``, ``device``, ``grad``,
    ``numel()`` (0), ``repr()`` (says it was emptied), and ``model.zero_grad()``.
    Emptying twice is harmless (0 bytes).

    What cannot fail loudly: another tensor object sharing the memory (a view ``t[1]``, a
    ``t.detach()``, a NumPy array from ``t.numpy()``, a tensor an autograd graph saved)
    taken before the cleanup keeps the memory and its values and works as before; those
    bytes are not freed, and not counted. Python numbers read out before (``t.item()``)
    are plain values. Tensor subclasses other than ``nn.Parameter`` are emptied (size 0)
    but not made to raise, since they may handle operations themselves.

    Then synchronizes and releases every framework's cache, so that the memory goes back
    to the driver.
    """
    freed, emptied = empty_objects(*objs)
    if emptied and not device_stuck():
        frameworks.synchronize_all(None)
        frameworks.release_all_caches(None)
    return freed


def emptiable(obj: Any) -> bool:
    """True when ``cleanup_models(obj)`` would empty something rather than raise: a torch
    module, optimizer or tensor, a ManagedBuffer, or a container holding only those."""
    found = _Found()
    try:
        _gather(obj, frameworks.loaded_torch(), found, "value")
    except InvalidInputError:
        return False
    return bool(found.modules or found.optimizers or found.tensors or found.buffers)


def empty_objects(*objs: Any) -> Tuple[int, bool]:
    """``cleanup_models`` without its synchronize-and-release step, for callers that
    release the caches themselves (``GPUContext(release_names=True)``): empties the
    objects and returns ``(bytes freed, whether anything was emptied)``."""
    torch = frameworks.loaded_torch()
    found = _Found()
    for i, obj in enumerate(objs):
        _gather(obj, torch, found, f"argument {i}")
    if not (found.modules or found.optimizers or found.tensors or found.buffers):
        return 0, False

    freed = 0
    for buf in found.buffers:
        if not buf.released:
            freed += int(buf.nbytes)
            buf.release()
    if not (found.modules or found.optimizers or found.tensors):
        return freed, True

    tensors: Dict[int, Any] = {}

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            tensors.setdefault(id(t), t)

    for module in found.modules:
        for sub in module.modules():
            for p in sub._parameters.values():
                if p is not None:
                    add(p)
                    if p.grad is not None:
                        add(p.grad)
            for b in sub._buffers.values():
                add(b)
            for value in vars(sub).values():
                add(value)  # plain tensor attributes (caches, masks) hold memory too
    for opt in found.optimizers:
        for state in opt.state.values():
            if isinstance(state, dict):
                for value in state.values():
                    add(value)
                    if isinstance(value, (list, tuple)):
                        for v in value:
                            add(v)
    for t in found.tensors:
        add(t)
        if t.grad is not None:
            add(t.grad)

    freed += _empty_tensors(torch, list(tensors.values()))
    tensors.clear()

    for module in found.modules:
        for name, sub in module.named_modules():
            label = type(sub).__name__ + (f" ({name})" if name else "")
            try:
                sub._gpukeeper_emptied = True
                sub.forward = _EmptiedCall(
                    label,
                    "its parameters and buffers no longer hold memory; "
                    "build or load the model again",
                )
            except Exception:
                pass  # e.g. a TorchScript module refuses new attributes: emptied, unmarked
            for p in sub._parameters.values():
                if p is not None:
                    p.grad = None
    for opt in found.optimizers:
        opt._gpukeeper_emptied = True
        opt.step = _EmptiedCall(
            type(opt).__name__, "its state no longer holds memory; make a new optimizer"
        )
    return freed, True


def _empty_tensors(torch: Any, tensors: List[Any]) -> int:
    """Swaps each tensor's data for an empty tensor and marks it emptied (a later use
    raises); returns the bytes of the storages that died."""
    StorageWeakRef = frameworks.torch_storage_weakref()
    watched: Dict[Tuple[str, int], Tuple[Any, int]] = {}
    for t in tensors:
        if is_emptied(t):
            continue  # emptied before: nothing left to free
        try:
            storage = t.untyped_storage()
            key = (str(t.device), int(storage.data_ptr()))
            if key[1] and key not in watched and StorageWeakRef is not None:
                watched[key] = (StorageWeakRef(storage), int(storage.nbytes()))
            del storage
        except Exception:
            pass  # sparse and other storage-less layouts: emptied, not counted
        was = (tuple(t.shape), t.dtype, t.device)
        if _swap_data(torch, t):
            mark_emptied(torch, t, was)
    return sum(nbytes for ref, nbytes in watched.values() if ref.expired())


def _swap_data(torch: Any, t: Any) -> bool:
    """Points ``t`` (this tensor object only, not other views of its storage) at an empty
    tensor of its dtype and device; False when torch refuses every way."""
    empty = torch.empty(0, dtype=t.dtype, device=t.device)
    try:
        t.data = empty
        return True
    except Exception:
        pass
    # Some subclasses refuse .data; inference tensors accept set_ only in inference mode.
    # Never untyped_storage().resize_(0): every alias would then read a null pointer.
    for mode in (torch.no_grad, torch.inference_mode):
        try:
            with mode():
                t.set_(empty)
            return True
        except Exception:
            continue
    return False

"""Tensors sent through ``torch.multiprocessing`` that never leave a process waiting.

A ``torch.multiprocessing`` queue pickles what ``put()`` is given in a feeder thread:
``put()`` returns at once. When a tensor cannot be shared (an allocator that cannot export
its memory, a system that refuses the descriptors, a non-leaf tensor that requires grad),
that thread prints the error and drops the item. The sender goes on, and a receiver that
calls ``get()`` without a timeout, as most code does, waits forever.

``install()`` (run by ``use_torch_allocator()``) wraps the reducers PyTorch registers for
tensors and storages: a failure to share becomes an item that raises ``GpuError`` with the
sender's message where the receiver unpickles it, that is inside the receiver's ``get()``,
and the sender gets a ``RuntimeWarning`` saying what was not sent. What shares fine is
pickled exactly as before.
"""

from __future__ import annotations

import warnings
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Dict, Tuple

from gpukeeper.base.errors import GpuError

__all__ = ["install", "uninstall", "is_installed"]

Reducer = Callable[[Any], Tuple[Any, ...]]

# The registrations replaced, to put back: {class: PyTorch's reducer}.
_replaced: Dict[type, Reducer] = {}


def raise_unsent(message: str) -> None:
    """What the receiver runs in place of the object that could not be sent."""
    raise GpuError(message)


def _guarded(original: Reducer) -> Reducer:
    def reduce(obj: Any) -> Tuple[Any, ...]:
        try:
            return original(obj)
        except Exception as exc:  # every failure must reach the receiver, whatever it is
            what = f"{type(obj).__name__} on {getattr(obj, 'device', 'the host')}"
            message = (
                f"the sending process could not share a {what} through torch.multiprocessing: "
                f"{type(exc).__name__}: {exc}"
            )
            warnings.warn(
                f"{message}. The receiver gets a GpuError in its place instead of waiting for it",
                RuntimeWarning,
                stacklevel=2,
            )
            return (raise_unsent, (message,))

    reduce.__wrapped__ = original  # type: ignore[attr-defined]
    return reduce


def _registered() -> Dict[type, Reducer]:
    # ForkingPickler.register() writes into this class-level table; there is no reader.
    table = getattr(ForkingPickler, "_extra_reducers", None)
    return table if isinstance(table, dict) else {}


def install(torch: Any) -> None:
    """Wraps PyTorch's tensor and storage reducers (see the module's text). Idempotent."""
    reductions = torch.multiprocessing.reductions
    originals = {
        getattr(reductions, name, None)
        for name in (
            "reduce_tensor",
            "reduce_storage",
            "reduce_typed_storage",
            "reduce_typed_storage_child",
            "reduce_nested_tensor",
            "reduce_sparse_tensor",
        )
    } - {None}
    for cls, reducer in list(_registered().items()):
        if cls not in _replaced and reducer in originals:
            _replaced[cls] = reducer
            ForkingPickler.register(cls, _guarded(reducer))


def uninstall() -> None:
    """Puts PyTorch's own reducers back."""
    for cls, reducer in _replaced.items():
        ForkingPickler.register(cls, reducer)
    _replaced.clear()


def is_installed() -> bool:
    """Whether tensors and storages are pickled through the guard."""
    return bool(_replaced)

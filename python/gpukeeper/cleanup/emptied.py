"""Tensors emptied by ``cleanup_models``: reading one raises instead of answering 0.

Swapping a tensor's data for an empty one frees its memory, but leaves a tensor that
``sum()``s to 0 and ``mean()``s to nan without a word. Releasing the storage in place
(``untyped_storage().resize_(0)``, as FSDP does between uses) keeps the shape, but in
torch 2.13 most operations then read through a null pointer: a segfault on the CPU, an
illegal address (which poisons the CUDA context) on a GPU. So an emptied tensor keeps
the empty data and changes class: to a subclass of its own whose ``__torch_function__``
raises ``EmptiedObjectError`` for every operation that would read, write or convert it.
Attribute reads and writes (``shape``, ``dtype``, ``device``, ``grad``, ``grad = None``)
and size queries still answer (the size is 0), so code that inspects a cleaned-up model,
``zero_grad()`` included, keeps working; ``repr()`` says what happened instead of raising,
so that tracebacks, debuggers and logs can still show the object.

Only plain tensors and ``nn.Parameter``s change class: a subclass of someone else's may
have its own ``__torch_function__``/``__torch_dispatch__`` or a C layout, and is only
emptied (size 0).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from gpukeeper.base.errors import EmptiedObjectError
from gpukeeper.frameworks import torch_dtype_name

# The attribute (in the tensor's __dict__) holding what the tensor was: shape, dtype, device.
_WAS = "_gpukeeper_emptied"

# Calls that only look at the (now empty) metadata: they answer, not raise.
_METADATA = frozenset(
    {
        "__get__",
        "__set__",
        "__hash__",
        "numel",
        "nelement",
        "size",
        "dim",
        "ndimension",
        "element_size",
        "stride",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "get_device",
        "requires_grad_",
    }
)

# Made on first use: gpukeeper never imports torch itself.
_classes: Dict[type, type] = {}


def _describe(was: Optional[Tuple[Any, ...]]) -> str:
    if was is None:
        return "this tensor"
    shape, dtype, device = was
    return f"this tensor (shape {tuple(shape)}, {torch_dtype_name(dtype)}, on {device})"


def _find_was(args: Any, kwargs: Any) -> Optional[Tuple[Any, ...]]:
    """What the first emptied tensor among the arguments was (one level of lists deep)."""
    pending = list(args) + list((kwargs or {}).values())
    for item in pending[:]:
        if isinstance(item, (list, tuple)):
            pending.extend(item)
    for item in pending:
        was = getattr(item, "__dict__", {}).get(_WAS)
        if was is not None:
            return was
    return None


def _torch_function(
    tensor_tf: Any, cls: type, func: Any, types: Any, args: Any = (), kwargs: Any = None
) -> Any:
    name = getattr(func, "__name__", "")
    if name in _METADATA:
        # torch.Tensor's own handling for both classes (Parameter's would hand back plain
        # tensors): a tensor an attribute read returns (``.data``) is emptied too.
        out = tensor_tf(cls, func, types, args, kwargs or {})
        if isinstance(out, cls) and _WAS not in out.__dict__:
            was = _find_was(args, kwargs)
            if was is not None:
                out.__dict__[_WAS] = was
        return out
    was = _find_was(args, kwargs)
    if name in ("__repr__", "__format__", "__str__"):
        return (
            f"<{_describe(was).replace('this tensor', 'a tensor', 1)} "
            "emptied by gpukeeper.cleanup_models()>"
        )
    raise EmptiedObjectError(
        f"{_describe(was)} was emptied by cleanup_models(): its memory is gone, so "
        f"{name or func!r} cannot use it; make the tensor again (a view or copy taken "
        "before the cleanup still holds its values)"
    )


def _emptied_class(torch: Any, base: type) -> Optional[type]:
    """The emptied twin of ``base`` (made once), or None for classes that keep theirs."""
    if base not in (torch.Tensor, torch.nn.Parameter):
        return None
    cls = _classes.get(base)
    if cls is None:
        tensor_tf = torch.Tensor.__torch_function__.__func__

        def torch_function(
            cls: type, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return _torch_function(tensor_tf, cls, func, types, args, kwargs)

        cls = type(
            "Emptied" + base.__name__,
            (base,),
            {"__torch_function__": classmethod(torch_function), "__module__": __name__},
        )
        _classes[base] = cls
    return cls


def is_emptied(t: Any) -> bool:
    """Whether ``t`` is a tensor that ``mark_emptied`` turned into an emptied one."""
    return type(t) in _classes.values()


def mark_emptied(torch: Any, t: Any, was: Tuple[Any, ...]) -> bool:
    """Makes ``t`` (whose data was already swapped for an empty tensor) raise on use;
    ``was`` is its (shape, dtype, device) before. False for classes left as they are."""
    cls = _emptied_class(torch, type(t))
    if cls is None:
        return False
    try:
        t.__dict__[_WAS] = was
        t.__class__ = cls
    except (TypeError, AttributeError):
        return False  # a layout Python will not swap: emptied (size 0), not marked
    return True

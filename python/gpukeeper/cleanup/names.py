"""``GPUContext(release_names=True)``: empties what a block bound to names, since a
``with`` block is not a scope and those names outlive it."""

from __future__ import annotations

import weakref
from types import FrameType
from typing import Any, Dict, List, Optional, Tuple

from gpukeeper.cleanup.frames import frame_locals
from gpukeeper.cleanup.models import emptiable, empty_objects

# name -> (id of the value, a weak reference to it when it takes one): enough to see a
# rebinding without keeping the old value alive through the block.
NameSnapshot = Dict[str, Tuple[int, Optional[weakref.ref]]]


def _weak(value: Any) -> Optional[weakref.ref]:
    try:
        return weakref.ref(value)
    except TypeError:
        return None


def snapshot_names(frame: Optional[FrameType]) -> NameSnapshot:
    """What each local name of ``frame`` is bound to, on entry."""
    return {name: (id(value), _weak(value)) for name, value in frame_locals(frame).items()}


def _same(entry: Tuple[int, Optional[weakref.ref]], value: Any) -> bool:
    ident, ref = entry
    if ref is not None:
        return ref() is value  # an id alone could be reused by a new object
    return ident == id(value)


def release_new_names(before: NameSnapshot, frame: Optional[FrameType]) -> Tuple[List[str], int]:
    """Empties (as ``cleanup_models`` does) the objects bound in the block to new or
    rebound names of ``frame``; returns the names emptied and the bytes freed. Objects
    that were already bound to a name on entry (``alias = model``) are left alone."""
    now = frame_locals(frame)
    try:
        known = {id(ref()) for _, ref in before.values() if ref is not None and ref() is not None}
        known |= {ident for ident, ref in before.values() if ref is None}
        names: List[str] = []
        values: List[Any] = []
        for name, value in now.items():
            entry = before.get(name)
            if entry is not None and _same(entry, value):
                continue
            if id(value) in known or not emptiable(value):
                continue
            names.append(name)
            values.append(value)
        if not values:
            return [], 0
        freed, _ = empty_objects(*values)
        return names, freed
    finally:
        now.clear()

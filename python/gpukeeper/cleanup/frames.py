"""Reading the names of the frame that runs a ``with`` block, without keeping them alive."""

from __future__ import annotations

import inspect
import sys
from types import FrameType, TracebackType
from typing import Any, Dict, Optional

# Before Python 3.13 (PEP 667) a function frame's ``f_locals`` is a dict the frame keeps
# until it ends: reading it would keep every local alive after the user's ``del``.
_SNAPSHOT_DICT = sys.version_info < (3, 13)


def caller_frame(depth: int) -> Optional[FrameType]:
    """The frame ``depth`` levels above the caller of this function (None if none)."""
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None


def frame_locals(frame: Optional[FrameType]) -> Dict[str, Any]:
    """A copy of ``frame``'s local names (its globals for module-level code).

    The copy holds the values strongly: drop it promptly. For a function frame the
    snapshot dict that CPython < 3.13 keeps on the frame is emptied again, so that the
    frame's later ``del`` still frees the objects (a tracer that writes locals back first
    re-reads them, so nothing is lost). Module and class namespaces are never touched.
    """
    if frame is None:
        return {}
    try:
        snapshot = frame.f_locals
        values = dict(snapshot)
    except Exception:
        return {}
    if (
        _SNAPSHOT_DICT
        and frame.f_code.co_flags & inspect.CO_OPTIMIZED
        and isinstance(snapshot, dict)
    ):
        snapshot.clear()
    return values


def clear_traceback_frames(tb: Optional[TracebackType]) -> None:
    """``traceback.clear_frames(tb)``, and the ``f_locals`` snapshots of the cleared
    function frames emptied too: before Python 3.13 ``frame.clear()`` leaves the dict a
    traceback formatter (IPython's) read from ``f_locals``, holding every local.

    A frame still executing (the one whose ``with`` block raised) cannot be cleared and
    its ``f_locals`` is never read here: the read would snapshot its live locals into a
    dict that outlives the user's later ``del``.
    """
    while tb is not None:
        frame = tb.tb_frame
        try:
            frame.clear()
        except RuntimeError:
            pass  # executing or suspended: its locals are the running code's own
        else:
            if _SNAPSHOT_DICT and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
                try:
                    # Read only for its side effect: reading f_locals re-syncs the snapshot
                    # dict from the cleared frame, so the dict empties.
                    _ = frame.f_locals
                except Exception:
                    pass
        tb = tb.tb_next

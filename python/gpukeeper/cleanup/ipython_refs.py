"""What IPython keeps after a cell, and what gpukeeper drops from it.

IPython keeps the last failed cell's traceback (``sys.last_traceback``, whose frames
hold the locals of the calls that failed) and every displayed result (``Out``, ``_``,
``__``, ``___``, ``_N``, the displayhook and the last ``ExecutionResult``). Either keeps
device memory alive, out of reach of ``del``.

Automatic, once a ``GPUContext`` ran in the shell (a ``post_run_cell`` hook):

* after a failed cell, when the exception (or one it was raised from) left a
  ``GPUContext`` (without ``keep_traceback_locals=True``), the frames of the traceback
  are cleared and the caches released: post-mortem ``%debug`` then sees no locals;
* a result in the output history that holds objects a ``GPUContext`` armed (memory
  still held at its exit) is dropped from it once nothing but the history refers to
  it, so that ``del`` of the last name gives the memory back after that cell.

Explicit: :func:`release_ipython_references` drops every result holding device memory
(or gpukeeper buffers) from the history, whoever else refers to it.
"""

from __future__ import annotations

import gc
import re
import sys
import warnings
import weakref
from typing import Any, List, Optional, Set

from gpukeeper import frameworks
from gpukeeper._core import ManagedBuffer
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.process_life import device_stuck
from gpukeeper.cleanup import deferred
from gpukeeper.cleanup.frames import clear_traceback_frames

_HISTORY_NAME = re.compile(r"_+|_\d+")
_PLAIN_UNDERSCORES = ("_", "__", "___")
_MAX_VISITED = 20_000  # bound on the objects walked to see what a result holds

# Set on an exception that left a GPUContext: builtin exceptions take no weak reference,
# and a strong one would keep the very frames this is about alive.
_MARK = "_gpukeeper_left_context"
_shells: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _shell() -> Any:
    """The running IPython shell, or None (IPython is never imported here)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        return ipython.get_ipython()
    except Exception:
        return None


def watch_shell() -> None:
    """Installs the ``post_run_cell`` hook in the running shell, once (no-op outside)."""
    shell = _shell()
    if shell is None or shell in _shells:
        return
    try:
        shell.events.register("post_run_cell", _after_cell)
        _shells.add(shell)
    except Exception:
        pass  # an embedding without events: the explicit helper still works


def note_failed_block(exc: Optional[BaseException]) -> None:
    """A GPUContext block raised ``exc``: if it reaches IPython's last traceback, its
    frames are cleared after the cell."""
    if exc is None or _shell() is None:
        return
    try:
        setattr(exc, _MARK, True)
    except Exception:
        return  # an exception type without attributes: its traceback is left alone
    watch_shell()


def _last_exception() -> Optional[BaseException]:
    value = getattr(sys, "last_exc", None)  # Python 3.12+
    return value if value is not None else getattr(sys, "last_value", None)


def _chain(exc: Optional[BaseException]) -> List[BaseException]:
    out: List[BaseException] = []
    while exc is not None and all(exc is not e for e in out) and len(out) < 100:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def _clear_last_traceback(only_seen: bool) -> bool:
    chain = _chain(_last_exception())
    if not chain or (only_seen and not any(getattr(e, _MARK, False) for e in chain)):
        return False
    tb = getattr(sys, "last_traceback", None)
    if tb is not None:
        clear_traceback_frames(tb)
    for exc in chain:
        if exc.__traceback__ is not None:
            clear_traceback_frames(exc.__traceback__)
        if getattr(exc, _MARK, False):
            try:
                delattr(exc, _MARK)  # once is enough
            except Exception:
                pass
    return True


def _release_caches() -> None:
    if device_stuck():
        return
    frameworks.synchronize_all(None)
    frameworks.release_all_caches(None)


# --------------------------------------------------------------------- output history


def _holds(value: Any, hit: Any) -> bool:
    """Whether ``value`` or what it refers to (a few levels deep) satisfies ``hit``."""
    seen: Set[int] = set()
    level = [value]
    for _depth in range(4):
        nxt: List[Any] = []
        for obj in level:
            if id(obj) in seen or isinstance(obj, (type, type(sys))):
                continue  # classes and modules lead to everything
            seen.add(id(obj))
            if hit(obj):
                return True
            if len(seen) < _MAX_VISITED:
                nxt.extend(gc.get_referents(obj))
        level = nxt
    return False


def _holds_device_memory(armed: Set[int]) -> Any:
    framework_array = frameworks.device_array_predicate()

    def hit(obj: Any) -> bool:
        if id(obj) in armed:
            return True
        if type(obj) is ManagedBuffer:
            return not obj.released
        return framework_array(obj)

    return hit


def _is_history_name(key: Any) -> bool:
    return isinstance(key, str) and _HISTORY_NAME.fullmatch(key) is not None


def _keys_of(ns: Any, value: Any) -> List[Any]:
    keys = []
    for key, item in ns.items():  # a plain loop: a closure over value would refer to it
        if item is value:
            keys.append(key)
    return keys


def _history_only(shell: Any, value: Any) -> bool:
    """Whether nothing but IPython's output history refers to ``value`` (as far as the
    collector sees: containers it does not track are invisible, and only history
    entries are ever dropped, never the object itself)."""
    namespaces = (shell.user_ns, getattr(shell, "user_ns_hidden", None))
    hook_dict = getattr(shell.displayhook, "__dict__", None)
    out = shell.user_ns.get("Out")
    for ref in gc.get_referrers(value):
        if ref is out or ref is shell.displayhook or ref is hook_dict:
            continue
        if type(ref).__name__ == "ExecutionResult":
            continue
        if any(ref is ns for ns in namespaces):
            for key in _keys_of(ref, value):
                if not _is_history_name(key):
                    return False  # a user's name in the namespace
            continue
        return False
    return True


def _forget(shell: Any, value: Any) -> None:
    """Removes ``value`` from every place of IPython's output history."""
    out = shell.user_ns.get("Out")
    if isinstance(out, dict):
        for key in _keys_of(out, value):
            del out[key]
    for ns in (shell.user_ns, getattr(shell, "user_ns_hidden", None)):
        if not isinstance(ns, dict):
            continue
        for key in _keys_of(ns, value):
            if not _is_history_name(key):
                continue
            if key in _PLAIN_UNDERSCORES:
                ns[key] = ""  # what IPython starts them with
            else:
                del ns[key]
    for attr in _PLAIN_UNDERSCORES:
        if getattr(shell.displayhook, attr, None) is value:
            setattr(shell.displayhook, attr, "")
    for ref in gc.get_referrers(value):
        if type(ref).__name__ == "ExecutionResult" and getattr(ref, "result", None) is value:
            ref.result = None


def _drop_outputs(shell: Any, hit: Any, only_history: bool) -> int:
    out = shell.user_ns.get("Out")
    if not isinstance(out, dict):
        return 0
    dropped = 0
    for key in list(out):
        value = out.get(key)
        if value is None or not _holds(value, hit):
            continue
        if only_history and not _history_only(shell, value):
            continue
        _forget(shell, value)
        dropped += 1
    return dropped


def _after_cell(*_args: Any) -> None:
    """IPython's post_run_cell hook; never raises into the shell."""
    try:
        shell = _shell()
        if shell is None:
            return
        cleared = _clear_last_traceback(only_seen=True)
        armed = deferred.armed_ids()
        if armed:
            _drop_outputs(shell, lambda obj: id(obj) in armed, only_history=True)
        if cleared:
            _release_caches()
    except Exception as e:
        try:
            # stacklevel=2: the warning points at whoever ran the hook (IPython's event
            # trigger, after the user's cell), not at this line.
            warnings.warn(
                f"gpukeeper: after the cell: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=2
            )
        except Exception:
            pass


def release_ipython_references(shell: Any = None) -> int:
    """Drops what an IPython shell keeps that holds device memory; returns the number
    of output-history entries dropped.

    Clears the frames of the last traceback (``%debug`` then sees no locals), removes
    from the output history (``Out``, ``_``, ``__``, ``___``, ``_N``) every result that
    holds CUDA tensors, CuPy arrays, gpukeeper ``ManagedBuffer``s or objects a
    ``GPUContext`` armed (a few references deep: a tuple of tensors, a module), even if
    a name still refers to it, then synchronizes and releases every framework's cache.
    ``shell``: the running shell when None (outside IPython: nothing to do, 0).
    """
    if shell is None:
        shell = _shell()
        if shell is None:
            return 0
    elif not isinstance(getattr(shell, "user_ns", None), dict) or not hasattr(shell, "displayhook"):
        raise InvalidInputError(
            "release_ipython_references: shell must be an IPython InteractiveShell, "
            f"got {type(shell).__name__}"
        )
    _clear_last_traceback(only_seen=False)
    dropped = _drop_outputs(shell, _holds_device_memory(deferred.armed_ids()), only_history=False)
    _release_caches()
    return dropped

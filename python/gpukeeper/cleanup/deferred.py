"""Releasing the caches later, when memory still held at a ``GPUContext`` exit is freed.

A ``with`` block is not a scope: ``model`` bound inside it is alive at ``__exit__``, so
the caches emptied there cannot hold its memory yet, and after a later ``del model`` the
memory goes back to the framework's cache, not to the driver. When memory is still held
above the baseline at exit, the context arms a finalizer (``weakref.finalize``) on every
live object that may hold it: the tensors and arrays on those devices (grouped by the
allocation they share) and gpukeeper ``ManagedBuffer``s there. When they die, this
module synchronizes and releases the caches of the context's devices:

* **at once** when the held memory is gone (every armed allocation died, or the
  frameworks' allocated bytes are back at the baseline). A finalizer runs while its
  object is being destroyed, before PyTorch or CuPy free its memory, so the release is
  made at the next call the dying thread makes after the statement that freed it (a
  one-shot C-level profile hook, ``PyEval_SetProfile``): ``del model`` then
  ``torch.cuda.memory_reserved()`` sees the memory back.
* **after a short quiet time** otherwise (some of it freed): later deaths push the
  timer back (at most ``_MAX_WAIT_S`` in all), so a loop of deletes costs one release.

Only weak references are kept. Finalizers never raise (a failure is a
``RuntimeWarning``). Everything is disarmed when the memory is back, when a later
``GPUContext`` on the same devices arms its own finalizers (it takes over, keeping the
older baseline), at interpreter exit and in a forked child.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import warnings
import weakref
from types import FrameType
from typing import Any, Dict, List, Optional, Set, Tuple

from gpukeeper import frameworks
from gpukeeper._core import ManagedBuffer
from gpukeeper.base import process_life
from gpukeeper.base.byte_figures import fmt_bytes
from gpukeeper.cleanup.cleanup_report import Snapshot
from gpukeeper.cleanup.frames import frame_locals
from gpukeeper.cleanup.measure import (
    HOST,
    devices_in_use,
    held_above,
    level_of,
    measure,
    release_caches,
    synchronize_devices,
)

# Quiet time after a partial death before the caches are released, and the longest a
# stream of deaths may postpone that release.
_DEBOUNCE_S = 0.05
_MAX_WAIT_S = 0.5
# Without the profile hook (another profiler holds sys.setprofile) a final release waits
# this long instead, so that the object's memory is surely freed first.
_FALLBACK_S = 0.005
# Events the hook lets pass while the statement that killed the object has not ended
# (a collection started inside a long call): then the timer takes over.
_MAX_EVENTS = 10_000


class _Group:
    """The armed objects that share one allocation: it is freed when they all died."""

    __slots__ = ("alive",)

    def __init__(self) -> None:
        self.alive = 0


class _Arming:
    """The finalizers of one GPUContext exit, and what to release when they fire."""

    def __init__(self, fixed: Optional[List[int]], baseline: Snapshot, locations: Set[str]) -> None:
        self.fixed = fixed
        self.baseline = baseline
        self.locations = locations
        self.finalizers: List[weakref.finalize] = []
        self.groups_alive = 0
        self.done = False
        self.due: Optional[float] = None
        self.first_due: Optional[float] = None


class _Releases:
    """The deferred releases of this process (the one instance is ``_S``).

    ``lock`` guards the rest; ``cond`` (on it) wakes the timer thread. ``armings``: the
    contexts whose held memory is awaited; ``worker``: the timer thread while armings
    exist; ``closing``: the interpreter is exiting, nothing more is armed;
    ``exit_registered``: ``_shutdown`` is registered to run at exit; ``tls``: per thread,
    the statement the one-shot hook waits for (``pending`` armings, ``trigger`` frame,
    its ``lasti`` and the ``events`` seen inside it). A forked child starts afresh.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.armings: List[_Arming] = []
        self.worker: Optional[threading.Thread] = None
        self.closing = False
        self.exit_registered = False
        self.tls = threading.local()


_S = _Releases()
# Frames of the finalizer machinery, skipped when looking for the statement that freed.
_SKIP_FILES: Set[str] = set()


def _warn(what: str, error: BaseException) -> None:
    """A finalizer or hook must not raise: say what failed, and swallow even that."""
    try:
        warnings.warn(
            f"gpukeeper: deferred cache release: {what} failed: {type(error).__name__}: {error}",
            RuntimeWarning,
            stacklevel=2,
        )
    except Exception:
        pass  # warnings turned into errors: nothing else can be done in a finalizer


# --------------------------------------------------------------------- arming


def _merge(a: Snapshot, b: Snapshot) -> Snapshot:
    """Per location and framework, the lower of two baselines (absent counts as 0)."""
    out: Snapshot = {}
    for loc in a.keys() & b.keys():
        for name in a[loc].keys() & b[loc].keys():
            ma, mb = a[loc][name], b[loc][name]
            la, lb = level_of(ma), level_of(mb)
            if la is None or lb is None:
                continue
            out.setdefault(loc, {})[name] = ma if la <= lb else mb
    return out


def _live_buffers(frame: Optional[FrameType]) -> List[ManagedBuffer]:
    """Unreleased ManagedBuffers Python can reach. They are not tracked by the collector,
    so they are found through what refers to them: tracked objects, and the names of the
    frame that ran the block (a function's locals are no object the collector lists)."""
    found: Dict[int, ManagedBuffer] = {}
    for ref in gc.get_referents(*gc.get_objects()):
        if type(ref) is ManagedBuffer and not ref.released:
            found[id(ref)] = ref
    for value in frame_locals(frame).values():
        if type(value) is ManagedBuffer and not value.released:
            found[id(value)] = value
    return list(found.values())


def _holders(
    pairs: Set[Tuple[str, str]], frame: Optional[FrameType]
) -> List[Tuple[str, int, List[Any]]]:
    """``(location, bytes, objects)`` per allocation that may hold memory where ``pairs``
    (location, framework) are held."""
    out: List[Tuple[str, int, List[Any]]] = []
    array_frameworks = frameworks.array_frameworks()
    array_locs = {loc for loc, name in pairs if name in array_frameworks and loc != HOST}
    if array_locs:
        # One walk of the heap for every device (None: all CUDA devices).
        only = int(next(iter(array_locs)).split(":", 1)[1]) if len(array_locs) == 1 else None
        for entry, objs in frameworks.live_array_holders(only):
            if (entry.device, entry.framework) in pairs:
                out.append((entry.device, entry.nbytes, objs))
    buffer_locs = {loc for loc, name in pairs if name == "gpukeeper"}
    if buffer_locs:
        for buf in _live_buffers(frame):
            loc = HOST if buf.kind in ("host", "pinned") else f"cuda:{buf.device}"
            if loc in buffer_locs:
                out.append((loc, int(buf.nbytes), [buf]))
    return out


def arm(
    *,
    fixed: Optional[List[int]],
    baseline: Snapshot,
    after: Snapshot,
    frame: Optional[FrameType] = None,
) -> Tuple[int, str]:
    """Arms finalizers on what holds memory above ``baseline`` in ``after``; returns the
    number of objects armed and a note for the report. Armings of earlier contexts whose
    locations ``after`` covers are taken over: their baseline is kept (the lower one),
    their objects re-armed here, and they are disarmed."""
    with _S.lock:
        if _S.closing:
            return 0, ""
        taken = [a for a in _S.armings if a.locations <= set(after)]
    merged = baseline
    for old in taken:
        merged = _merge(merged, old.baseline)
    held = held_above(merged, after)
    pairs = {(loc, name) for loc, per in held.items() for name in per}
    if not pairs:
        return 0, ""
    total = sum(sum(per.values()) for per in held.values())
    holders = _holders(pairs, frame)
    arming = _Arming(fixed, merged, {loc for loc, _ in pairs})
    objects = 0
    for _loc, _nbytes, objs in holders:
        group = _Group()
        for obj in objs:
            try:
                fin = weakref.finalize(obj, _died, arming, group)
            except TypeError:
                continue  # no weak references to it: its death cannot be seen
            fin.atexit = False
            arming.finalizers.append(fin)
            group.alive += 1
        if group.alive:
            arming.groups_alive += 1
            objects += group.alive
    holders.clear()
    if not objects:
        return 0, (
            f"{fmt_bytes(total)} still held at exit, but no live tensor, array or ManagedBuffer "
            "holding it was found: nothing armed (cleanup_cuda() releases the caches later)"
        )
    with _S.lock:
        for old in taken:
            _disarm(old)
        _S.armings.append(arming)
        if not _S.exit_registered:
            process_life.at_exit(_shutdown)
            _S.exit_registered = True
        _ensure_worker()
    return objects, (
        f"{objects} object(s) still held {fmt_bytes(total)} at exit: the caches are released "
        "as soon as they die (del them), without another call"
    )


def _disarm(arming: _Arming) -> None:
    """Under the lock: detaches every finalizer of ``arming`` and forgets it."""
    arming.done = True
    arming.due = arming.first_due = None
    for fin in arming.finalizers:
        fin.detach()
    arming.finalizers.clear()
    try:
        _S.armings.remove(arming)
    except ValueError:
        pass


def disarm_all() -> int:
    """Detaches every armed finalizer (nothing is released); returns how many armings
    there were."""
    with _S.cond:
        armings = list(_S.armings)
        for arming in armings:
            _disarm(arming)
        _S.cond.notify_all()
        return len(armings)


def armed_objects() -> int:
    """The number of objects whose death is awaited."""
    with _S.lock:
        return sum(1 for a in _S.armings for f in a.finalizers if f.alive)


def armed_ids() -> Set[int]:
    """``id()`` of each armed object still alive (no reference to them is kept)."""
    ids: Set[int] = set()
    with _S.lock:
        finalizers = [f for a in _S.armings for f in a.finalizers]
    for fin in finalizers:
        info = fin.peek()
        if info is not None:
            ids.add(id(info[0]))
        del info
    return ids


# --------------------------------------------------------------------- deaths


def _died(arming: _Arming, group: _Group) -> None:
    """The finalizer: one armed object died (its memory is not freed yet)."""
    try:
        with _S.lock:
            if arming.done:
                return
            group.alive -= 1
            if group.alive > 0:
                return  # another view of the allocation still holds it
            arming.groups_alive -= 1
            now = time.monotonic()
            if arming.first_due is None:
                arming.first_due = now
            arming.due = min(now + _DEBOUNCE_S, arming.first_due + _MAX_WAIT_S)
            if not _watch_next_call(arming):
                arming.due = min(arming.due, now + _FALLBACK_S)
            _S.cond.notify_all()
    except Exception as e:
        _warn("a finalizer", e)


def _watch_next_call(arming: _Arming) -> bool:
    """Checks ``arming`` at the first call this thread makes once the statement that
    killed the object has ended (its memory is freed by then); False when that cannot be
    watched (another profiler is installed, or this is not CPython)."""
    hook = process_life.statement_hook(_on_hook_event)
    if not hook.available:
        return False
    tls = _S.tls
    pending = getattr(tls, "pending", None)
    if hook.taken_by_other():
        tls.pending = tls.trigger = None  # replaced by another profiler
        return False
    if pending is not None and hook.on_here():
        if arming not in pending:
            pending.append(arming)
        return True
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in _SKIP_FILES:
        frame = frame.f_back
    tls.pending = [arming]
    tls.trigger = frame
    tls.lasti = frame.f_lasti if frame is not None else -1
    tls.events = 0
    hook.on()
    return True


def _on_hook_event() -> None:
    """The statement hook's callback. With monitoring, every thread's events arrive
    here: only a thread that waits for its statement acts."""
    if getattr(_S.tls, "pending", None) is not None:
        _after_statement()


def _after_statement() -> None:
    """The one-shot hook: waits until the statement that killed the object moved on,
    then checks the armings that died there."""
    tls = _S.tls
    hook = process_life.statement_hook(_on_hook_event)
    try:
        trigger = tls.trigger
        if trigger is not None and trigger.f_lasti == tls.lasti and tls.events < _MAX_EVENTS:
            tls.events += 1
            return  # still inside that statement: the memory may not be freed yet
        pending = tls.pending or []
        tls.pending = tls.trigger = None
        hook.off()
        for arming in pending:
            _check(arming, timer=False)
    except Exception as e:
        if getattr(tls, "pending", None) is not None:
            tls.pending = tls.trigger = None
            hook.off()
        _warn("the release after a deletion", e)


def _still_held(arming: _Arming) -> bool:
    held = held_above(arming.baseline, measure(devices_in_use(arming.fixed)))
    return any(loc in arming.locations for loc in held)


def _check(arming: _Arming, timer: bool) -> None:
    """Releases for good when the held memory is gone; on the timer, releases what the
    deaths so far freed and keeps waiting for the rest."""
    with _S.lock:
        if arming.done:
            return
        final = arming.groups_alive == 0
    if not final:
        final = not _still_held(arming)
    if final:
        with _S.cond:
            if arming.done:
                return
            _disarm(arming)
            _S.cond.notify_all()  # the timer thread may stop
    elif not timer:
        return  # the timer, already set by the death, releases what was freed
    _release_caches(arming)


def _release_caches(arming: _Arming) -> None:
    if process_life.device_stuck():
        return  # a synchronization never came back: waiting again would hang
    try:
        devices = devices_in_use(arming.fixed)
        synchronize_devices(arming.fixed, devices)
        release_caches(arming.fixed, devices, {})
    except Exception as e:
        _warn("releasing the caches", e)


# --------------------------------------------------------------------- the timer


def _ensure_worker() -> None:
    """Under the lock: the timer thread runs while armings exist."""
    if _S.worker is None:
        _S.worker = process_life.start_thread("gpukeeper-deferred-release", _run_worker)


def _run_worker() -> None:
    while True:
        with _S.cond:
            while True:
                if _S.closing or not _S.armings:
                    _S.worker = None
                    return
                dues = [a.due for a in _S.armings if a.due is not None]
                now = time.monotonic()
                if dues and min(dues) <= now:
                    break
                _S.cond.wait(min(dues) - now if dues else None)
            ready = [a for a in _S.armings if a.due is not None and a.due <= now]
            for arming in ready:
                arming.due = arming.first_due = None
        for arming in ready:
            try:
                _check(arming, timer=True)
            except Exception as e:
                _warn("the timed release", e)
        del ready


# --------------------------------------------------------------------- process life


def _shutdown() -> None:
    """At interpreter exit: nothing is released any more (the exit guard does that)."""
    with _S.cond:
        _S.closing = True
        for arming in list(_S.armings):
            _disarm(arming)
        _S.cond.notify_all()


def _after_fork_in_child() -> None:
    """A child must not release on its parent's behalf (nor touch CUDA after fork): its
    finalizers are detached, and the locks and the timer thread start afresh."""
    armings = list(_S.armings)
    _S.lock = threading.RLock()
    _S.cond = threading.Condition(_S.lock)
    _S.worker = None
    _S.tls = threading.local()
    for arming in armings:
        _disarm(arming)


_SKIP_FILES.update({_died.__code__.co_filename, weakref.finalize.__call__.__code__.co_filename})
process_life.after_fork_in_child(_after_fork_in_child)

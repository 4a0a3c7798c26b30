"""The process-wide hooks gpukeeper holds, in one state object: exit, fork, signal and
statement hooks, and the threads it starts.

A library that registers hooks with the interpreter from several modules is hard to
reason about: which ``atexit`` handler runs first, what a forked child (a DataLoader
worker) inherits, who owns ``sys.monitoring``'s tool id, which threads are ours. Here
every such hook is made through one function and recorded in :data:`LIFE`, and a forked
child resets it in one place. No other module of the package calls ``atexit``,
``os.register_at_fork``, ``signal.signal``, ``signal.set_wakeup_fd``, ``sys.monitoring``,
``PyEval_SetProfile`` or ``threading.Thread`` (a test reads the source to keep it so).

The cleanup features keep their own data (the deferred releases, the exit guard) and
hand this module what must happen at exit or after a fork.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Union

__all__ = [
    "LIFE",
    "ProcessLife",
    "StatementHook",
    "after_fork_in_child",
    "at_exit",
    "cancel_at_exit",
    "device_stuck",
    "restore_signal_handler",
    "set_signal_handler",
    "set_stuck_probe",
    "set_wakeup_fd",
    "start_thread",
    "statement_hook",
]


class StatementHook:
    """A hook called at the next call or line event of the threads that turned it on: the
    deferred release uses it to act once the statement that freed an object has ended.

    On Python 3.12 and later it is a ``sys.monitoring`` tool (CALL and LINE events):
    there the legacy profile hook is built on monitoring and reports no call of an
    extension's bound method, and monitoring callbacks get no frame, so no ``f_locals``
    copy keeps the freed objects alive. Its events are process-wide, so they stay on
    while any thread is turned on. Before 3.12 it is a C-level profile function set with
    ``PyEval_SetProfile`` in the thread that turns it on, not ``sys.setprofile``: CPython
    copies a frame's locals into ``f_locals`` before each call of a Python-level one,
    and that copy would keep alive the objects the next ``del`` is meant to free.
    """

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self.mode = "none"
        self.tool: Optional[int] = None
        self.watching = 0  # threads turned on (monitoring: the events are process-wide)
        self.lock = threading.Lock()
        self._sentinel = _ProfileSentinel()
        self._set_profile: Any = None
        self._address: Any = None
        self._keep: Any = None  # the C function object: freed, the pointer would dangle
        if sys.version_info >= (3, 12) and hasattr(sys, "monitoring"):
            self._load_monitoring()
        elif sys.version_info < (3, 12):
            self._load_profile()

    def _fire(self) -> None:
        try:
            self._callback()
        except Exception:
            pass  # the callback reports its own failures; a hook must never raise

    def _load_monitoring(self) -> None:
        # Python 3.12+ only, while mypy checks the package as 3.10.
        mon = sys.monitoring  # type: ignore[attr-defined]
        tool = next((i for i in (4, 3) if mon.get_tool(i) is None), None)
        if tool is None:
            return  # every free tool id taken by profilers: the callers fall back
        mon.use_tool_id(tool, "gpukeeper deferred release")
        events = mon.events
        mon.register_callback(tool, events.CALL, lambda *args: self._fire())
        mon.register_callback(tool, events.LINE, lambda *args: self._fire())
        self.tool = tool
        self._monitoring: Any = mon
        self._events = events.CALL | events.LINE
        self.mode = "monitoring"

    def _load_profile(self) -> None:
        try:
            set_profile = ctypes.pythonapi.PyEval_SetProfile
            set_profile.argtypes = [ctypes.c_void_p, ctypes.py_object]
            set_profile.restype = None
            kind = ctypes.CFUNCTYPE(
                ctypes.c_int, ctypes.c_void_p, ctypes.py_object, ctypes.c_int, ctypes.c_void_p
            )
        except Exception:
            return  # not CPython

        def hook(_obj: Any, _frame: Any, _what: int, _arg: Any) -> int:
            try:
                self._fire()
            except BaseException:
                pass  # a C profile function cannot pass an exception on: it returns 0
            return 0

        self._keep = kind(hook)
        self._address = ctypes.cast(self._keep, ctypes.c_void_p)
        self._set_profile = set_profile
        self.mode = "profile"

    @property
    def available(self) -> bool:
        """Whether the hook can be turned on in this interpreter."""
        return self.mode != "none"

    def taken_by_other(self) -> bool:
        """Before 3.12: another profiler holds this thread's profile hook."""
        if self.mode != "profile":
            return False
        current = sys.getprofile()
        return current is not None and current is not self._sentinel

    def on_here(self) -> bool:
        """Whether the hook is on for the calling thread."""
        if self.mode == "monitoring":
            return self.watching > 0
        return self.mode == "profile" and sys.getprofile() is self._sentinel

    def on(self) -> None:
        """Turns the hook on for the calling thread (every thread with monitoring)."""
        if self.mode == "monitoring":
            with self.lock:
                self.watching += 1
                self._monitoring.set_events(self.tool, self._events)
        elif self.mode == "profile":
            self._set_profile(self._address, self._sentinel)

    def off(self) -> None:
        """Turns the hook off for the calling thread (with monitoring, once no thread
        waits any more)."""
        if self.mode == "monitoring":
            with self.lock:
                self.watching = max(0, self.watching - 1)
                if self.watching == 0:
                    self._monitoring.set_events(self.tool, 0)
        elif self.mode == "profile":
            self._set_profile(None, None)

    def reset_after_fork(self) -> None:
        """A forked child has only the forking thread, which waits for nothing."""
        self.lock = threading.Lock()
        if self.mode == "monitoring" and self.watching:
            self.watching = 0
            self._monitoring.set_events(self.tool, 0)


class _ProfileSentinel:
    """What ``sys.getprofile()`` returns while the C-level profile hook is installed."""

    def __repr__(self) -> str:
        return "<gpukeeper deferred-release hook>"


class ProcessLife:
    """Every hook gpukeeper holds in this process; the one instance is :data:`LIFE`.

    Attributes:
        owner_pid: the process the hooks below were made in. A forked child resets the
            state (threads, locks, the statement hook's waiters) at its start.
        exit_hooks: the callables registered with ``atexit`` through :func:`at_exit`, in
            registration order (``atexit`` runs them in reverse).
        fork_hooks: what runs in a forked child, in registration order, after this
            module's own reset: each feature forgets what belongs to its parent.
        signal_handlers: for each signal whose handler gpukeeper set, the handler that
            was there before it.
        wakeup_fd: the fd gpukeeper last gave ``signal.set_wakeup_fd`` (its own while the
            exit guard watches signals, the previous one once it gave that back), or -1.
        threads: the live threads gpukeeper started (all daemons).
        statement_hook: the one-shot hook after a statement, made at its first use and
            not at import, since a monitoring tool id is a process-wide resource that an
            unused cleanup must not take from profilers; None until then.
        stuck_probe: the exit guard's answer to "did a synchronization never come back?",
            asked before anything synchronises again; None without a guard.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.owner_pid = os.getpid()
        self.exit_hooks: List[Callable[[], None]] = []
        self.fork_hooks: List[Callable[[], None]] = []
        self.signal_handlers: Dict[int, Any] = {}
        self.wakeup_fd = -1
        self.threads: List[threading.Thread] = []
        self.statement_hook: Optional[StatementHook] = None
        self.stuck_probe: Optional[Callable[[], bool]] = None

    def live_threads(self) -> List[threading.Thread]:
        """The threads gpukeeper started that are still running."""
        with self.lock:
            self.threads = [t for t in self.threads if t.is_alive()]
            return list(self.threads)


LIFE = ProcessLife()


def at_exit(fn: Callable[[], None]) -> None:
    """Runs ``fn`` at interpreter exit (``atexit``; a later registration runs earlier)."""
    with LIFE.lock:
        atexit.register(fn)
        LIFE.exit_hooks.append(fn)


def cancel_at_exit(fn: Callable[[], None]) -> None:
    """Undoes :func:`at_exit` for ``fn``; nothing happens when it was not registered."""
    with LIFE.lock:
        atexit.unregister(fn)
        LIFE.exit_hooks = [h for h in LIFE.exit_hooks if h != fn]


def after_fork_in_child(fn: Callable[[], None]) -> None:
    """Runs ``fn`` in every child forked from now on, after this module's own reset."""
    with LIFE.lock:
        LIFE.fork_hooks.append(fn)


def start_thread(name: str, target: Callable[[], Any]) -> threading.Thread:
    """Starts ``target`` in a daemon thread named ``name``: nothing gpukeeper runs may
    keep an ending process alive."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    with LIFE.lock:
        LIFE.threads = [t for t in LIFE.threads if t.is_alive()] + [thread]
    return thread


def set_signal_handler(signum: int, handler: Union[Callable[[int, Any], Any], int]) -> Any:
    """Installs ``handler`` (a function, ``SIG_DFL`` or ``SIG_IGN``) for ``signum`` (main
    thread only: ``ValueError`` otherwise) and returns the handler it replaced."""
    with LIFE.lock:
        previous = signal.signal(signum, handler)
        LIFE.signal_handlers.setdefault(int(signum), previous)
        return previous


def restore_signal_handler(signum: int, ours: Any, previous: Any) -> bool:
    """Puts ``previous`` back for ``signum`` (SIG_DFL for None) if ``ours`` is still the
    handler; False when someone replaced it since (theirs is left in place) or when this
    is not the main thread."""
    with LIFE.lock:
        LIFE.signal_handlers.pop(int(signum), None)
        try:
            if signal.getsignal(signum) is not ours:
                return False
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            return True
        except (ValueError, OSError):
            return False


def set_wakeup_fd(fd: int, *, warn_on_full_buffer: bool = True) -> int:
    """``signal.set_wakeup_fd`` (main thread only), recorded; returns the previous fd."""
    with LIFE.lock:
        previous = signal.set_wakeup_fd(fd, warn_on_full_buffer=warn_on_full_buffer)
        LIFE.wakeup_fd = fd
        return previous


def statement_hook(callback: Callable[[], None]) -> StatementHook:
    """The process's statement hook, made with ``callback`` at the first call (its one
    user is the deferred release; later calls return the same hook)."""
    hook = LIFE.statement_hook
    if hook is not None:
        return hook  # the hook's events ask for it: no lock once it exists
    with LIFE.lock:
        if LIFE.statement_hook is None:
            LIFE.statement_hook = StatementHook(callback)
        return LIFE.statement_hook


def set_stuck_probe(probe: Optional[Callable[[], bool]]) -> None:
    """Registers the exit guard's probe (None: no guard, never stuck)."""
    LIFE.stuck_probe = probe


def device_stuck() -> bool:
    """True when the exit guard found the device stuck: a synchronization it started
    never came back, so waiting again would hang."""
    probe = LIFE.stuck_probe
    return bool(probe is not None and probe())


def _after_fork_in_child() -> None:
    """Resets the state a child inherited: its parent's threads did not survive the fork,
    and locks held by them at that moment would never be released."""
    LIFE.lock = threading.RLock()
    LIFE.owner_pid = os.getpid()
    LIFE.threads = []
    if LIFE.statement_hook is not None:
        LIFE.statement_hook.reset_after_fork()
    for fn in list(LIFE.fork_hooks):
        try:
            fn()
        except Exception:
            pass  # a child must start even when a parent's leftover cannot be undone


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

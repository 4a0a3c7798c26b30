"""The opt-in exit guard: releases the process's GPU memory, and says what it still held,
at interpreter exit and on SIGINT/SIGTERM, without ever hanging there on a stuck GPU."""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from typing import Any, Dict, List, Optional, Sequence

from gpukeeper import frameworks
from gpukeeper.base import process_life
from gpukeeper.base.arg_checks import check_int
from gpukeeper.base.errors import InvalidInputError, LeakWarning
from gpukeeper.cleanup import run
from gpukeeper.cleanup.cleanup_report import CleanupReport, leak_message
from gpukeeper.cleanup.guard_threads import SignalWatcher, SyncWorker, Watchdog
from gpukeeper.frameworks import ranks


class _ExitGuard:
    def __init__(
        self,
        sync_timeout: float,
        exit_timeout: Optional[float],
        warn: bool,
        tolerance_bytes: int,
        signals: Sequence[int],
    ) -> None:
        self.sync_timeout = sync_timeout
        self.exit_timeout = exit_timeout
        self.warn = warn
        self.tolerance_bytes = tolerance_bytes
        self.worker = SyncWorker()
        self.watchdog = Watchdog()
        self.previous: Dict[int, Any] = {}
        self.watcher: Optional[SignalWatcher] = None
        self.forked = False
        self.last_report: Optional[CleanupReport] = None
        self.signals = list(signals)
        self.terminated = False  # SIGTERM arrived: the job is being ended, peers too

    # -------------------------------------------------------------- cleanup steps

    def timed_sync(self) -> bool:
        return self.worker.call(lambda: frameworks.synchronize_all(None), self.sync_timeout)

    def quick_cleanup(self) -> None:
        """Signal handlers: synchronize (bounded) and release; no gc, no report."""
        if self.worker.stuck:
            return  # an earlier synchronization never came back: do not wait again
        try:
            if self.timed_sync():
                frameworks.release_all_caches(None)
        except Exception:
            pass  # a signal handler must not fail over cleanup

    def full_cleanup(self) -> CleanupReport:
        report, _ = run.cleanup_from_now(
            "exit guard", None, collect=None, find_leaks=True, max_listed=10, sync=self.timed_sync
        )
        self.last_report = report
        return report

    # -------------------------------------------------------------- hooks

    def at_exit(self) -> None:
        if self.forked:
            return
        try:
            self._cleanup_at_exit()
        finally:
            if _sigint_went_unhandled():
                _keep_sigint_exit_status()

    def _cleanup_at_exit(self) -> None:
        try:
            report = self.full_cleanup()
        except Exception as e:  # never turn an exit into a traceback over cleanup
            try:
                sys.stderr.write(f"gpukeeper exit guard: cleanup failed: {type(e).__name__}: {e}\n")
            except Exception:
                pass
            return
        if self.warn and report.held_bytes > self.tolerance_bytes:
            # No source line to point at: the leak belongs to the whole program.
            warnings.warn_explicit(
                leak_message(
                    report,
                    False,
                    "still referenced at exit, e.g. by module globals; the process's end frees it",
                ),
                LeakWarning,
                filename="<gpukeeper exit guard>",
                lineno=0,
            )
        notes = list(report.notes)
        # Under torch.distributed a process group left to the interpreter's end can hang
        # it in NCCL's teardown (a peer already gone): destroy it here, bounded; after a
        # SIGTERM its communicators are aborted first. Users' own finally blocks ran by now.
        teardown = ranks.shutdown_process_group(self.sync_timeout, abort=self.terminated)
        if teardown is not None:
            notes.append(teardown)
        for note in notes:
            try:
                sys.stderr.write(f"gpukeeper exit guard: {note}\n")
            except Exception:
                pass


class _Installed:
    """The exit guard in effect in this process (``guard``, None without one); ``lock``
    makes install and uninstall atomic."""

    def __init__(self) -> None:
        self.guard: Optional[_ExitGuard] = None
        self.lock = threading.RLock()


_INSTALLED = _Installed()


def _device_stuck() -> bool:
    guard = _INSTALLED.guard
    return guard is not None and guard.worker.stuck


process_life.set_stuck_probe(_device_stuck)


def _on_signal(signum: int, frame: Any) -> None:
    """The exit guard's handler for SIGINT and SIGTERM."""
    guard = _INSTALLED.guard
    previous = guard.previous.get(signum, signal.SIG_DFL) if guard is not None else signal.SIG_DFL
    user_handler = callable(previous) and previous is not signal.default_int_handler
    if guard is not None and not guard.forked:
        if signum == signal.SIGTERM:
            guard.terminated = True
        if user_handler:
            guard.watchdog.mark_handled(signum)  # theirs decides whether the process ends
        elif signum != signal.SIGINT and guard.exit_timeout is not None:
            guard.watchdog.arm(128 + signum, guard.exit_timeout)
        guard.quick_cleanup()
    if callable(previous):
        previous(signum, frame)  # default_int_handler raises KeyboardInterrupt
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    # Unwind (finally blocks and GPUContext exits run, then atexit) and leave with the
    # conventional status of a process ended by this signal.
    raise SystemExit(128 + signum)


def _sigint_went_unhandled() -> bool:
    """Whether the script is ending with an uncaught KeyboardInterrupt that ``_on_signal``
    raised (Python kept it in ``sys.last_value`` when it printed the traceback)."""
    if sys.flags.interactive or hasattr(sys, "ps1"):
        return False  # a prompt's earlier ^C stays in sys.last_value: not how this ends
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if not isinstance(exc, KeyboardInterrupt):
        return False
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is _on_signal.__code__:
            return True
        tb = tb.tb_next
    return False


def _keep_sigint_exit_status() -> None:
    """Makes an uncaught KeyboardInterrupt end the process as SIGINT does (status 130, or
    killed by SIGINT), as Python intends.

    Python decides that when the main script fails, in a flag it reads only after the
    interpreter finalized; anything that runs code through ``PyRun_String`` meanwhile (an
    extension, a library's atexit handler) resets that flag, and the process then exits
    with status 1 after printing the KeyboardInterrupt. That is what a SIGINT inside
    torch's autograd looked like on a GPU machine (which code reset it is not known). So
    the flag is set again here, at the end of the guard's atexit handler: handlers that
    run after it (registered before the guard) could still reset it. Where it is out of reach
    (Python 3.12 and later keep it inside the runtime's state), the process ends itself
    with SIGINT here, after flushing stdout and stderr: atexit handlers registered before
    the guard then do not run."""
    try:
        import ctypes

        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 1
        return
    except (ImportError, ValueError, AttributeError, OSError):
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        process_life.set_signal_handler(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except (ValueError, OSError):
        pass  # not the main thread, or no kill: Python's own exit status stands


def _after_fork_in_child() -> None:
    """A forked child (e.g. a DataLoader worker) behaves as if no guard were installed:
    the guard's threads did not survive the fork and its pipe belongs to the parent."""
    _INSTALLED.lock = threading.RLock()
    guard = _INSTALLED.guard
    if guard is None:
        return
    guard.forked = True
    if guard.watcher is not None:
        guard.watcher.forget_after_fork()
        guard.watcher = None
    for s, previous in guard.previous.items():
        # Off the main thread this fails quietly: _on_signal then falls back to defaults.
        process_life.restore_signal_handler(s, _on_signal, previous)


process_life.after_fork_in_child(_after_fork_in_child)


def install_exit_guard(
    *,
    sync_timeout: float = 5.0,
    exit_timeout: Optional[float] = 10.0,
    warn: bool = True,
    tolerance_bytes: int = 1 << 20,
    signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM),
) -> bool:
    """Makes the process release its GPU memory at exit and on SIGINT/SIGTERM.

    At interpreter exit (atexit): synchronize (waiting at most ``sync_timeout`` s: a hung
    GPU cannot hang the exit; the caches are then left alone, as releasing would block
    too), release every framework's cache, collect garbage if memory is still held, and
    warn (``LeakWarning``) when more than ``tolerance_bytes`` are still allocated, naming
    the tensors/arrays that hold them.

    Under torch.distributed (e.g. ``torchrun``; install the guard on every rank): each
    rank releases as above, and at exit a process group still initialised is destroyed
    within ``sync_timeout`` s (after the program's own ``finally`` blocks, which may
    destroy it themselves), its NCCL communicators aborted first when the exit follows a
    SIGTERM: torchrun sends SIGTERM to every rank when one fails, and a communicator
    waiting for a dead peer would otherwise hang the interpreter's end.

    On SIGTERM: synchronize (bounded) and release, then raise ``SystemExit(128 + signum)``
    so that ``finally`` blocks and ``GPUContext`` exits run before the atexit cleanup;
    the process exits with status 143. If it is still alive ``exit_timeout`` s after the
    signal (a blocked ``finally``, a non-daemon thread, a main thread stuck in a C call
    that never returns to Python), it is ended with ``os._exit(143)``. ``exit_timeout``
    None disables that. A handler installed before the guard is called after the cleanup
    instead, and decides itself whether the process ends (no forced exit then).

    On SIGINT: synchronize (bounded) and release, then chain to the previous handler
    (Python's default raises KeyboardInterrupt). No forced exit: an interrupted program
    may catch KeyboardInterrupt and carry on. If it does not, the process ends as an
    interrupted Python process does, killed by SIGINT (a shell shows status 130), also
    when something during the interpreter's shutdown reset Python's record of the
    uncaught KeyboardInterrupt (which made it status 1 after a SIGINT inside torch's
    autograd on a GPU). A signal ignored before (SIG_IGN) stays ignored.

    Opt-in and idempotent: returns True when this call installed the guard, False when it
    was installed already (its settings are then updated). Signals can only be handled in
    the main thread; from another thread only the atexit part is installed (with a
    RuntimeWarning).
    """
    wanted = _check_settings(sync_timeout, exit_timeout, tolerance_bytes, signals)
    with _INSTALLED.lock:
        current = _INSTALLED.guard
        if current is not None and not current.forked:
            current.sync_timeout = float(sync_timeout)
            current.exit_timeout = None if exit_timeout is None else float(exit_timeout)
            current.warn = bool(warn)
            current.tolerance_bytes = tolerance_bytes
            return False
        guard = _ExitGuard(
            float(sync_timeout),
            None if exit_timeout is None else float(exit_timeout),
            bool(warn),
            tolerance_bytes,
            wanted,
        )
        stale = current  # a guard inherited through fork: its handlers are still installed
        if threading.current_thread() is threading.main_thread():
            _install_handlers(guard, stale, wanted)
        elif wanted:
            warnings.warn(
                "install_exit_guard: signals can only be handled from the main thread; "
                "only the exit-time cleanup was installed",
                RuntimeWarning,
                stacklevel=2,
            )
        process_life.at_exit(guard.at_exit)
        _INSTALLED.guard = guard
        return True


def _check_settings(
    sync_timeout: float,
    exit_timeout: Optional[float],
    tolerance_bytes: int,
    signals: Sequence[int],
) -> List[signal.Signals]:
    """Raises ``InvalidInputError`` for a bad setting; returns the signals to handle."""
    if (
        not isinstance(sync_timeout, (int, float))
        or isinstance(sync_timeout, bool)
        or sync_timeout <= 0
    ):
        raise InvalidInputError(
            f"install_exit_guard: sync_timeout must be > 0 seconds, got {sync_timeout!r}"
        )
    if exit_timeout is not None and (
        not isinstance(exit_timeout, (int, float))
        or isinstance(exit_timeout, bool)
        or exit_timeout <= 0
    ):
        raise InvalidInputError(
            f"install_exit_guard: exit_timeout must be > 0 seconds or None, got {exit_timeout!r}"
        )
    check_int(tolerance_bytes, "install_exit_guard: tolerance_bytes", 0)
    wanted = []
    for s in signals:
        if s not in (signal.SIGINT, signal.SIGTERM) or isinstance(s, bool):
            raise InvalidInputError(
                f"install_exit_guard: only SIGINT and SIGTERM are handled, got {s!r}"
            )
        wanted.append(signal.Signals(s))
    return wanted


def _install_handlers(
    guard: _ExitGuard, stale: Optional[_ExitGuard], wanted: List[signal.Signals]
) -> None:
    """Installs ``_on_signal`` for ``wanted`` (main thread only) and the forced-exit watcher."""
    for s in wanted:
        previous = signal.getsignal(s)
        if previous is _on_signal:
            previous = (
                stale.previous.get(s, signal.SIG_DFL) if stale is not None else signal.SIG_DFL
            )
        if previous is signal.SIG_IGN:
            continue  # ignored on purpose: keep it so
        guard.previous[s] = previous
        process_life.set_signal_handler(s, _on_signal)
    forced = {
        int(s): guard.exit_timeout
        for s in guard.previous
        if s != signal.SIGINT
        and guard.exit_timeout is not None
        and not (
            callable(guard.previous[s]) and guard.previous[s] is not signal.default_int_handler
        )
    }
    if forced:
        try:
            guard.watcher = SignalWatcher(guard.watchdog, forced)
        except (ValueError, OSError):
            guard.watcher = None  # the handler still arms the watchdog itself


def uninstall_exit_guard() -> bool:
    """Removes the exit guard: previous signal handlers and wakeup fd back, atexit hook
    and helper threads gone. Returns False when no guard was installed."""
    with _INSTALLED.lock:
        guard = _INSTALLED.guard
        if guard is None:
            return False
        _INSTALLED.guard = None
        process_life.cancel_at_exit(guard.at_exit)
        if threading.current_thread() is threading.main_thread():
            for s, previous in guard.previous.items():
                process_life.restore_signal_handler(s, _on_signal, previous)
            if guard.watcher is not None:
                guard.watcher.restore()
        elif guard.watcher is not None:
            guard.watcher.stop()
        guard.worker.stop()
        guard.watchdog.stop()
        return True


def exit_guard_installed() -> bool:
    """Whether ``install_exit_guard()`` is in effect in this process."""
    guard = _INSTALLED.guard
    return guard is not None and not guard.forked

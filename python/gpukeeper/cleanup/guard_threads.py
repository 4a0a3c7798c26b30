"""The exit guard's helper threads: bounded synchronization, the forced-exit watchdog and
the watcher that sees signals while the main thread is blocked in C code."""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpukeeper.base import process_life

# A synchronization job: the call, the event set when it is done, and its result list.
_Job = Tuple[Callable[[], Any], threading.Event, list]


class SyncWorker:
    """A daemon thread that runs synchronizations for callers who wait at most N seconds.

    Started with the guard: at interpreter exit a new thread may no longer be startable,
    and a hung cudaDeviceSynchronize must stay in a thread nobody waits for.
    """

    def __init__(self) -> None:
        self._jobs: "queue.SimpleQueue[Optional[_Job]]" = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self.timed_out = False
        self._thread = process_life.start_thread("gpukeeper-sync", self._run)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, done, box = job
            try:
                fn()
            except BaseException as e:  # handed to the caller
                box.append(e)
            finally:
                self.timed_out = False
                self._idle.set()
                done.set()

    @property
    def stuck(self) -> bool:
        """A call timed out and is still running."""
        return self.timed_out and not self._idle.is_set()

    def call(self, fn: Callable[[], Any], timeout: float) -> bool:
        """Runs ``fn`` in the worker; False if it did not finish within ``timeout``."""
        deadline = time.monotonic() + timeout
        if not self._idle.wait(timeout):
            return False  # the previous call still runs: the device is not answering
        self._idle.clear()
        done = threading.Event()
        box: list = []
        self._jobs.put((fn, done, box))
        if not done.wait(max(0.0, deadline - time.monotonic())):
            self.timed_out = True
            return False
        if box:
            raise box[0]
        return True

    def stop(self) -> None:
        self._jobs.put(None)


class Watchdog:
    """Ends the process with a given status if it is still alive at a deadline.

    Armed by the SIGTERM handler (and by the signal watcher when the handler cannot run)
    so that neither a hung GPU, a blocked ``finally`` nor a thread nobody joins can keep
    a terminated process alive.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._entries: List[Tuple[float, float, int, Optional[int], int]] = []
        self._stopped = False
        self.handled: Dict[int, int] = {}
        self._thread = process_life.start_thread("gpukeeper-watchdog", self._run)

    def arm(
        self, status: int, timeout: float, signum: Optional[int] = None, token: int = 0
    ) -> None:
        """Exit with ``status`` after ``timeout`` s; with ``signum``, only if that signal's
        handler has not declared its ``token``-th arrival handled by then."""
        with self._cond:
            self._entries.append((time.monotonic() + timeout, timeout, status, signum, token))
            self._cond.notify()

    def mark_handled(self, signum: int) -> None:
        with self._cond:
            self.handled[signum] = self.handled.get(signum, 0) + 1

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                due = [e for e in self._entries if e[0] <= now]
                for entry in due:
                    _, timeout, status, signum, token = entry
                    self._entries.remove(entry)
                    if signum is not None and self.handled.get(signum, 0) >= token:
                        continue  # a user handler took it and chose to carry on
                    _force_exit(
                        status, f"the process was still running {timeout:g} s after the signal"
                    )
                wait = min((e[0] for e in self._entries), default=None)
                self._cond.wait(None if wait is None else max(0.0, wait - now))


def _force_exit(status: int, why: str) -> None:
    try:
        os.write(2, f"gpukeeper exit guard: {why}; exiting now with status {status}\n".encode())
    except OSError:
        pass
    os._exit(status)


class SignalWatcher:
    """Sees a signal arrive even while the main thread is blocked in C code.

    Python runs signal handlers in the main thread between bytecodes, so a main thread
    stuck in a C call that releases the GIL (a hung ``cudaDeviceSynchronize``) would never
    run them. The C-level handler also writes each signal's number to the wakeup fd;
    this thread reads it and arms the watchdog, which ends the process if the handler has
    not done so in time. Bytes are passed on to a wakeup fd set before (e.g. asyncio's).
    A main thread spinning in C while holding the GIL cannot be helped from Python.
    """

    def __init__(self, watchdog: Watchdog, forced: Dict[int, float]) -> None:
        self._watchdog = watchdog
        self._forced = forced  # signum -> seconds before a forced exit
        self._arrivals: Dict[int, int] = {}
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        try:
            self._previous = process_life.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(self._read)
            os.close(self._write)
            raise
        self._thread = process_life.start_thread("gpukeeper-signals", self._run)

    def _run(self) -> None:
        try:
            while True:
                try:
                    data = os.read(self._read, 64)
                except InterruptedError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                if self._previous != -1:
                    try:
                        os.write(self._previous, data)
                    except OSError:
                        pass
                for signum in data:
                    if signum == 0:
                        return  # stop() asked us to go
                    timeout = self._forced.get(signum)
                    if timeout is not None:
                        self._arrivals[signum] = self._arrivals.get(signum, 0) + 1
                        self._watchdog.arm(128 + signum, timeout, signum, self._arrivals[signum])
        finally:
            for fd in (self._read, self._write):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def restore(self) -> None:
        """Gives the wakeup fd back (main thread) and stops the thread."""
        try:
            current = process_life.set_wakeup_fd(self._previous)
            if current != self._write:
                process_life.set_wakeup_fd(current)  # someone replaced ours since: leave theirs
        except (ValueError, OSError):
            pass
        self.stop()

    def forget_after_fork(self) -> None:
        """In a forked child the pipe is shared with the parent: let go of it silently
        (a child's signals must not arm the parent's watchdog)."""
        try:
            process_life.set_wakeup_fd(self._previous)
        except (ValueError, OSError):
            pass
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass

    def stop(self) -> None:
        try:
            os.write(self._write, b"\0")
        except OSError:
            pass

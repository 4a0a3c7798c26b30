"""This process's device memory as NVML sees it, read off a summary gather's critical path.

NVML has no call for one process's memory: the only way is its compute-process list,
one driver call of 150-750 microseconds on a busy multi-GPU host (the calls of ranks
reading at the same moment queue in the driver). A summary gather that read it would
wait for it on every rank. Instead, the first summary reads it synchronously and starts
a refresher thread that reads it again every :data:`REFRESH_INTERVAL_S` while summaries
keep being gathered; a later summary sends the latest reading and says how old it is.
``fresh=True`` reads synchronously instead.

>>> figures = ProcessFigures(fresh=False)
>>> reading = figures(0)              # this process on CUDA device 0 (a ProcessReading)
>>> figures.age_s                     # how old the oldest reading handed out is

One reader is kept per (pid, device): :func:`gpukeeper.base.nvml.process_memory_reader`,
a kept handle and buffer, one driver call a read. The refresher is a daemon thread
started through :mod:`gpukeeper.base.process_life`; it stops after
:data:`IDLE_STOP_S` without a summary asking, and the next summary reads synchronously
again. A forked child forgets the readers, the readings and the thread: its memory is
not its parent's, and the thread did not survive the fork.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpukeeper.base import process_life
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.nvml import ProcessReading, error_text, process_memory_reader

__all__ = [
    "IDLE_STOP_S",
    "REFRESH_INTERVAL_S",
    "Figure",
    "ProcessFigures",
    "configure",
    "read_figure",
    "refresher_status",
    "stop_refresher",
]

#: How often the refresher reads, while summaries are being gathered.
REFRESH_INTERVAL_S = 0.02
#: The refresher stops after this long without a summary asking for a reading.
IDLE_STOP_S = 30.0

_Key = Tuple[int, int]  # (pid, device)


@dataclass(frozen=True)
class Figure:
    """One reading of this process on one device, and when it was taken
    (``time.monotonic()``)."""

    reading: ProcessReading
    read_at: float

    def age_s(self, now: Optional[float] = None) -> float:
        """Seconds since the reading was taken."""
        return max(0.0, (time.monotonic() if now is None else now) - self.read_at)


class _Reader:
    """A kept NVML reader and the lock its shared buffer needs (the refresher and a
    fresh read may call it at once)."""

    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read
        self.lock = threading.Lock()


class _State:
    """Everything the refresher keeps; a forked child gets a new one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.readers: Dict[_Key, _Reader] = {}
        self.latest: Dict[_Key, Figure] = {}
        self.watched: List[_Key] = []  # what the refresher reads, in order
        self.thread: Optional[threading.Thread] = None
        self.wake = threading.Event()
        self.last_asked = 0.0
        self.interval_s = REFRESH_INTERVAL_S
        self.idle_s = IDLE_STOP_S
        self.background_reads = 0
        self.synchronous_reads = 0


_S = _State()


def _forget_after_fork() -> None:
    global _S
    _S = _State()


process_life.after_fork_in_child(_forget_after_fork)


def configure(*, interval_s: Optional[float] = None, idle_s: Optional[float] = None) -> None:
    """Sets how often the refresher reads (``interval_s``) and after how long without a
    summary it stops (``idle_s``); the running refresher follows from its next round."""
    for name, value in (("interval_s", interval_s), ("idle_s", idle_s)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
        ):
            raise InvalidInputError(f"configure: {name} must be a positive number, got {value!r}")
    state = _S
    with state.lock:
        if interval_s is not None:
            state.interval_s = float(interval_s)
        if idle_s is not None:
            state.idle_s = float(idle_s)
    state.wake.set()  # a sleeping refresher picks the new interval up now


def _reader(state: _State, key: _Key) -> Tuple[Optional[_Reader], str]:
    with state.lock:
        found = state.readers.get(key)
    if found is not None:
        return found, ""
    read, why = process_memory_reader(key[1], key[0])
    if read is None:
        return None, why  # not kept: NVML may tell later (a context made since)
    with state.lock:
        return state.readers.setdefault(key, _Reader(read)), ""


def _read_now(state: _State, key: _Key) -> Figure:
    """Reads NVML now, keeps the reading as the latest, and returns it."""
    reader, why = _reader(state, key)
    if reader is None:
        figure = Figure(ProcessReading(None, None, why), time.monotonic())
    else:
        try:
            with reader.lock:
                used = reader.read()
            reading = ProcessReading(used > 0, used)
        except Exception as exc:  # NVML failed this once: said, and read again next time
            reading = ProcessReading(None, None, f"NVML process list failed: {error_text(exc)}")
        figure = Figure(reading, time.monotonic())
    with state.lock:
        state.latest[key] = figure
    return figure


def _refresh(state: _State) -> None:
    """The refresher's loop: read every watched (pid, device) each interval until no
    summary has asked for ``idle_s``."""
    me = threading.current_thread()
    while True:
        state.wake.wait(state.interval_s)
        state.wake.clear()
        with state.lock:
            idle = time.monotonic() - state.last_asked > state.idle_s
            if idle or state.thread is not me:
                if state.thread is me:
                    state.thread = None
                return
            keys = list(state.watched)
        for key in keys:
            _read_now(state, key)
            with state.lock:
                state.background_reads += 1


def _watch(state: _State, key: _Key) -> None:
    with state.lock:
        if key not in state.watched:
            state.watched.append(key)
        if state.thread is not None and state.thread.is_alive():
            return
        state.wake.clear()
        # Started under the lock, so the thread finds itself recorded at its first round.
        state.thread = process_life.start_thread(
            "gpukeeper-process-figure", lambda: _refresh(state)
        )


def read_figure(device: int, *, fresh: bool = False) -> Figure:
    """This process's reading on CUDA ``device``: the refresher's latest while it runs
    and reads this device, else one read now (which starts the refresher). ``fresh``:
    always read now."""
    state = _S
    key = (os.getpid(), int(device))
    with state.lock:
        state.last_asked = time.monotonic()
        latest = state.latest.get(key)
        running = state.thread is not None and state.thread.is_alive() and key in state.watched
    if latest is not None and running and not fresh:
        return latest
    figure = _read_now(state, key)
    with state.lock:
        state.synchronous_reads += 1
    if figure.reading.listed is not None:
        _watch(state, key)
    return figure


class ProcessFigures:
    """What :func:`gpukeeper.account.account_reader.rank_totals_report` asks for this
    process's reading on each device of a summary; remembers how old each was."""

    def __init__(self, fresh: bool = False) -> None:
        self.fresh = fresh
        self.ages_s: List[float] = []

    def __call__(self, device: int) -> ProcessReading:
        figure = read_figure(device, fresh=self.fresh)
        self.ages_s.append(figure.age_s())
        return figure.reading

    @property
    def age_s(self) -> Optional[float]:
        """The oldest reading handed out, in seconds; None when none was asked for."""
        return max(self.ages_s) if self.ages_s else None


def refresher_status() -> Dict[str, Any]:
    """The refresher's state in this process: whether it runs, the (pid, device) pairs it
    reads, the readings kept and their ages, and how many reads it made."""
    state = _S
    now = time.monotonic()
    with state.lock:
        thread = state.thread
        return {
            "running": bool(thread is not None and thread.is_alive()),
            "thread": None if thread is None else thread.name,
            "watched": list(state.watched),
            "readers": sorted(state.readers),
            "readings": {k: (f.reading, f.age_s(now)) for k, f in state.latest.items()},
            "background_reads": state.background_reads,
            "synchronous_reads": state.synchronous_reads,
            "interval_s": state.interval_s,
            "idle_s": state.idle_s,
        }


def stop_refresher(timeout_s: float = 1.0) -> None:
    """Stops the refresher and forgets the readers and readings (the next summary reads
    synchronously again)."""
    global _S
    old = _S
    _S = _State()
    _S.interval_s, _S.idle_s = old.interval_s, old.idle_s
    with old.lock:
        thread, old.thread = old.thread, None
    old.wake.set()
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout_s)

"""GPU lap marks for the MD loop: ``EventMarks``, the choice of k, and its words.

``EventMarks`` records one event every k-th step. A mark is an event recorded on the
current stream after a step; the GPU time of an *interval* is the time from the previous
mark (or a fresh origin) to its own. One record ends one interval and starts the next,
instead of a start/end pair per step.

Why not a mark after every step: each record costs the host 1-2 us and the device about
1.9 us (an H100, ``benchmarks/python/timing_accuracy_bench.py``), which slowed a 100 us
kernel step by 2-5%. So a mark is recorded after every ``k``-th step only (and where host
work comes between two steps, see ``restart``), ``k`` chosen by
:func:`choose_event_every` so that the events cost the device at most 0.5% of a step and
the host at most 0.4 us or 0.1% of a step, whichever is less. The host latency of
every step is still measured (``perf_counter_ns``, the host laps between marks); the GPU
time of a step is its interval's divided over the interval's steps. ``event_every=1``
gives per-step marks.

The events are the timing layer's (:func:`gpukeeper.timing.timer.select_backend`):
gpukeeper's pooled ``_core.Event`` when the core sees the device (recording one is a
single C call on a stream handle read once), else PyTorch's or CuPy's.
"""

from __future__ import annotations

import functools
import math
import time
from array import array
from typing import Any, Callable, Dict, List, Optional

from gpukeeper.timing.timer import (
    CoreBackend,
    CupyBackend,
    TimerBackend,
    TorchBackend,
    available_backends,
    select_backend,
)

__all__ = [
    "EventMarks",
    "event_backend",
    "choose_event_every",
    "event_cost_ns",
    "events_how",
    "RING_KEEP",
    "EVENT_DEVICE_NS",
    "DEVICE_SHARE",
    "HOST_BUDGET_NS",
    "HOST_SHARE",
    "MIN_INTERVALS",
]

#: Marks of a full ring left queued (unresolved) when it is resolved mid-run.
RING_KEEP = 64
#: What one event record costs the device (ns): ~1.9 us measured on an H100.
EVENT_DEVICE_NS = 2000.0
#: The events may cost the device at most this share of a step's time ...
DEVICE_SHARE = 0.005
#: ... and the host at most this many ns a step (record and resolve, per interval / k).
HOST_BUDGET_NS = 400.0
#: ... and at most this share of a step: 0.4 us is 1.6 % of a 25 us step, and the marks
#: cost a loop about twice what they cost alone.
HOST_SHARE = 0.001
#: "auto" keeps at least this many intervals over the run (k <= n_steps // this).
MIN_INTERVALS = 32

# Backends whose ``record(event, stream)`` is ``event.record(stream)`` and nothing else:
# their recorder binds the event's own method (one C call, no Python frame).
_DIRECT_RECORD = (CoreBackend.record, TorchBackend.record, CupyBackend.record)


def event_backend(index: int) -> TimerBackend:
    """The events of device ``index``: gpukeeper's pooled events when the core sees the
    device, else the framework's (PyTorch, else CuPy; a core built without CUDA)."""
    usable = available_backends(index)
    return select_backend(index, "gpukeeper" if "gpukeeper" in usable else None)


def choose_event_every(step_ns: float, event_ns: float, n: int) -> int:
    """The k of "a mark after every k-th step" for a run of ``n`` steps.

    ``step_ns``: what a step takes (the warm-up's wall time per step; 0 when unknown);
    ``event_ns``: the host's cost of one mark, recorded and resolved. k is the smallest
    that keeps the device's cost of the marks (:data:`EVENT_DEVICE_NS` each) at most
    :data:`DEVICE_SHARE` of the step time and the host's at most :data:`HOST_BUDGET_NS` or
    :data:`HOST_SHARE` of the step time a step, and at most ``n // MIN_INTERVALS`` (at
    least 1). With no step time measured, the host's budget alone decides.
    """
    k = max(1, math.ceil(event_ns / HOST_BUDGET_NS))
    if step_ns > 0:
        k = max(k, math.ceil(EVENT_DEVICE_NS / (DEVICE_SHARE * step_ns)))
        k = max(k, math.ceil(event_ns / (HOST_SHARE * step_ns)))
    return max(1, min(k, n // MIN_INTERVALS))


def events_how(event_every: int, synchronize: Optional[Callable[[], Any]] = None) -> str:
    """The timing method of steps timed by CUDA events, one mark every ``event_every`` steps."""
    marks = (
        "one per step"
        if event_every == 1
        else f"one after every {event_every} steps (a step's GPU time is its interval's, "
        "divided over the interval's steps)"
    )
    return f"CUDA events on the framework's current stream, {marks}" + (
        "; the wall clock ends at the caller's synchronize()" if synchronize is not None else ""
    )


class EventMarks:
    """A ring of lap marks on the current stream of ``backend``'s device.

    The measured loop records ``rec[slot]()`` after the step ``i`` that ends an interval
    and stores ``last[slot] = i``; :meth:`resolve` turns the ring's marks into intervals
    (``interval_ms``, ``interval_steps``). Nothing is synchronized while recording.
    """

    def __init__(self, backend: TimerBackend, size: int) -> None:
        self.backend = backend
        self.stream = backend.current_stream()
        self.size = size
        self.marks = [backend.new_event() for _ in range(size)]
        self.rec = [self.recorder(e) for e in self.marks]
        self.last = array("q", bytes(8 * size))  # the step each mark ends
        self.origin = backend.new_event()
        self.prev_last = -1  # the step before the first unresolved interval
        self._spares: List[Any] = []
        self._restarts: Dict[int, Any] = {}  # slot -> origin recorded after host work
        self.probes = 0  # marks queried right after their record ...
        self.busy = 0  # ... that were still waiting for queued work on the stream
        self.interval_ms = array("d")
        self.interval_steps = array("q")

    def recorder(self, event: Any) -> Callable[[], None]:
        """A call without arguments that records ``event`` on the stream."""
        if type(self.backend).record in _DIRECT_RECORD:
            return functools.partial(event.record, self.stream)
        return functools.partial(self.backend.record, event, self.stream)

    def begin(self) -> None:
        """Records the origin of the first interval."""
        self.recorder(self.origin)()

    def probe(self, slot: int) -> None:
        """Asks whether the mark just recorded in ``slot`` is still waiting for work.

        A mark on a stream with nothing queued completes at once, and the laps between
        such marks are the host's time between records: they add up to the wall time
        whether or not the stream did the step's work (another engine's context,
        another stream). Marks still pending right after their record show the stream
        was busy: only then do the laps hold the work."""
        self.probes += 1
        try:
            if not self.backend.query(self.marks[slot]):
                self.busy += 1
        except Exception:
            self.probes -= 1  # a failed query proves nothing either way

    def busy_fraction(self) -> Optional[float]:
        """The share of probed marks that found the stream busy (None: none probed)."""
        return self.busy / self.probes if self.probes else None

    def restart(self, slot: int) -> None:
        """Records now a fresh origin for the interval of ``slot`` (host work came
        between: it is not the next interval's)."""
        if slot >= self.size:
            return
        event = self._restarts.get(slot)
        if event is None:
            event = self._spares.pop() if self._spares else self.backend.new_event()
            self._restarts[slot] = event
        self.recorder(event)()

    def resolve(self, count: int, keep: int = 0) -> None:
        """Appends the intervals of the first ``count - keep`` marks to ``interval_ms``
        and ``interval_steps`` and moves the last ``keep`` slots to the front of the
        ring (their steps may still be queued). The last resolved mark becomes the origin.

        Reading mark ``count - keep - 1`` waits for it only, leaving ``keep`` marks of
        work queued: a GPU-bound loop never sees an idle device (whose next step would
        carry a launch latency) because the ring was full."""
        done = count - keep
        if done <= 0:
            return
        marks, last, elapsed, restarts = (
            self.marks,
            self.last,
            self.backend.elapsed_ms,
            self._restarts,
        )
        add_ms, add_steps = self.interval_ms.append, self.interval_steps.append
        prev, prev_last = self.origin, self.prev_last
        for j in range(done):
            mark, end = marks[j], last[j]
            start = restarts.pop(j, None) if restarts else None
            if start is None:
                add_ms(elapsed(prev, mark))
            else:
                add_ms(elapsed(start, mark))
                self._spares.append(start)
            add_steps(end - prev_last)
            prev, prev_last = mark, end
        self.prev_last = prev_last
        self._rotate(done)

    def _rotate(self, done: int) -> None:
        marks, rec = self.marks, self.rec
        spent = self.origin
        self.origin = marks[done - 1]
        marks[done - 1] = spent
        rec[done - 1] = self.recorder(spent)
        # In place: the measured loop holds ``rec`` and ``last``.
        marks[:] = marks[done:] + marks[:done]
        rec[:] = rec[done:] + rec[:done]
        self.last[:] = self.last[done:] + self.last[:done]
        self._restarts = {j - done: e for j, e in self._restarts.items()}

    def step_times_ms(self) -> List[float]:
        """One GPU time per step: each interval's time divided over its steps."""
        out: List[float] = []
        for ms, steps in zip(self.interval_ms, self.interval_steps):
            if steps == 1:
                out.append(ms)
            else:
                out.extend([ms / steps] * steps)
        return out


def event_cost_ns(marks: EventMarks, samples: int = 8) -> float:
    """The host's cost (ns) of one mark, recorded and later resolved: the median of
    ``samples`` records plus the median of their elapsed-time reads. Waits for the
    device (call it outside the measured loop)."""
    samples = max(1, min(samples, marks.size))
    pc = time.perf_counter_ns
    marks.begin()
    rec_ns = []
    for j in range(samples):
        t0 = pc()
        marks.rec[j]()
        rec_ns.append(pc() - t0)
    read_ns = []
    prev = marks.origin
    for j in range(samples):
        t0 = pc()
        marks.backend.elapsed_ms(prev, marks.marks[j])
        read_ns.append(pc() - t0)
        prev = marks.marks[j]
    return float(sorted(rec_ns)[samples // 2] + sorted(read_ns)[samples // 2])

"""The measured loop of an MD run: one loop for every option, and its progress bar.

Per step the loop does what an uninstrumented loop cannot avoid plus the least that
measures it: one ``perf_counter_ns`` call, one store in a preallocated ``array`` and one
integer comparison::

    for i, x in enumerate(source):
        out = model(x)
        if i != nxt:
            ends[i] = pc()
        else:
            nxt = at(i)

A step's host latency is the time from the previous step's end to its own: one clock
read a step, not two (a second read is ~40 ns, 0.16 % of a 25 us step). Everything else
happens only at the steps where it is due, in ``at``: a device synchronization inside
the measured window (``sync_every``), a GPU event mark (after every ``event_every``-th
step), a memory sample, the progress bar, resolving a full ring of marks. ``at``
notes when it is done (the next step starts there, so its work is in no step's time)
and returns the next step where something is due. A memory sample or the progress bar
is host work between two steps: with GPU events, the step before it ends an interval and
a fresh origin is recorded after it, so that work is in no step's GPU time either.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from gpukeeper.base.progress import ProgressBar
from gpukeeper.md.events import RING_KEEP, EventMarks
from gpukeeper.timing.sampling import StepSampler

__all__ = ["LoopOptions", "run_loop", "step_hook", "latencies"]


@dataclass
class LoopOptions:
    """What the measured loop does besides calling the model.

    ``sync``: waits for the device, inside every ``sync_every``-th step's window and
    after the loop (None: there is nothing to wait for); ``marks``/``event_every``: GPU
    event marks after every k-th step (None: no events); ``sampler``: memory samples
    every ``sampler.every`` steps; ``bar``: the progress bar.
    """

    sync: Optional[Callable[[], None]]
    sync_every: Optional[int] = None
    marks: Optional[EventMarks] = None
    event_every: int = 1
    sampler: Optional[StepSampler] = None
    bar: Optional[ProgressBar] = None


def _next_on_grid(i: int, every: int) -> int:
    """The first step after ``i`` that ends a period of ``every`` steps."""
    return ((i + 1) // every + 1) * every - 1


def step_hook(
    n: int,
    ends: Any,
    o: LoopOptions,
) -> Tuple[int, Callable[[int], int], Callable[[], int], Dict[int, int]]:
    """(the first step where something is due, ``at(i)``, ``finish()``, ``resume``) for
    ``n`` steps. ``at`` stores step i's end and does what is due after it (only a mark: a
    short branch), then notes in ``resume[i + 1]`` when the next step starts; ``between``:
    the host work between two steps; ``finish`` ends the last interval and returns the
    marks to resolve (the loop's end resolves them)."""
    pc, sync, marks, bar = time.perf_counter_ns, o.sync, o.marks, o.bar
    resume: Dict[int, int] = {}
    sample = o.sampler.sample if o.sampler else None
    k, s_every = (o.event_every if marks else n + 1), (o.sync_every or n + 1)
    m_every, b_every = (o.sampler.every if o.sampler else n + 1), (bar.every if bar else n + 1)
    rec, last, ring, final = (
        (marks.rec, marks.last, marks.size, n - 1) if marks else (None, None, -1, n)
    )
    keep = min(RING_KEEP, ring // 2)
    # The steps where something is due next (past n: never); "slow": host work between
    # steps (memory, progress); "other": all but the marks.
    next_mark, next_sync, next_mem, next_bar = k - 1, s_every - 1, m_every - 1, b_every - 1
    next_slow = min(next_mem, next_bar)
    next_other = min(next_sync, next_slow)
    slot, marked = 0, -1  # the ring slot of the next mark; the last step that ended an interval

    def between(i: int, mark: bool) -> None:
        # The mark of step i (when one was recorded) is probed first, and a fresh origin
        # for the next interval recorded last: the work here is in no interval.
        nonlocal next_mem, next_bar, next_slow, slot
        if mark:
            marks.probe(slot - 1)  # type: ignore[union-attr]
        if i == next_mem:
            sample(i)  # type: ignore[misc]
            next_mem += m_every
        if i == next_bar:
            bar.update(i + 1)  # type: ignore[union-attr]
            next_bar += b_every
        next_slow = next_mem if next_mem < next_bar else next_bar
        if mark:
            if slot == ring and i != final:
                marks.resolve(slot, keep)  # type: ignore[union-attr]
                slot = keep
            marks.restart(slot)  # type: ignore[union-attr]

    def at(i: int) -> int:
        nonlocal next_mark, next_sync, next_other, slot, marked
        if i < next_other:  # only a mark is due (events every k steps)
            ends[i] = pc()
            rec[slot]()  # type: ignore[index]
            last[slot] = marked = i  # type: ignore[index]
            slot += 1
            next_mark = i + k
            if slot == ring and i != final:
                between(i, True)
            resume[i + 1] = pc()
            return next_mark if next_mark < next_other else next_other
        busy = i == next_slow
        mark = (i == next_mark or busy) and rec is not None
        if i == next_sync:
            if mark:
                rec[slot]()  # type: ignore[index]
            if sync is not None:
                sync()
            ends[i] = pc()
            next_sync += s_every
        else:
            ends[i] = pc()
            if mark:
                rec[slot]()  # type: ignore[index]
        if mark:
            last[slot] = marked = i  # type: ignore[index]
            slot += 1
            next_mark = _next_on_grid(i, k)
        if busy or (slot == ring and i != final):
            between(i, mark)
        next_other = next_sync if next_sync < next_slow else next_slow
        resume[i + 1] = pc()
        return next_mark if next_mark < next_other else next_other

    def finish() -> int:
        nonlocal slot, marked
        if marks is not None and marked < n - 1:
            rec[slot]()  # type: ignore[index]
            last[slot] = marked = n - 1  # type: ignore[index]
            slot += 1
        return slot

    return min(next_mark, next_other), at, finish, resume


def latencies(ends: Any, resume: Dict[int, int], start: int) -> None:
    """Turns the steps' end times (``ends``, ns, in place) into their host latencies:
    each step from the previous one's end, or from where ``resume`` says it started
    (after the host work between two steps); the first from ``start``."""
    prev, get = start, resume.get
    for i in range(len(ends)):
        end = ends[i]
        ends[i] = end - get(i, prev)
        prev = end


def run_loop(
    model: Callable[[Any], Any], source: Iterable[Any], n: int, host_ns: Any, o: LoopOptions
) -> Tuple[float, int]:
    """Runs the ``n`` measured steps, storing each step's host latency (ns) in
    ``host_ns``; returns (the loop's wall time in s, the final synchronization included;
    the marks left to resolve)."""
    nxt, at, finish, resume = step_hook(n, host_ns, o)
    pc = time.perf_counter_ns
    out: Any = None
    t_start = time.perf_counter()
    if o.marks is not None:
        o.marks.begin()
    start = pc()
    for i, x in enumerate(source):
        out = model(x)
        if i != nxt:
            host_ns[i] = pc()
        else:
            nxt = at(i)
    pending = finish()
    out = None  # noqa: F841  (the last step's result is dropped before the final wait)
    if o.sync is not None:
        o.sync()
    total = time.perf_counter() - t_start
    latencies(host_ns, resume, start)
    return total, pending

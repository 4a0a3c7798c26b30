"""Loop time: calls run back to back in batches between two synchronisations, and the verdict
on what bounds a call (the device, the host's launches, or a synchronisation inside it).

Why batches: a user's loop calls ``fn`` again as soon as the host returns from it, so the
host's launches of one call overlap the device's work of the previous ones. Only the wall
clock of many calls in a row sees that; per-call brackets (events, gates, waits) change it.
A batch is ``calls`` such calls between a synchronized start and a synchronized end; its
wall clock divided by ``calls`` is one sample of the loop time per call. The batch lasts
about ``target_ms``, so the synchronisation that ends it and the first launch on an idle
device (each a few microseconds) are a small share of it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpukeeper.frameworks.ranks import RankStep
from gpukeeper.timing.stopping import StopRule

__all__ = [
    "BOUNDS",
    "LoopBatches",
    "bound_verdict",
    "describe_bound",
    "batch_calls",
    "run_batches",
    "time_batch",
]

#: What can bound a call: its GPU work (``"device"``), the host issuing its launches
#: (``"launch"``), a wait for the device inside the call (``"sync"``), or the host's own
#: work for a call that runs on the CPU (``"host"``).
BOUNDS = ("device", "launch", "sync", "host")


@dataclass
class LoopBatches:
    """The batches of one benchmark: per-call loop time of each batch (ms), the host's time
    to issue one call in it (ms: the batch's calls up to their return, before the final
    wait), the calls per batch, why the batches stopped and their wall time (s)."""

    per_call: List[float] = field(default_factory=list)
    issue: List[float] = field(default_factory=list)
    calls: int = 0
    stop_reason: str = "n_calls"
    total_s: float = 0.0


def batch_calls(per_call_ms: float, target_ms: float, most: int) -> int:
    """Calls in a batch of about ``target_ms`` for calls of ``per_call_ms`` each (1 ..
    ``most``)."""
    if not per_call_ms > 0 or math.isinf(per_call_ms):
        return most if per_call_ms == 0 else 1
    return max(1, min(most, math.ceil(target_ms / per_call_ms)))


def time_batch(
    fn: Callable[..., Any],
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    calls: int,
    settle: Callable[[Any], None],
) -> Tuple[float, float]:
    """One batch: ``settle(None)`` (the device idle), then ``calls`` calls of
    ``fn(*args, **kwargs)`` back to back, then ``settle(last result)``. Returns (loop ms
    per call, issue ms per call).

    ``settle`` waits for every call's work (a device synchronisation; for JAX, a wait on
    the last result): the batch's clock ends when the last call's work has. The calls are
    made exactly as a loop makes them, with no wrapper between: a wrapper's frame would be
    a cost the user's loop does not pay.
    """
    settle(None)
    clock = time.perf_counter_ns
    last: Any = None
    if kwargs:
        t0 = clock()
        for _ in range(calls):
            last = fn(*args, **kwargs)
    else:
        t0 = clock()
        for _ in range(calls):
            last = fn(*args)
    t1 = clock()
    settle(last)
    t2 = clock()
    return (t2 - t0) / 1e6 / calls, (t1 - t0) / 1e6 / calls


def run_batches(
    fn: Callable[..., Any],
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    settle: Callable[[Any], None],
    estimate_ms: float,
    n_calls: int,
    min_time_s: Optional[float],
    max_noise: Optional[float],
    warnings: List[str],
    ranks: Optional[RankStep] = None,
    target_ms: float = 10.0,
    min_batches: int = 10,
    most_calls: int = 100_000,
) -> LoopBatches:
    """The loop time of ``fn(*args, **kwargs)``: a pilot batch sized from ``estimate_ms`` (an
    upper bound of a call's loop time: its host time when each call was waited for), not
    kept, then batches sized from the pilot. As many batches as make a quarter of
    ``n_calls`` calls, and at least ``min_batches``: a batch averages its calls, so fewer
    of them give as steady a median, and a benchmark of slow calls does not take twice as
    long.
    ``min_time_s`` and ``max_noise`` as for the calls (``StopRule``), on the batches' wall
    time. Under ``ranks`` every rank runs batches of the same size, in step.
    """
    pilot_calls = batch_calls(estimate_ms, target_ms, most_calls)
    if ranks is not None:
        pilot_calls = ranks.agree_max(pilot_calls)
    pilot_ms, _ = time_batch(fn, args, kwargs, pilot_calls, settle)
    calls = batch_calls(pilot_ms, target_ms, most_calls)
    if ranks is not None:
        calls = ranks.agree_max(calls)
    batches = max(min_batches, math.ceil(n_calls / calls / 4))
    out = LoopBatches(calls=calls)
    stop = StopRule(batches, min_time_s, max_noise, warnings)
    reason: Optional[str] = None
    while True:
        if ranks is not None and ranks.step(reason is not None):
            break
        if ranks is None and reason is not None:
            break
        per_call, issue = time_batch(fn, args, kwargs, calls, settle)
        if reason is None:  # a rank done before the others keeps stepping, unrecorded
            out.per_call.append(per_call)
            out.issue.append(issue)
            reason = stop.add(per_call * calls)
    out.stop_reason = reason or "n_calls"
    out.total_s = stop.wall_s()
    return out


def bound_verdict(
    loop_ms: Optional[float],
    device_ms: Optional[float],
    issue_ms: Optional[float],
    waits_inside: bool,
    on_gpu: bool,
    share: float,
) -> Tuple[Optional[str], Optional[float]]:
    """(what bounds the call, the share of the loop the device was busy).

    CPU work: ``"host"``. A call that waits for the device inside (its gate timed out):
    ``"sync"``. Otherwise ``"device"`` when the device is busy for at least ``share`` of
    the loop time, or when the host issued the batch's calls in less than ``share`` of
    it (it then waited for the device: the device's side of each launch, the gaps
    between back-to-back kernels that no per-call device time holds, sets the pace);
    else ``"launch"``: the host issued calls for the whole loop while the device idled
    between their kernels. None where the device time is unknown (work timed on the host
    clock only).
    """
    if not on_gpu:
        return "host", None
    busy: Optional[float] = None
    if loop_ms is not None and device_ms is not None and loop_ms > 0:
        busy = min(1.0, max(0.0, device_ms / loop_ms))
    if waits_inside:
        return "sync", busy
    if busy is None:
        return None, None
    if busy >= share:
        return "device", busy
    if issue_ms is not None and loop_ms is not None and issue_ms < share * loop_ms:
        return "device", busy
    return "launch", busy


def describe_bound(bound: Optional[str]) -> str:
    """The verdict in words, for summaries."""
    return _BOUND_WORDS.get(
        bound or "", "unknown (no device time: the work is timed on the host clock)"
    )


_BOUND_WORDS: Dict[str, str] = {
    "device": "the device (its GPU work, and the gaps between its kernels, set the pace)",
    "launch": "the host's launches (the device waits for them between kernels)",
    "sync": "synchronisation (the call waits for the device inside)",
    "host": "the host (CPU work)",
}

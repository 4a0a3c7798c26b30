"""The Python benchmarks' timing of one statement: compiled inline by timeit, batches
sized to a target time, median and spread across batches (imported from their folder)."""

from __future__ import annotations

import statistics
import timeit
from typing import Any, Dict, List


def quantile(values: List[float], q: float) -> float:
    """Linear-interpolated quantile ``q`` in [0, 1] of ``values``; NaN when empty."""
    v = sorted(values)
    if not v:
        return float("nan")
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] * (1 - (pos - lo)) + v[hi] * (pos - lo)


def measure(stmt: str, ns: Dict[str, Any], repeat: int, batch_ns: float,
            max_number: int = 10000) -> Dict[str, Any]:
    """ns per execution of ``stmt`` (run with globals ``ns``): ``repeat`` batches of about
    ``batch_ns`` each after warm-up; median, p10, p90, min, max, mean across batches. The
    statement is compiled into timeit's loop, so no per-call wrapper is timed; the garbage
    collector is off while timing (timeit's default)."""
    timer = timeit.Timer(stmt, globals=ns)
    # Warm-up first (the first call may have to reserve a segment, or start CUDA), then
    # calibration: grow `number` until one batch takes >= batch_ns / 4.
    timer.timeit(20)
    number = 16
    while True:
        t = timer.timeit(number)
        if t * 1e9 >= batch_ns / 4 or number >= max_number:
            break
        number *= 4
    per = t * 1e9 / number
    number = int(max(1, min(max_number, batch_ns / max(per, 1.0))))
    timer.timeit(number)  # one more warm-up batch at the final size
    times = [t * 1e9 / number for t in timer.repeat(repeat=repeat, number=number)]
    return {
        "ns_median": statistics.median(times),
        "ns_p10": quantile(times, 0.1),
        "ns_p90": quantile(times, 0.9),
        "ns_min": min(times),
        "ns_max": max(times),
        "ns_mean": statistics.fmean(times),
        "number_per_batch": number,
        "batches": repeat,
    }

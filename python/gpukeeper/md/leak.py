"""Leak verdicts of memory series sampled over a run: ``leak_verdict``, a run's ``memory_outcome``.

The growth of a series is the least-squares slope of its samples in the *second half*
of the run, projected over the whole run and compared with a tolerance: a slope, not two
end points, so that a cache filling in the first steps is growth and not a leak. The
series' noise (the largest move between two samples that the steady per-step move does
not explain) decides whether the verdict can be trusted at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gpukeeper.base.arg_checks import check_int
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.timing import stats as tstats

__all__ = [
    "LeakVerdict",
    "leak_verdict",
    "combine_verdicts",
    "least_squares_slope",
    "MemoryOutcome",
    "memory_outcome",
    "outside_frameworks",
    "peak_pattern",
    "ABOVE_NOISE",
]

MiB = float(1 << 20)

#: A series noisier than the tolerance still proves a leak when its projected growth is
#: at least this many times its noise: a single jump of h inside the second half fits a
#: line whose projection over the run is up to 3h, so growth above 4x the largest jump
#: cannot be one jump of the allocator.
ABOVE_NOISE = 4.0


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than 2 distinct xs).

    (``gpukeeper.timing.stats`` has no regression; this is the one md needs.)
    """
    n = len(xs)
    if n < 2:
        return 0.0
    mx = math.fsum(xs) / n
    my = math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


@dataclass(frozen=True)
class LeakVerdict:
    """The verdict of one memory series (see :func:`leak_verdict`).

    ``leak``: True (grows), False (stable), None (inconclusive: the series moves by more
    than the tolerance for reasons a line does not explain). ``slope``: bytes per step
    over the second half; ``growth``: ``slope * n_steps``; ``noise``: the largest move
    between two samples that the steady slope does not explain (bytes); ``steady``: the
    fraction of sample intervals in the second half over which the series grew;
    ``reason``: one readable line.
    """

    source: str
    leak: Optional[bool]
    slope: float
    growth: float
    noise: float
    steady: float
    samples: int
    reason: str


def _late(xs: Sequence[float], ys: Sequence[float], n_steps: int) -> List[Tuple[float, float]]:
    late = [(x, float(y)) for x, y in zip(xs, ys) if x >= n_steps / 2.0]
    if len(late) < 3:
        late = [(x, float(y)) for x, y in zip(xs, ys)][-3:]
    return late


def _check_verdict_args(
    steps: Sequence[float], values: Sequence[float], n_steps: Any, tolerance_mb: Any
) -> None:
    if len(steps) != len(values) or len(values) < 2:
        raise InvalidInputError(
            f"leak_verdict needs two equally long series of at least 2 samples, got "
            f"{len(steps)} steps and {len(values)} values"
        )
    check_int(n_steps, "n_steps", 1)
    if (
        isinstance(tolerance_mb, bool)
        or not isinstance(tolerance_mb, (int, float))
        or not tolerance_mb >= 0
    ):
        raise InvalidInputError(f"tolerance_mb must be a number >= 0, got {tolerance_mb!r}")


def leak_verdict(
    steps: Sequence[float],
    values: Sequence[float],
    n_steps: int,
    tolerance_mb: float,
    source: str = "memory",
) -> LeakVerdict:
    """Whether a memory series sampled over a run of ``n_steps`` grows.

    ``steps``: the number of calls made when each reading was taken; ``values``: the
    readings (bytes). The growth is the least-squares slope over the second half of the
    run, projected over the whole run (a slope, not two end points: a cache that fills
    early is not a leak). The noise is the largest move between two consecutive
    samples in the second half that the median per-step move does not explain: a steady
    leak moves the same way every interval (noise near 0), an allocator that keeps and
    hands back pages moves in jumps.

    - noise <= tolerance: a leak when the growth exceeds the tolerance;
    - noise > tolerance: a leak only when the growth exceeds the tolerance *and*
      4 times the noise (more than one jump could make); otherwise inconclusive (None).

    Raises ``InvalidInputError`` for mismatched or empty series.
    """
    _check_verdict_args(steps, values, n_steps, tolerance_mb)
    late = _late([float(x) for x in steps], values, n_steps)
    lx = [x for x, _ in late]
    ly = [y for _, y in late]
    slope = least_squares_slope(lx, ly)
    growth = slope * n_steps
    spans = [lx[i + 1] - lx[i] for i in range(len(lx) - 1)]
    moves = [ly[i + 1] - ly[i] for i in range(len(ly) - 1)]
    rates = [m / s for m, s in zip(moves, spans) if s > 0]
    typical = tstats.median(rates) if rates else 0.0
    noise = max((abs(m - typical * s) for m, s in zip(moves, spans)), default=0.0)
    steady = sum(1 for m in moves if m > 0) / len(moves) if moves else 0.0
    tol = tolerance_mb * MiB
    over = f"{growth / MiB:+.2f} MiB over {n_steps} steps ({slope:+.1f} B/step)"
    if noise <= tol:
        leak: Optional[bool] = growth > tol
        reason = (
            f"{'leak' if leak else 'stable'}: {source} {over}, tolerance {tolerance_mb:g} MiB "
            f"(noise {noise / MiB:.2f} MiB)"
        )
    elif growth > tol and growth > ABOVE_NOISE * noise:
        leak = True
        reason = (
            f"leak: {source} {over}, above its noise {noise / MiB:.2f} MiB "
            f"(tolerance {tolerance_mb:g} MiB)"
        )
    else:
        leak = None
        reason = (
            f"inconclusive: {source} noise {noise / MiB:.2f} MiB > tolerance {tolerance_mb:g} MiB "
            f"(growth {over})"
        )
    return LeakVerdict(source, leak, slope, growth, noise, steady, len(late), reason)


def combine_verdicts(primary: LeakVerdict, in_use: Optional[LeakVerdict]) -> LeakVerdict:
    """One verdict from a held-bytes series (RSS) and an in-use series (malloc, tracemalloc).

    In-use counts decide: they move only when memory is allocated or freed, where RSS
    also moves when the allocator keeps or returns pages. RSS overrules them only for a
    leak they cannot see (memory taken outside malloc: mmap, a library's own allocator),
    and only when it grows steadily with noise under the tolerance; growth made of a few
    jumps is the allocator's, not proof of a leak.
    """
    if in_use is None:
        return primary
    if in_use.leak:
        return in_use
    if primary.leak and primary.noise <= primary.growth / ABOVE_NOISE and primary.steady >= 0.5:
        return LeakVerdict(
            primary.source,
            True,
            primary.slope,
            primary.growth,
            primary.noise,
            primary.steady,
            primary.samples,
            primary.reason + f", steadily, while {in_use.source} does not grow: memory taken "
            "outside malloc (mmap, a library's own allocator)",
        )
    note = primary.reason
    if primary.leak:
        note = (
            f"{primary.source} grows {primary.growth / MiB:+.2f} MiB in jumps, not steadily: "
            "the allocator keeping freed memory"
        )
    return LeakVerdict(
        in_use.source,
        in_use.leak,
        in_use.slope,
        in_use.growth,
        in_use.noise,
        in_use.steady,
        in_use.samples,
        f"{in_use.reason}; cross-check {note}",
    )


def outside_frameworks(
    before: Optional[Tuple[int, int]],
    after: Optional[Tuple[int, int]],
    n_steps: int,
    tolerance_mb: float,
    middle: Sequence[Tuple[float, int]] = (),
) -> Tuple[Optional[LeakVerdict], float]:
    """From (NVML bytes of this process, frameworks' reserved bytes) before and after a
    run, and ``middle`` readings of their difference taken during it ((calls made, bytes)):
    a leak verdict on the device memory no framework counter explains (None when it did
    not grow past the tolerance, or nothing was read), and the growth of the frameworks'
    cache (reserved bytes) over the run. An engine or an extension in this process that
    allocates with its own CUDA context or ``cudaMalloc`` is seen only here.

    With two readings inside the run or more, the series gets :func:`leak_verdict`'s
    rules (the second half's slope, against its noise), so a one-off allocation during
    the run is not a leak; with the end points alone, their difference decides."""
    if before is None or after is None:
        return None, 0.0
    cache = float(after[1] - before[1])
    xs = [0.0] + [float(x) for x, _ in middle] + [float(n_steps)]
    ys = [float(before[0] - before[1])] + [float(v) for _, v in middle]
    ys.append(float(after[0] - after[1]))
    how = "NVML's figure for this process less the frameworks' reserved bytes"
    if len(xs) >= 4:
        series = leak_verdict(xs, ys, n_steps, tolerance_mb, "outside frameworks")
        if not series.leak:
            return None, cache
        grew, slope, noise, steady = series.growth, series.slope, series.noise, series.steady
        how += f", {len(xs)} readings"
    else:
        grew = ys[-1] - ys[0]
        if grew <= tolerance_mb * MiB:
            return None, cache
        slope, noise, steady = grew / n_steps, 0.0, 1.0
    reason = (
        f"leak: outside every framework {grew / MiB:+.2f} MiB over {n_steps} steps "
        f"({slope:+.1f} B/step; {how}), tolerance {tolerance_mb:g} MiB: an engine or an "
        "extension in this process allocates it (its own CUDA context, or cudaMalloc "
        "outside the frameworks' allocators)"
    )
    verdict = LeakVerdict("outside frameworks", True, slope, grew, noise, steady, len(xs), reason)
    return verdict, cache


@dataclass
class MemoryOutcome:
    """The memory part of a TrajectoryResult (see its fields of the same meaning)."""

    steps: List[int]
    bytes: List[int]
    all_series: Dict[str, List[int]]
    slope: Optional[float] = None
    slope_all: Optional[float] = None
    leak: Optional[bool] = None
    peak: Optional[int] = None
    verdict: Optional[LeakVerdict] = None
    peak_text: str = ""  # the true peak, when it comes back and how close it is to the top


def _verdict_warnings(
    verdict: LeakVerdict, n: int, leak_tolerance_mb: float, warnings: List[str]
) -> None:
    if verdict.leak:
        warnings.append(
            f"memory grows by {verdict.slope:.1f} bytes/step ({verdict.growth / MiB:.2f} MiB over "
            f"{n} steps, tolerance {leak_tolerance_mb} MiB, {verdict.source}): leak"
        )
    elif verdict.leak is None:
        warnings.append(f"leak verdict {verdict.reason}")
    if verdict.samples < 4:
        warnings.append(
            f"only {verdict.samples} memory samples in the second half: the leak "
            "verdict is weak (lower memory_sample_every or run more steps)"
        )


def memory_outcome(
    sampler: Any, final: Optional[List[int]], n: int, leak_tolerance_mb: float, warnings: List[str]
) -> MemoryOutcome:
    """The samples of a run turned into series, slopes and the leak verdict; what is
    worth saying goes to ``warnings``.

    ``sampler``: a :class:`gpukeeper.timing.sampling.StepSampler` (or None: memory was not
    checked); ``final``: each series' reading after the loop's synchronization.
    """
    if sampler is None or not sampler.series:
        return MemoryOutcome([], [], {})
    series, count = sampler.series, sampler.count
    # x = calls made when the reading was taken: the initial reading at 0, the one
    # after step i at i+1, the final one (after the synchronization) at n.
    xs = [0.0] + [float(s + 1) for s in sampler.steps[1:count]] + [float(n)]
    all_series = {
        s.name: list(sampler.values[k][:count]) + [final[k]]  # type: ignore[index]
        for k, s in enumerate(series)
    }
    bytes_l = all_series[series[0].name]
    slope_all = least_squares_slope(xs, [float(b) for b in bytes_l])
    verdicts = [leak_verdict(xs, all_series[s.name], n, leak_tolerance_mb, s.name) for s in series]
    in_use = next((v for v, s in zip(verdicts, series) if s.in_use), None)
    verdict = verdicts[0] if series[0].in_use else combine_verdicts(verdicts[0], in_use)
    _verdict_warnings(verdict, n, leak_tolerance_mb, warnings)
    peak, peak_text = max(bytes_l), ""
    peaks = getattr(sampler, "peaks", None)
    if peaks is not None and getattr(sampler, "last_peak", None) is not None:
        # The peak of each interval, which ends at the sample after it (xs[1:]).
        interval_peaks = list(peaks[1:count]) + [sampler.last_peak]
        peak = max(peak, max(interval_peaks))
        peak_text = peak_pattern(xs[1:], bytes_l[1:], interval_peaks, leak_tolerance_mb)
    return MemoryOutcome(
        [int(v) for v in xs],
        bytes_l,
        all_series,
        verdicts[0].slope,
        slope_all,
        verdict.leak,
        peak,
        verdict,
        peak_text,
    )


def peak_pattern(
    ends: Sequence[float], levels: Sequence[int], peaks: Sequence[int], tolerance_mb: float
) -> str:
    """Where a run's true peak comes, from the peak counter read (and reset) at each
    sample: ``ends`` the step each interval ends at, ``levels`` the memory in use there,
    ``peaks`` the interval's peak. Every interval peaks above the memory in use around it
    by the steps' own working memory (the typical excess); a spike is an interval whose
    excess passes the typical one by more than the tolerance (the scratch of a
    neighbour-list rebuild, say: an out-of-memory error comes at the spike, not at the
    average). Measured against each interval's own level, a leak's rising level is no
    spike. Says how high, how often and in which intervals; "" without peaks."""
    if not peaks or len(levels) != len(peaks):
        return ""
    tol = max(tolerance_mb * MiB, 1.0)
    excess = [
        p - max(levels[k - 1] if k > 0 else levels[0], levels[k]) for k, p in enumerate(peaks)
    ]
    typical = tstats.median([float(e) for e in excess])
    top = max(peaks)
    spikes = [(int(end), e - typical) for end, e in zip(ends, excess) if e - typical > tol]
    if not spikes:
        return (
            f"peak {top / MiB:.2f} MiB, about {max(typical, 0.0) / MiB:.2f} MiB above the memory "
            "in use in every sampling interval (the steps' own working memory): no spike"
        )
    shown = ", ".join(str(end) for end, _ in spikes[:6]) + (", ..." if len(spikes) > 6 else "")
    above = max(extra for _, extra in spikes)
    text = (
        f"peak {top / MiB:.2f} MiB: spikes of up to {above / MiB:.2f} MiB above the steps' own "
        f"working memory in {len(spikes)} of {len(peaks)} sampling intervals (those ending at "
        f"steps {shown})"
    )
    if len(spikes) >= 3:
        # The mean gap: a spike every 50 steps seen by intervals of 20 steps ends
        # intervals 40 and 60 steps apart in turn, and 50 on average.
        every = (spikes[-1][0] - spikes[0][0]) / (len(spikes) - 1)
        text += f": about every {every:.0f} steps"
    return text

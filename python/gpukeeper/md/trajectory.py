"""``benchmark_md_trajectory``: argument checks, warm-up, plan, measured loop, and its result."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, Union

import gpukeeper.md.events as events
from gpukeeper import frameworks
from gpukeeper.base import nvml
from gpukeeper.base.arg_checks import check_bool, check_callable, check_int, check_positive
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.progress import REDRAW_S, ProgressBar, progress_wanted
from gpukeeper.cleanup.tracking import AllocationTracker
from gpukeeper.frameworks import FrameworkAdapter
from gpukeeper.md.leak import LeakVerdict, memory_outcome, outside_frameworks
from gpukeeper.md.leak_causes import ArraysBefore, arrays_before, leak_cause
from gpukeeper.md.loop import LoopOptions, run_loop
from gpukeeper.md.trajectory_result import LatencyStats, TrajectoryResult, latency_stats
from gpukeeper.timing import memory_readers as memory
from gpukeeper.timing.plans import Plan, choose_plan, confirm_plan, cpu_plan
from gpukeeper.timing.sampling import StepSampler, sample_period
from gpukeeper.timing.timer import timing_device

MiB = float(1 << 20)

__all__ = [
    "benchmark_md_trajectory",
    "checked_arguments",
    "warm_up",
    "WarmUp",
    "step_statistics",
    "throughput",
    "EVENTS_COVER",
    "PROGRESS_AUTO_MIN_STEPS",
]

PROGRESS_AUTO_MIN_STEPS = 5000
#: Events decide the throughput only when the steps' GPU times add up to at least this
#: share of the loop's wall time: then the timed stream was busy between the marks and
#: the events hold the work (and leave out the bookkeeping between steps). Below it, work
#: ran where the events do not look (another context, an engine's own stream) or after
#: the last mark, and the wall clock decides.
EVENTS_COVER = 0.99


# --------------------------------------------------------------------- arguments


def checked_arguments(
    model_func: Any,
    inputs: Any,
    warmup_steps: Any,
    timestep_fs: Any,
    n_atoms: Any,
    name: Optional[str],
    memory_sample_every: Any,
    sync_every: Any,
    n_steps: Any,
    timing: Any,
    leak_tolerance_mb: Any,
    outlier_k: Any,
    event_ring: Any,
    synchronize: Any,
    event_every: Any = "auto",
) -> Tuple[Sequence[Any], int, Optional[float], str]:
    """benchmark_md_trajectory's arguments checked (InvalidInputError otherwise, for the
    first bad one in this order): (the per-step inputs as a sequence, measured steps,
    timestep, label)."""
    check_callable(model_func, "model_func")
    data = _checked_inputs(inputs)
    check_int(warmup_steps, "warmup_steps", 0)
    n = len(data) if n_steps is None else check_int(n_steps, "n_steps", 1)
    timestep = check_positive(timestep_fs, "timestep_fs")
    _check_periods(n_atoms, sync_every, memory_sample_every, event_every)
    _check_settings(timing, leak_tolerance_mb, outlier_k, event_ring)
    check_callable(synchronize, "synchronize", optional=True)
    return data, n, timestep, _label(name, model_func)


def _checked_inputs(inputs: Any) -> Sequence[Any]:
    """The per-step inputs as a sequence (an iterable is materialized): not a string,
    not empty."""
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
        raise InvalidInputError(
            f"inputs must be an iterable of per-step inputs, got {type(inputs).__name__}"
        )
    data: Sequence[Any] = inputs if isinstance(inputs, Sequence) else list(inputs)
    if len(data) == 0:
        raise InvalidInputError("inputs is empty: a trajectory needs at least one step")
    return data


def _check_periods(
    n_atoms: Any, sync_every: Any, memory_sample_every: Any, event_every: Any
) -> None:
    """The counts that may be left out (None, or "auto" for the two periods chosen from
    the run): each an int >= 1 when given."""
    if n_atoms is not None:
        check_int(n_atoms, "n_atoms", 1)
    if sync_every is not None:
        check_int(sync_every, "sync_every", 1)
    if memory_sample_every != "auto":
        check_int(memory_sample_every, "memory_sample_every", 1)
    if event_every != "auto":
        check_int(event_every, "event_every", 1)


def _check_settings(timing: Any, leak_tolerance_mb: Any, outlier_k: Any, event_ring: Any) -> None:
    """How the run is timed and judged: the timing mode, the leak tolerance (0, or a
    positive number of MiB), the outlier threshold and the event ring's size."""
    if timing not in ("auto", "gpu", "host"):
        raise InvalidInputError(f"timing must be 'auto', 'gpu' or 'host', got {timing!r}")
    if leak_tolerance_mb != 0:
        check_positive(leak_tolerance_mb, "leak_tolerance_mb")
    check_positive(outlier_k, "outlier_k")
    check_int(event_ring, "event_ring", 1)


def _label(name: Optional[str], model_func: Any) -> str:
    """The run's label: ``name``, else the function's name, else its type's."""
    return name or getattr(model_func, "__name__", None) or type(model_func).__name__


# --------------------------------------------------------------------- warm-up and setup


@dataclass
class WarmUp:
    """What the warm-up saw: its last result, each step's host latency (ns), and the
    wall time of a step (ns) over its second half between two device waits (0: not
    measured)."""

    last: Any
    host_ns: List[int]
    step_ns: float = 0.0


def warm_up(
    model: Callable[[Any], Any],
    cyc: Iterable[Any],
    steps: int,
    settle: Optional[Callable[[], None]],
) -> WarmUp:
    """Runs ``steps`` warm-up calls. With ``settle`` (a device wait), the second half is
    timed from a wait to a wait: the wall time of a step as the loop will see it (GPU
    work and launch gaps included), from which the GPU event period is chosen."""
    pc = time.perf_counter_ns
    tail = (steps + 1) // 2 if settle is not None else 0
    host_ns: List[int] = []
    out: Any = None
    t_tail = 0
    it = iter(cyc)
    for j in range(steps):
        if j == steps - tail and settle is not None:
            settle()
            t_tail = pc()
        x = next(it)
        t0 = pc()
        out = model(x)
        host_ns.append(pc() - t0)
    step_ns = 0.0
    if tail and settle is not None:
        settle()
        step_ns = (pc() - t_tail) / tail
    return WarmUp(out, host_ns, step_ns)


def _event_marks(
    plan: Plan,
    n: int,
    event_ring: int,
    event_every: Union[int, str],
    step_ns: float,
    synchronize: Optional[Callable[[], Any]],
) -> Tuple[Plan, Optional[events.EventMarks], Optional[int]]:
    """The ring of GPU marks and the steps per interval, for an "events" plan (the plan
    with its timing method in words); no events for any other plan, or where no backend
    gives device events (the plan then times the framework's work on the host clock)."""
    if plan.kind != "events":
        return plan, None, None
    backend = events.event_backend(plan.index)  # type: ignore[arg-type]
    if not backend.is_gpu:
        return (
            Plan(
                "framework",
                plan.index,
                "host clock (no CUDA events usable here), ended by a device synchronization",
                synchronize,
                per_call=False,
            ),
            None,
            None,
        )
    marks = events.EventMarks(backend, min(n, event_ring))
    if event_every == "auto":
        k = events.choose_event_every(step_ns, events.event_cost_ns(marks), n)
    else:
        k = int(event_every)
    return (
        Plan("events", plan.index, events.events_how(k, synchronize), synchronize, per_call=False),
        marks,
        k,
    )


def _memory_probes(
    plan: Plan,
    memory_sample_every: Union[int, str],
    n: int,
    warm_ns: List[int],
    event_every: Optional[int],
    warnings: List[str],
) -> Tuple[Optional[StepSampler], Optional[memory.MemorySeries]]:
    """The memory sampler of the run and the NVML cross-check series (either may be None):
    the series :func:`gpukeeper.timing.memory_readers.memory_series` picks for the plan.
    The memory outside every framework (NVML's figure less the frameworks' reserved
    bytes) is also read during the run, as often as :data:`OUTSIDE_SHARE` of the run's
    time allows (at most :data:`OUTSIDE_READS` times)."""
    series, cross = memory.memory_series(plan.kind, plan.index, plan.synchronize, warnings)
    every = sample_period(series, memory_sample_every, n, warm_ns, align=event_every or 1)
    side, side_every = None, 0
    if cross is not None and plan.index is not None:
        side = _outside_reader(cross, plan.index)
        side_every = _outside_period(side, n, every, warm_ns)
    return StepSampler(series, every, n, side, side_every), cross


#: The readings of the memory outside every framework during a run cost at most this
#: share of its time (an NVML process list is read: about 20 us) ...
OUTSIDE_SHARE = 0.001
#: ... and are at most this many, and at least this many whatever they cost (about 60 us
#: in all): a library that sets itself up in the first steps (cuBLAS took 64-92 MiB
#: outside PyTorch's allocator) is then growth before the second half, not a leak.
OUTSIDE_READS = 16
OUTSIDE_MIN_READS = 3


def _outside_reader(cross: memory.MemorySeries, index: int) -> Callable[[], int]:
    nvml, reserved = cross.read, frameworks.reserved_bytes

    def read() -> int:
        return nvml() - reserved(index)

    return read


def _outside_period(read: Callable[[], int], n: int, every: int, warm_ns: List[int]) -> int:
    """Memory samples between two readings of ``read`` (0: none during the run)."""
    costs = []
    for _ in range(2):  # the first read of a process may be cold
        t0 = time.perf_counter_ns()
        read()
        costs.append(time.perf_counter_ns() - t0)
    step_ns = sorted(warm_ns)[len(warm_ns) // 2] if warm_ns else 0
    afford = int(OUTSIDE_SHARE * n * step_ns / max(min(costs), 1))
    reads = min(OUTSIDE_READS, max(OUTSIDE_MIN_READS, afford))
    samples = n // every
    if samples < OUTSIDE_MIN_READS + 1:
        return 0
    return max(1, samples // (reads + 1))


def _progress_bar(
    progress: Optional[bool], n: int, event_every: Optional[int], step_s: float
) -> Optional[ProgressBar]:
    """The bar of an ``n``-step run whose warm-up steps took ``step_s`` each (0: unknown):
    redrawn every 1% of the steps, or every quarter second when that comes sooner, on
    steps that end an interval of the GPU marks anyway."""
    if progress is None and n < PROGRESS_AUTO_MIN_STEPS:
        return None
    if not progress_wanted(progress):
        return None
    bar = ProgressBar(n, "trajectory", "steps")
    if step_s > 0:
        bar.every = max(1, min(bar.every, int(REDRAW_S / step_s)))
    if event_every and event_every > 1:
        bar.every = max(event_every, bar.every // event_every * event_every)
    return bar


# --------------------------------------------------------------------- statistics and throughput


def step_statistics(
    host_ms: List[float],
    gpu_ms: Optional[List[float]],
    marks: Optional[events.EventMarks],
    sync_every: Optional[int],
    outlier_k: float,
    n: int,
    warnings: List[str],
) -> Tuple[LatencyStats, Optional[LatencyStats], Optional[List[float]], Optional[float]]:
    """(host statistics, GPU statistics or None, the GPU times kept, the share of probed
    marks that found the timed stream busy); what is worth saying goes to ``warnings``."""
    host_stats = latency_stats(host_ms, outlier_k)
    busy = marks.busy_fraction() if marks is not None else None
    if gpu_ms and marks is not None and busy == 0.0 and marks.probes >= 3:
        # Every probed mark completed at once: the laps are the host's time between
        # records, not work on the device (which ran elsewhere, or was done already).
        warnings.append(
            f"the timed stream was idle at each of {marks.probes} probed marks: the step's "
            "GPU work runs elsewhere (another engine's CUDA context, another stream), or the "
            "device finishes it before the host returns; per-step times are host latencies"
        )
        gpu_ms = []
    gpu_stats = latency_stats(gpu_ms, outlier_k) if gpu_ms else None
    if (
        gpu_stats is not None
        and sync_every is None
        and gpu_stats.median_ms < 0.05 * host_stats.median_ms
    ):
        warnings.append(
            "GPU time is under 5% of host latency: the model may run on the CPU "
            "(pass device='cpu' or timing='host')"
        )
    primary = gpu_stats if gpu_stats is not None else host_stats
    if primary.outlier_steps:
        warnings.append(
            f"{len(primary.outlier_steps)} outlier step(s) above "
            f"{primary.outlier_threshold_ms:.4f} ms"
        )
    if n >= 20 and not math.isnan(primary.drift_pct) and abs(primary.drift_pct) > 10.0:
        warnings.append(
            f"latency drifts by {primary.drift_pct:+.1f}% from the first to the last decile"
        )
    return host_stats, gpu_stats, gpu_ms, busy


def throughput(
    n: int,
    total_time: float,
    gpu_ms: Optional[List[float]],
    synchronized: Optional[bool],
    busy: Optional[float] = None,
) -> Tuple[float, str, Optional[float]]:
    """(steps per second, what decided it, events coverage): the wall clock of the whole
    loop, unless the events provably hold the work: the marks probed right after their
    record were mostly still pending (``busy``, the stream had work queued) and the
    steps' GPU times add up to nearly all of the loop (:data:`EVENTS_COVER`). Coverage
    alone proves nothing: laps between marks on an idle stream add up to the wall time
    too."""
    steps_per_s = n / total_time if total_time > 0 else math.inf
    source = "wall clock of the whole trajectory" + (
        "" if synchronized is not False else " (without a final synchronization)"
    )
    if not gpu_ms:
        return steps_per_s, source, None
    gpu_total_s = math.fsum(gpu_ms) / 1e3
    coverage = gpu_total_s / total_time if total_time > 0 else None
    if (
        coverage is not None
        and coverage >= EVENTS_COVER
        and gpu_total_s > 0
        and busy is not None
        and busy >= 0.5
    ):
        return (
            n / gpu_total_s,
            (
                f"events: the timed stream was busy at {busy:.0%} of the probed marks and the "
                f"steps' GPU times add up to {coverage:.1%} of the loop's wall time"
            ),
            coverage,
        )
    if coverage is not None and (busy is None or busy < 0.5):
        source += (
            ": the timed stream was not shown busy at the marks, so the events "
            "need not hold the work"
        )
    elif coverage is not None:
        source += (
            f": the steps' GPU times add up to only {coverage:.1%} of it, so the "
            "events do not hold all of the work (it runs elsewhere, or after the "
            "last mark)"
        )
    return steps_per_s, source, coverage


# --------------------------------------------------------------------- the benchmark


@dataclass
class _Run:
    """One run's decisions and readings, from the warm-up to the result."""

    label: str
    n: int
    warmup_steps: int
    timestep: Optional[float]
    n_atoms: Optional[int]
    sync_every: Optional[int]
    leak_tolerance_mb: float
    outlier_k: float
    synchronize: Optional[Callable[[], Any]]
    plan: Plan = field(default_factory=lambda: cpu_plan(per_call=False))
    warnings: List[str] = field(default_factory=list)
    warmup_time: float = 0.0
    marks: Optional[events.EventMarks] = None
    event_every: Optional[int] = None
    sampler: Optional[StepSampler] = None
    cross: Optional[memory.MemorySeries] = None
    arrays_before: Optional[ArraysBefore] = None
    track: bool = False  # record the creating lines of what the steps make
    tracker: Optional[AllocationTracker] = None

    def sync(self) -> None:
        """Waits for the steps' work: the frameworks' on the device, and the caller's."""
        self.plan.sync()


def _prepare(
    run: _Run,
    model_func: Callable[[Any], Any],
    data: Sequence[Any],
    device: Any,
    timing: str,
    event_every: Union[int, str],
    event_ring: int,
) -> Any:
    """Device, warm-up, plan and GPU marks of ``run``; returns the last warm-up result."""
    # The plan is timing's (one rule for benchmark_function and this): a pure-Python or
    # numpy model must not be "timed" on an idle GPU, and a synchronize callable says the
    # steps run where gpukeeper cannot wait (another engine's context): events on the
    # framework's stream would time that stream, and on the legacy default stream they
    # serialize the engine's streams at every mark (an OpenMM loop beside torch ran 8%
    # slower with them). Host clock then, unless timing="gpu" asks for events.
    plan = choose_plan(device, timing_device(device), run.synchronize, timing, per_call=False)
    if timing == "gpu" and plan.kind != "events":
        raise InvalidInputError(
            f"timing='gpu' needs a CUDA device and PyTorch or CuPy loaded (device: "
            f"{'cpu' if plan.index is None else f'cuda:{plan.index}'}); an engine's own context "
            "or JAX is timed on the host clock"
        )
    index = plan.index
    settle = (
        (lambda: frameworks.synchronize_all(index))
        if plan.kind == "events" and event_every == "auto"
        else None
    )
    t_w = time.perf_counter()
    warm = warm_up(model_func, itertools.cycle(data), run.warmup_steps, settle)
    run.plan = confirm_plan(plan, device, warm.last)
    waits_on = run.plan.waits_on
    if waits_on is not None:
        waits_on.block_until_ready(warm.last)
    warm.last = None
    run.sync()
    run.warmup_time = time.perf_counter() - t_w
    run.plan, run.marks, run.event_every = _event_marks(
        run.plan, run.n, event_ring, event_every, warm.step_ns, run.synchronize
    )
    return warm


def _blocking(model_func: Callable[[Any], Any], fw: FrameworkAdapter) -> Callable[[Any], Any]:
    """The step of a model in a framework that waits on its results (JAX): its result
    waited for (``jax.block_until_ready``)."""
    block = fw.block_until_ready

    def step(x: Any) -> Any:
        return block(model_func(x))

    return step


def _result(
    run: _Run,
    host_ns: "array[int]",
    total_time: float,
    initial: Optional[List[int]],
    final: Optional[List[int]],
    cross: Tuple[Any, Any],
) -> TrajectoryResult:
    """The TrajectoryResult of a finished loop."""
    plan, n, warnings = run.plan, run.n, run.warnings
    mem = memory_outcome(run.sampler, final, n, run.leak_tolerance_mb, warnings)
    series = run.sampler.series if run.sampler is not None else []
    verdict, where, cause = _where_and_why(run, mem, cross, warnings)
    headroom = _headroom(run, mem, series)
    host_ms = [v / 1e6 for v in host_ns]
    gpu_ms = run.marks.step_times_ms() if run.marks is not None else None
    host_stats, gpu_stats, gpu_ms, busy = step_statistics(
        host_ms, gpu_ms, run.marks, run.sync_every, run.outlier_k, n, warnings
    )
    # ---- throughput: the wall clock, unless the events provably hold the work
    synchronized: Optional[bool] = plan.synchronized
    unsynchronized = plan.warning()
    if unsynchronized is not None:
        warnings.append(unsynchronized)
    steps_per_s, thr_source, coverage = throughput(n, total_time, gpu_ms, synchronized, busy)
    return TrajectoryResult(
        name=run.label,
        device="cpu" if plan.index is None else f"cuda:{plan.index}",
        n_steps=n,
        warmup_steps=run.warmup_steps,
        timing_source="gpu" if gpu_stats is not None else "host",
        host_times_ms=host_ms,
        gpu_times_ms=gpu_ms if gpu_ms else None,
        host=host_stats,
        gpu=gpu_stats,
        total_time_s=total_time,
        warmup_time_s=run.warmup_time,
        steps_per_s=steps_per_s,
        ns_per_day=steps_per_s * run.timestep * 1e-6 * 86400.0
        if run.timestep is not None
        else None,
        us_per_atom_step=(
            1e6 / steps_per_s / run.n_atoms if run.n_atoms is not None and steps_per_s > 0 else None
        ),
        timestep_fs=run.timestep,
        n_atoms=run.n_atoms,
        sync_every=run.sync_every,
        memory_source=series[0].name if series else None,
        memory_sample_every=run.sampler.every if run.sampler is not None else None,
        memory_steps=mem.steps,
        memory_bytes=mem.bytes,
        memory_initial_bytes=initial[0] if initial else None,
        memory_final_bytes=final[0] if final else None,
        memory_peak_bytes=mem.peak,
        memory_slope_bytes_per_step=mem.slope,
        memory_slope_all_bytes_per_step=mem.slope_all,
        leak_tolerance_mb=float(run.leak_tolerance_mb),
        memory_leak=verdict.leak if verdict is not None else mem.leak,
        warnings=warnings,
        work="cpu" if plan.kind == "cpu" else "gpu",
        timing_method=plan.how,
        synchronized=synchronized,
        throughput_source=thr_source,
        events_coverage=coverage,
        memory_leak_source=verdict.source if verdict else None,
        memory_leak_reason=verdict.reason if verdict else "",
        memory_noise_bytes=verdict.noise if verdict else None,
        memory_series=mem.all_series,
        event_every=run.event_every,
        memory_leak_where=where,
        memory_leak_cause=cause,
        memory_peak_text=mem.peak_text,
        memory_headroom_bytes=headroom,
    )


def _where_and_why(
    run: _Run, mem: Any, cross: Tuple[Any, Any], warnings: List[str]
) -> Tuple[Optional[LeakVerdict], Optional[str], str]:
    """One verdict from every series read: the sampled series' (a framework's counters,
    or host memory), and NVML's figure for this process less the frameworks' reserved
    bytes (memory outside every framework). Either growing past the tolerance is a leak;
    growth of the frameworks' cache alone is not. Returns the verdict, where the memory
    grows (None when it does not) and the cause named for a leak."""
    verdict: Optional[LeakVerdict] = mem.verdict
    n, tolerance = run.n, run.leak_tolerance_mb
    middle: List[Tuple[float, int]] = []
    if run.sampler is not None:
        sampler = run.sampler
        middle = [
            (float(sampler.side_steps[k] + 1), int(sampler.side_values[k]))
            for k in range(sampler.side_count)
        ]
    outside, cache = outside_frameworks(cross[0], cross[1], n, tolerance, middle)
    where: Optional[str] = None
    if verdict is not None and verdict.leak:
        where = verdict.source
    elif outside is not None:
        verdict, where = outside, outside.source
        mem.leak = True
    elif verdict is not None and cache > tolerance * MiB:
        verdict = dataclasses.replace(
            verdict,
            reason=f"{verdict.reason}; the frameworks' cache grew {cache / MiB:+.2f} MiB (reserved "
            "bytes) while the memory in use did not: kept for reuse, not a leak",
        )
    if outside is not None:
        warnings.append(outside.reason)  # also beside a framework's own leak: both are said
    cause = ""
    if where is not None and where != "outside frameworks" and verdict is not None:
        sites = run.tracker.sites if run.tracker is not None else None
        cause = leak_cause(
            run.arrays_before, _array_device(run.plan.index), n, verdict.slope, sites
        )
    return verdict, where, cause


def _headroom(run: _Run, mem: Any, series: List[memory.MemorySeries]) -> Optional[int]:
    """The device's free bytes at the run's peak, and its words added to the peak's: the
    free bytes after the run, less what the peak took beyond what the process still
    holds now (the frameworks' reserved bytes when the series counts bytes in use: a
    cache that kept the spike's memory has it already). None off the GPU, without a
    peak, or where the device's free memory cannot be read."""
    index = run.plan.index
    if index is None or mem.peak is None or not mem.bytes or not series:
        return None
    try:
        free, total, _how = nvml.device_free_total(index)
        held = frameworks.reserved_bytes(index) if series[0].in_use else mem.bytes[-1]
    except Exception:
        return None
    headroom = free - max(0, mem.peak - held)
    text = (
        f"headroom at the peak: about {headroom / MiB:.0f} MiB of the device's "
        f"{total / MiB:.0f} MiB free (read after the run: other processes move it)"
    )
    mem.peak_text = f"{mem.peak_text}; {text}" if mem.peak_text else text
    return headroom


def _array_device(index: Optional[int]) -> Any:
    return "cpu" if index is None else index


def _measure(
    run: _Run,
    model_func: Callable[[Any], Any],
    data: Sequence[Any],
    warm: WarmUp,
    check_memory_leak: bool,
    memory_sample_every: Union[int, str],
    progress: Optional[bool],
) -> TrajectoryResult:
    """The measured loop of a prepared run, with its memory probes, and its result."""
    plan, n = run.plan, run.n
    if check_memory_leak:
        run.sampler, run.cross = _memory_probes(
            plan, memory_sample_every, n, warm.host_ns, run.event_every, run.warnings
        )
    warm_step = run.warmup_time / run.warmup_steps if run.warmup_steps else 0.0
    bar = _progress_bar(progress, n, run.event_every, warm_step)
    # Preallocated: array stores keep no Python objects alive per step, so the
    # bookkeeping itself neither allocates nor grows the memory it watches.
    host_ns = array("q", bytes(8 * n))
    source = data if n == len(data) else itertools.islice(itertools.cycle(data), n)
    cross_before = memory.cross_reading(run.cross, plan.index)
    if check_memory_leak:
        # Noted before the first step, named after the last only for a leak: a clean
        # loop pays two walks of the live objects, outside the measured loop.
        run.arrays_before = arrays_before(_array_device(plan.index))
    initial = run.sampler.start() if run.sampler is not None else None
    waits = plan.index is not None or run.synchronize is not None  # else nothing to wait for
    options = LoopOptions(
        run.sync if waits else None,
        run.sync_every,
        run.marks,
        run.event_every or 1,
        run.sampler,
        bar,
    )
    waits_on = plan.waits_on
    model = _blocking(model_func, waits_on) if waits_on is not None else model_func
    if run.track:
        run.tracker = AllocationTracker(4)
        run.tracker.start()
        run.warnings.append(
            "track_allocations: every tensor or array the steps made was recorded with its "
            "Python lines, which costs microseconds an operation: the step times are slower "
            "than the loop's own"
        )
    try:
        total_time, pending = run_loop(model, source, n, host_ns, options)
    finally:
        if run.tracker is not None:
            run.tracker.stop()
    if run.marks is not None:
        run.marks.resolve(pending)
    if bar is not None:
        bar.close()
    final = run.sampler.finish() if run.sampler is not None else None
    cross_after = memory.cross_reading(run.cross, plan.index)
    return _result(run, host_ns, total_time, initial, final, (cross_before, cross_after))


def benchmark_md_trajectory(
    model_func: Callable[[Any], Any],
    inputs: Iterable[Any],
    check_memory_leak: bool = True,
    warmup_steps: int = 10,
    timestep_fs: Optional[float] = None,
    n_atoms: Optional[int] = None,
    device: Any = None,
    name: Optional[str] = None,
    memory_sample_every: Union[int, str] = "auto",
    progress: Optional[bool] = None,
    sync_every: Optional[int] = None,
    *,
    n_steps: Optional[int] = None,
    timing: str = "auto",
    leak_tolerance_mb: float = 1.0,
    outlier_k: float = 5.0,
    event_ring: int = 4096,
    event_every: Union[int, str] = "auto",
    synchronize: Optional[Callable[[], Any]] = None,
    track_allocations: bool = False,
) -> TrajectoryResult:
    """Runs ``model_func(x)`` once per step over ``inputs`` and profiles every step.

    Args (the MD guide, docs/md.md, gives each rule in full):
        model_func: called with one input per step; its result is kept until the next
            step (as an integrator keeps the forces). inputs: the per-step inputs (any
            iterable, materialized first); ``n_steps`` (default ``len(inputs)``) cycles them.
        check_memory_leak: sample memory and give a leak verdict (``memory_leak``), with
            ``leak_tolerance_mb`` the projected growth over the run that makes a leak.
        warmup_steps: unmeasured calls first. timestep_fs, n_atoms: enable ``ns_per_day``
            and ``us_per_atom_step``. name: the label (default: the function's name).
        device: where the model runs; None picks as ``benchmark_function`` does
            (:mod:`gpukeeper.timing.plans`); ``"cpu"`` for a CPU model on a GPU machine.
        memory_sample_every: read memory after every N-th step, or "auto".
        progress: a progress bar on stderr (None: long runs on a terminal, not in CI).
        sync_every: synchronize inside every k-th step's measured window.
        timing: "auto" (GPU events on CUDA, else host), "gpu" or "host".
        outlier_k: outlier threshold in robust standard deviations.
        event_ring, event_every: GPU marks kept before they are resolved, and a mark
            after every k-th step ("auto": the marks cost at most 0.5 % of a step on the
            device and 0.4 us or 0.1 % on the host; ``result.event_every`` is the k used).
        synchronize: waits for an engine's own work (OpenMM's ``context.getState``);
            its memory then comes from NVML's figure for this process.
        track_allocations: record where each array made in the measured steps was made,
            so that a leak's cause names the line (each operation costs microseconds more).

    Returns a :class:`TrajectoryResult`. Raises ``InvalidInputError`` for bad arguments;
    exceptions of ``model_func`` propagate unchanged.
    """
    data, n, timestep, label = checked_arguments(
        model_func,
        inputs,
        warmup_steps,
        timestep_fs,
        n_atoms,
        name,
        memory_sample_every,
        sync_every,
        n_steps,
        timing,
        leak_tolerance_mb,
        outlier_k,
        event_ring,
        synchronize,
        event_every,
    )
    run = _Run(
        label,
        n,
        warmup_steps,
        timestep,
        n_atoms,
        sync_every,
        leak_tolerance_mb,
        outlier_k,
        synchronize,
        track=check_bool(track_allocations, "track_allocations") and check_memory_leak,
    )
    warm = _prepare(run, model_func, data, device, timing, event_every, event_ring)
    return _measure(run, model_func, data, warm, check_memory_leak, memory_sample_every, progress)

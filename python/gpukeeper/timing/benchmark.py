"""``benchmark_function``: one function timed call by call, and the steps it is made of.

The steps: the options checked, the set-up (device, plan, L2 flush), the warm-up with its
gate probe, the measured loop (each GPU call through ``CUDATimer.time_call``) and the
result.

How one call is measured (GPU; see ``benchmark_function`` for the CPU):

1. close a gate on the timed stream (see below);
2. optionally flush the L2 cache: fill a buffer of exactly the L2 size on the timed
   stream, so that every call starts cold (nvbench's ``l2flush``) instead of finding
   its inputs in L2 from the previous call;
3. host clock; start event on the current stream; ``fn(*args, **kwargs)``; stop event;
   open the gate;
4. wait for the stop event; host clock.

GPU time = stop - start (events); host time = the two host clock readings, i.e. launch
plus wait: the latency a caller of ``fn`` sees. Waiting after every call is what makes
per-call times (and the noise-based stop) possible. It also means the device is idle
when each start event is recorded: without a gate, the GPU time of a short call would
include the launch latency of its first kernel (a 10 us kernel reads ~14 us). The gate
(``_core.StreamGate``, nvbench's blocking kernel) holds the stream while the host
launches, so the device runs start event, ``fn``'s kernels and stop event back to back:
the GPU time is the device's work alone, less the device's own cost of the bracket (the
launch floor: the same gated events around an empty kernel, taken in place behind each
call's gate just before its start event, the median of the last 21 subtracted;
``result.gpu_floor_ms``). A function that waits for the GPU inside
(``.item()``, a synchronize, a copy from pageable memory) cannot run behind a closed
gate; the last warm-up call finds that out (its gate times out) and such functions are
timed without a gate, with a warning. Steps 1 to 4 are ``CUDATimer.time_call``: the gate,
the floor and the events are the timer's; this module decides when to gate.

That per-call GPU time is the *device time*: the call's own work as if the host launched
it infinitely fast. A user's loop does not see it when the host's launches, not the
device, set the pace (a small model called millions of times, twenty small kernels, an
eager step next to its CUDA graph). So the calls are then run once more the way a loop
runs them: batches of back-to-back calls, nothing between them, each batch timed by the
wall clock from a synchronized start to a synchronized end. A batch lasts about
``LOOP_BATCH_MS``, so its one synchronisation and the first launch on an idle device
(about 18 us on an H100) cost under 0.1 % of it. That is the *loop time* per call, the
headline by default (``measure="loop"``); the ratio of the two is the share of the loop
the device was busy, and from it (and the gate) the verdict on what bounds the call: the
device, the host's launches, or a synchronisation inside the call.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpukeeper import frameworks
from gpukeeper.base.arg_checks import check_callable, check_choice, check_int, check_positive
from gpukeeper.base.device_names import DeviceSpec
from gpukeeper.base.errors import GpuError, InvalidInputError
from gpukeeper.base.progress import REDRAW_S, ProgressBar, progress_wanted
from gpukeeper.cleanup.measure import OUTSIDE_NOTE
from gpukeeper.frameworks import FrameworkAdapter
from gpukeeper.frameworks.ranks import RankStep, check_group
from gpukeeper.timing import stats
from gpukeeper.timing.benchmark_result import BenchmarkResult
from gpukeeper.timing.l2 import L2Flusher
from gpukeeper.timing.loop_time import LoopBatches, bound_verdict, run_batches
from gpukeeper.timing.plans import (
    HostSync,
    host_sync_plan,
    result_plan,
    timer_plan,
    unsynchronized_warning,
)
from gpukeeper.timing.sampling import MemorySampler
from gpukeeper.timing.stopping import StopRule
from gpukeeper.timing.throttle import ClockWatch
from gpukeeper.timing.timer import (
    CUDATimer,
    TimerBackend,
    can_hide_launch_latency,
    check_gate_timeout,
    select_backend,
    timing_device,
)

__all__ = [
    "DEVICE_BOUND_SHARE",
    "LOOP_BATCH_MS",
    "MEASURES",
    "NOISY_THRESHOLD",
    "benchmark_function",
]

#: Relative noise (std/mean) above which a result is flagged ``noisy`` when no
#: ``max_noise`` was asked for.
NOISY_THRESHOLD = 0.10

# A gate must stay closed while the host issues one call; it times out after this many
# times the slowest warm-up call's host time, within these bounds (ms). A function that
# waits for the GPU inside stalls for that long once, in the probing warm-up call.
_GATE_TIMEOUT_FACTOR = 20.0
_GATE_TIMEOUT_MIN_MS = 50.0
_GATE_TIMEOUT_MAX_MS = 2000.0

#: What the headline statistics of a result are of: ``"loop"``, the time per call of
#: calls run back to back; ``"device"``, the call's own GPU work with the launch hidden.
MEASURES = ("loop", "device")
#: A loop batch (back-to-back calls between two synchronisations) lasts about this long
#: (ms). The batch's one synchronisation and the launch of its first call on an idle
#: device cost about 18 us a batch on an H100 (a 5 ms %globaltimer kernel read +0.18 %
#: in 10 ms batches): at 25 ms that is 0.07 %.
LOOP_BATCH_MS = 25.0
#: At least this many batches make a loop time's statistics (each averages 25 ms of
#: calls, so six give as steady a median as ten of 10 ms did, in 1.5 times the time).
MIN_LOOP_BATCHES = 6
#: Calls in one batch at most (a batch of ~0.25 us calls is still 25 ms).
MAX_LOOP_CALLS = 100_000
#: The device bounds a call when it is busy for at least this share of the loop time.
DEVICE_BOUND_SHARE = 0.9


# --------------------------------------------------------------------- the function


def callable_name(fn: Callable[..., Any]) -> str:
    """The name a result takes from ``fn``: its qualified name, except where that names a
    private class of a library (torch.matmul's is ``_VariableFunctionsClass.matmul``),
    which becomes ``module.name`` (``torch.matmul``); ``functools.partial`` objects are
    named after what they wrap."""
    if isinstance(fn, functools.partial):
        return f"partial({callable_name(fn.func)})"
    qualname = getattr(fn, "__qualname__", None)
    if not qualname:
        return repr(fn)
    owner = qualname.split(".")[:-1]
    module, short = getattr(fn, "__module__", None), getattr(fn, "__name__", None)
    if any(part.startswith("_") for part in owner) and module and short:
        return f"{module}.{short}"
    return str(qualname)


def benchmark_function(
    fn: Callable[..., Any],
    *args: Any,
    n_calls: int = 100,
    warmup: int = 10,
    device: Any = None,
    name: Optional[str] = None,
    l2_flush: bool = False,
    min_time_s: Optional[float] = None,
    max_noise: Optional[float] = None,
    hide_launch_latency: Optional[bool] = None,
    gate_timeout_ms: Optional[float] = None,
    synchronize: Optional[Callable[[], Any]] = None,
    barrier: Any = None,
    measure: str = "loop",
    **kwargs: Any,
) -> BenchmarkResult:
    """Times ``fn(*args, **kwargs)`` call by call and returns a ``BenchmarkResult``.

    After ``warmup`` unmeasured calls it takes two times per call: the *device time*
    (``n_calls`` calls one by one between events, behind a gate that hides the launch
    latency; on the CPU the host time) and the *loop time* (the calls back to back in
    batches, as a loop runs them). ``measure`` (``"loop"`` or ``"device"``) picks the
    headline that ``median_ms`` and comparisons use; ``bound`` says what sets the pace.

    ``device`` None picks CUDA when a loaded PyTorch or CuPy can use it, JAX's GPU for JAX
    results, an engine's CUDA context when no framework is loaded, else the CPU.
    ``l2_flush`` starts every timed call with a cold L2. ``hide_launch_latency`` (None:
    where the gate kernel exists, with a warned fallback; True: required; False: never)
    and ``gate_timeout_ms`` govern the gate. ``min_time_s`` and ``max_noise`` (nvbench's
    criterion) decide when to stop. ``synchronize`` waits for an engine's work (OpenMM's
    ``context.getState``). ``barrier`` (a ``ProcessGroup`` or True) steps the ranks of a
    job together. The result also holds the memory of the work measured, NVML's clock
    throttling and torch.compile's recompiles; the Timing guide gives each rule in full.

    Exceptions raised by ``fn`` propagate unchanged; bad arguments raise
    ``InvalidInputError``.
    """
    opts = _check_options(
        fn,
        name,
        n_calls,
        warmup,
        l2_flush,
        min_time_s,
        max_noise,
        hide_launch_latency,
        gate_timeout_ms,
        synchronize,
        barrier,
        measure,
    )
    run = _prepare(fn, args, kwargs, device, opts)
    _warm_up(run, opts)
    watch = _Watch(run)
    samples = _measure(run, opts)
    _measure_loop(run, opts, samples)
    watch.stop(run)
    return _result(run, opts, samples, watch)


# --------------------------------------------------------------------- options


@dataclass
class _Options:
    """``benchmark_function``'s arguments, checked, under the names the caller gave them
    (``name`` is the label used: the function's own name when none was given)."""

    name: str
    n_calls: int
    warmup: int
    min_time_s: Optional[float]
    max_noise: Optional[float]
    l2_flush: bool
    hide_launch_latency: Optional[bool]
    gate_timeout_ms: Optional[float]
    synchronize: Optional[Callable[[], Any]]
    in_step: bool = False  # put the ranks of barrier_group in step before each call
    barrier_group: Any = None  # None with in_step: the default group
    measure: str = "loop"


def _check_options(
    fn: Any,
    name: Any,
    n_calls: Any,
    warmup: Any,
    l2_flush: Any,
    min_time_s: Any,
    max_noise: Any,
    hide_launch_latency: Any,
    gate_timeout_ms: Any,
    synchronize: Any,
    barrier: Any = None,
    measure: Any = "loop",
) -> _Options:
    """The arguments checked, in this order; ``InvalidInputError`` for the first bad one."""
    check_callable(fn, "fn")
    check_int(n_calls, "n_calls", 1)
    check_int(warmup, "warmup", 0)
    min_time_s = check_positive(min_time_s, "min_time_s")
    max_noise = check_positive(max_noise, "max_noise")
    if name is not None and not isinstance(name, str):
        raise InvalidInputError(f"name must be a string or None, got {type(name).__name__}")
    if not isinstance(l2_flush, bool):
        raise InvalidInputError(f"l2_flush must be a bool, got {l2_flush!r}")
    if hide_launch_latency is not None and not isinstance(hide_launch_latency, bool):
        raise InvalidInputError(
            f"hide_launch_latency must be a bool or None, got {hide_launch_latency!r}"
        )
    gate_timeout_ms = None if gate_timeout_ms is None else check_gate_timeout(gate_timeout_ms)
    check_callable(synchronize, "synchronize", optional=True)
    in_step, group = _check_barrier(barrier)
    check_choice(measure, "measure", MEASURES)
    return _Options(
        name if name is not None else callable_name(fn),
        n_calls,
        warmup,
        min_time_s,
        max_noise,
        l2_flush,
        hide_launch_latency,
        gate_timeout_ms,
        synchronize,
        in_step,
        group,
        measure,
    )


def _check_barrier(barrier: Any) -> Tuple[bool, Any]:
    """``barrier`` as (whether to step the ranks, the group: None for the default)."""
    if barrier is None or barrier is False:
        return False, None
    if barrier is True:
        return True, check_group(None, "benchmark_function(barrier=True)")
    return True, check_group(barrier, "benchmark_function(barrier=...)")


# --------------------------------------------------------------------- set-up


@dataclass
class _Run:
    """One benchmark between its steps: what is timed, where and how."""

    fn: Callable[..., Any]
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    spec: DeviceSpec
    backend: TimerBackend
    plan: Optional[HostSync]  # GPU work timed on the host clock (JAX, an engine)
    warnings: List[str] = field(default_factory=list)
    flusher: Optional[L2Flusher] = None
    hide: bool = False  # gate the calls (a GPU backend with the gate kernel, asked for)
    timer: Optional[CUDATimer] = None  # set for GPU events; None: the host clock
    ranks: Optional[RankStep] = None  # barrier=: the ranks stepped before each call
    waits_inside: bool = False  # a gate timed out: the function waits for the GPU inside


def _prepare(
    fn: Callable[..., Any],
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    device: Any,
    opts: _Options,
) -> _Run:
    """The device, the backend, a host-sync plan, the L2 flusher and whether to gate."""
    spec = timing_device(device)
    backend = select_backend(spec)
    plan = host_sync_plan(device, spec, opts.synchronize)
    if plan is not None:
        spec = DeviceSpec("cuda", plan.index)
    run = _Run(fn, args, kwargs, spec, backend, plan)
    if opts.in_step:
        run.ranks = RankStep(opts.barrier_group)
    if opts.l2_flush:
        run.flusher = _l2_flusher(run)
    events = backend.is_gpu and plan is None
    if events and opts.hide_launch_latency is not False:
        run.hide = can_hide_launch_latency(backend)
        if not run.hide and opts.hide_launch_latency:
            raise GpuError(
                "hide_launch_latency=True needs gpukeeper's gate kernel, and this build has "
                "none (built without CUDA); pass hide_launch_latency=None or False"
            )
    return run


def _l2_flusher(run: _Run) -> Optional[L2Flusher]:
    """A flusher for GPU events; None (with a warning) where nothing can be flushed."""
    if run.plan is not None:
        run.warnings.append(
            f"l2_flush ignored: {run.plan.name} work runs where gpukeeper cannot flush before it"
        )
        return None
    if not run.backend.is_gpu:
        run.warnings.append("l2_flush ignored: only a GPU's L2 cache is flushed")
        return None
    flusher = L2Flusher(run.backend)
    if flusher.nbytes == 0:
        run.warnings.append("l2_flush: the L2 size could not be read; nothing flushed")
    return flusher


# --------------------------------------------------------------------- warm-up


def _gate_timeout_ms(host_ms: Optional[float]) -> float:
    if host_ms is None:
        return _GATE_TIMEOUT_MAX_MS
    return min(_GATE_TIMEOUT_MAX_MS, max(_GATE_TIMEOUT_MIN_MS, _GATE_TIMEOUT_FACTOR * host_ms))


def _gate_timed_out_warning(timeout_ms: float, when: str) -> str:
    return (
        f"launch latency included: {when} the gate timed out after {timeout_ms:.0f} ms "
        "because the function waited for the GPU while the stream was held (a synchronize, "
        ".item()/.cpu(), a copy from pageable memory, or more launches than the queue "
        "holds); its GPU times include the launch latency of its first kernel"
    )


def _make_timer(run: _Run, opts: _Options, slowest_ms: Optional[float], hide: bool) -> CUDATimer:
    """The timer of the GPU calls, on the backend's current stream; its gate times out
    after ``gate_timeout_ms``, else 20 x the slowest warm-up call (50 ms .. 2 s)."""
    return CUDATimer(
        opts.name if isinstance(opts.name, str) else "",
        backend=run.backend,
        stream=run.backend.current_stream(),
        hide_launch_latency=hide,
        gate_timeout_ms=opts.gate_timeout_ms or _gate_timeout_ms(slowest_ms),
    )


def _warm_up(run: _Run, opts: _Options) -> None:
    """``warmup`` calls (the last one is the gate probe when gating), the switch to JAX's
    plan when the last call returned JAX arrays, a synchronisation, and the timer."""
    slowest_ms: Optional[float] = None
    last: Any = None
    for i in range(opts.warmup):
        if run.hide and i == opts.warmup - 1:
            last = _probe(run, opts, slowest_ms)
            break
        h0 = time.perf_counter_ns()
        last = run.fn(*run.args, **run.kwargs)
        if run.plan is not None:
            run.plan.wait(last)
        elif opts.synchronize is not None:
            opts.synchronize()
        call_ms = (time.perf_counter_ns() - h0) / 1e6
        slowest_ms = call_ms if slowest_ms is None else max(slowest_ms, call_ms)
    waits_on = (
        frameworks.result_framework(last)
        if run.plan is None and opts.warmup > 0 and run.spec.is_cuda
        else None
    )
    if waits_on is not None:
        _switch_to_result_plan(run, waits_on, last)
    last = None
    run.backend.synchronize()
    if run.plan is not None and run.plan.synchronized is False:
        run.warnings.append(unsynchronized_warning(per_call=True))
    if run.timer is None and run.backend.is_gpu and run.plan is None:
        run.timer = _make_timer(run, opts, slowest_ms, run.hide)


def _probe(run: _Run, opts: _Options, slowest_ms: Optional[float]) -> Any:
    """The last warm-up call, behind a gate: a function that waits for the GPU inside is
    found here (its gate times out; the timer stops gating) rather than in every measured
    call. Returns what the call returned."""
    run.backend.synchronize()  # the process's launch floor, the prior, is taken on an idle device
    timer = run.timer = _make_timer(run, opts, slowest_ms, hide=True)
    sync = opts.synchronize
    call = run.fn if sync is None else _then(run.fn, sync)
    took = timer.time_call(call, run.args, run.kwargs)
    run.backend.synchronize()
    if took.launch_hidden is False:
        timer.hides_launch_latency = False
        run.waits_inside = True
        run.warnings.append(
            _gate_timed_out_warning(timer.gate_timeout_ms, "in the last warm-up call")
        )
    return took.result


def _then(fn: Callable[..., Any], sync: Callable[[], Any]) -> Callable[..., Any]:
    """``fn`` followed by ``sync()``, returning what ``fn`` returned."""

    def call(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        sync()
        return result

    return call


def _switch_to_result_plan(run: _Run, fw: FrameworkAdapter, last: Any) -> None:
    """Events on PyTorch's or CuPy's stream never see the streams of a framework that
    waits on its results (JAX's): that framework's plan instead."""
    index = fw.result_device(last)
    run.plan = result_plan(fw, index if index is not None else (run.spec.index or 0))
    run.spec = DeviceSpec("cuda", run.plan.index)
    run.hide = False
    run.timer = None
    if run.flusher is not None:
        run.flusher.release()
        run.flusher = None
        run.warnings.append(
            f"l2_flush ignored: {fw.name} work runs where gpukeeper cannot flush before it"
        )


# --------------------------------------------------------------------- measured calls


@dataclass
class _Samples:
    """The measured calls: GPU times (events), host times, why and when the loop stopped."""

    gpu: List[float] = field(default_factory=list)
    host: List[float] = field(default_factory=list)
    stop_reason: str = "n_calls"
    total_s: float = 0.0
    loop: Optional[LoopBatches] = None  # GPU work: the calls again, back to back


def _measure_loop(run: _Run, opts: _Options, samples: _Samples) -> None:
    """GPU work: the loop time (``loop_time``), the calls run back to back in batches that end
    at a wait for all their work. CPU work has none to take: each call's host time is
    already what a loop of calls sees."""
    if run.timer is None and run.plan is None:
        return
    settle: Callable[[Any], None]
    if run.plan is not None:
        settle = run.plan.wait
    else:
        sync = run.backend.synchronize

        def settle(last: Any) -> None:
            sync()

    estimate = stats.median(samples.host) if samples.host else 0.0
    samples.loop = run_batches(
        run.fn,
        run.args,
        run.kwargs,
        settle,
        estimate,
        opts.n_calls,
        opts.min_time_s,
        opts.max_noise,
        run.warnings,
        run.ranks,
        LOOP_BATCH_MS,
        MIN_LOOP_BATCHES,
        MAX_LOOP_CALLS,
    )


def _measure(run: _Run, opts: _Options) -> _Samples:
    """The measured calls until the stopping rule says so. A GPU call whose gate timed
    out is measured again, ungated (its step returns None)."""
    samples = _Samples()
    if run.timer is not None:
        step = _gpu_step(run, samples)
    elif run.plan is not None:
        step = _host_sync_step(run, samples)
    else:
        step = _cpu_step(run, opts, samples)
    stop = StopRule(opts.n_calls, opts.min_time_s, opts.max_noise, run.warnings)
    add = stop.add
    if run.ranks is not None:
        reason = _measure_in_step(step, stop, run.ranks)
    elif progress_wanted(None):
        reason = _measure_with_progress(step, stop, opts.n_calls)
    else:
        # No bar (off a terminal, in CI): a run that will take long says so once, early,
        # so that a billion calls are not a silent hour. The check costs a bit test a call.
        count, told, started = 0, False, time.perf_counter()
        while True:
            t = step()
            if t is None:
                continue
            stopped = add(t)
            if stopped is not None:
                reason = stopped
                break
            count += 1
            if not told and count & (count - 1) == 0 and count >= 16:
                told = _say_how_long(opts, count, time.perf_counter() - started)
    samples.stop_reason = reason
    samples.total_s = stop.wall_s()
    return samples


def _in_step_text(ranks: Optional[RankStep]) -> str:
    return "" if ranks is None else f"; the {ranks.world_size} ranks put in step before each call"


def _measure_in_step(step: Callable[[], Optional[float]], stop: StopRule, ranks: RankStep) -> str:
    """The measured loop of ``barrier=``: the ranks step together before each call and
    leave together, once every rank's own stopping rule is met (its first reason is the
    one reported; a rank done before the others measures on until they are)."""
    reason: Optional[str] = None
    ranks_step = ranks.step
    add = stop.add
    while not ranks_step(reason is not None):
        t = step()
        if t is not None and reason is None:
            reason = add(t)  # once met, the rule is asked no more: its warnings stay single
    return reason if reason is not None else "n_calls"


#: A benchmark shows a progress bar (on a terminal) once it has measured for this long.
PROGRESS_AFTER_S = 2.0
#: Without a bar, a benchmark projected to measure longer than this says so once.
SAY_LONG_RUN_S = 60.0


def _say_how_long(opts: _Options, count: int, elapsed: float) -> bool:
    """Once ``count`` calls took ``elapsed`` s: when the rest of ``n_calls`` will take over
    :data:`SAY_LONG_RUN_S`, one line on stderr saying how long. True once the question is
    settled (said, or the run measured past :data:`PROGRESS_AFTER_S` without needing it)."""
    if count >= opts.n_calls or elapsed <= 0:
        return True
    per_call = elapsed / count
    rest = per_call * (opts.n_calls - count)
    if rest > SAY_LONG_RUN_S:
        sys.stderr.write(
            f"gpukeeper: benchmark {opts.name!r}: {opts.n_calls:,} calls at about "
            f"{per_call * 1e6:.3g} us each will take about {_duration_text(rest)} more "
            "(fewer n_calls, or min_time_s, shortens it)\n"
        )
        sys.stderr.flush()
        return True
    return elapsed > PROGRESS_AFTER_S


def _duration_text(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _measure_with_progress(
    step: Callable[[], Optional[float]], stop: StopRule, n_calls: int
) -> str:
    """The measured loop with a bar that appears once the run has taken PROGRESS_AFTER_S
    (short runs show none), redrawn between calls, never inside one. The bar counts
    ``n_calls``; ``min_time_s`` may measure past them (the bar then stays full)."""
    bar: Optional[ProgressBar] = None
    started = time.perf_counter()
    drawn = started
    count = 0
    finished = False
    try:
        while True:
            t = step()
            if t is None:
                continue
            reason = stop.add(t)
            if reason is not None:
                finished = True
                return reason
            count += 1
            if count % 16:
                continue
            now = time.perf_counter()
            if bar is None:
                if now - started > PROGRESS_AFTER_S:
                    bar = ProgressBar(n_calls, "benchmark", "calls")
            elif count % bar.every == 0 or now - drawn > REDRAW_S:
                # Every 1% of the calls or every quarter second, whichever comes first: a
                # run of slow calls does not sit at 0% for seconds.
                bar.update(min(count, n_calls))
                drawn = now
    finally:
        if bar is not None:
            # Interrupted (Ctrl-C, an error in the call): the bar stops where the run did.
            bar.close(None if finished else min(count, n_calls))


# The steps below bind what they use once: per call, the loop pays for the call and the
# clock readings, not for attribute lookups.


def _gpu_step(run: _Run, samples: _Samples) -> Callable[[], Optional[float]]:
    """One call between events (``CUDATimer.time_call``): its GPU time, or None when its
    gate timed out: that time holds the host's wait, so the timer stops gating."""
    timer = run.timer
    assert timer is not None
    fn, args, kwargs = run.fn, run.args, run.kwargs
    flush = run.flusher.flush if run.flusher is not None else None
    time_call, gpu, host = timer.time_call, samples.gpu.append, samples.host.append

    def step() -> Optional[float]:
        took = time_call(fn, args, kwargs, flush)
        if took.launch_hidden is False:
            timer.hides_launch_latency = False
            run.waits_inside = True
            run.warnings.append(
                _gate_timed_out_warning(timer.gate_timeout_ms, "in a measured call")
            )
            return None
        gpu(took.elapsed_ms)
        host(took.host_ms)
        return took.elapsed_ms

    return step


def _host_sync_step(run: _Run, samples: _Samples) -> Callable[[], float]:
    """One call of GPU work without events: host clock up to the plan's wait."""
    assert run.plan is not None
    fn, args, kwargs, wait = run.fn, run.args, run.kwargs, run.plan.wait
    clock, host = time.perf_counter_ns, samples.host.append

    def step() -> float:
        h0 = clock()
        result = fn(*args, **kwargs)
        wait(result)
        h1 = clock()
        result = None
        t = (h1 - h0) / 1e6
        host(t)
        return t

    return step


def _cpu_step(run: _Run, opts: _Options, samples: _Samples) -> Callable[[], float]:
    """One call of CPU work (or of work the caller's ``synchronize`` waits for)."""
    fn, args, kwargs, synchronize = run.fn, run.args, run.kwargs, opts.synchronize
    clock, host = time.perf_counter_ns, samples.host.append

    def step() -> float:
        h0 = clock()
        fn(*args, **kwargs)
        if synchronize is not None:
            synchronize()
        t = (clock() - h0) / 1e6
        host(t)
        return t

    return step


# --------------------------------------------------------------------- around the loop


class _Watch:
    """What is read around the measured calls: compiled frames, clocks (throttling) and
    memory. Made right before the loop; ``stop()`` right after it."""

    def __init__(self, run: _Run) -> None:
        self.frames_before = frameworks.compiled_frames()
        self.clocks: Optional[ClockWatch] = None
        if run.backend.is_gpu or run.plan is not None:
            self.clocks = ClockWatch(run.spec.index or 0, run.warnings)
            self.clocks.start()
        plan = run.plan if run.plan is not None else timer_plan(run.backend)
        self.memory = MemorySampler(plan.kind, plan.index, plan.synchronize)
        self.memory.start()
        if self.memory.why:
            run.warnings.append(self.memory.why)
        self.recompiles = 0

    def stop(self, run: _Run) -> None:
        run.backend.synchronize()
        self.memory.stop()
        outside = self.memory.outside
        if outside is not None and outside > OUTSIDE_NOTE:
            run.warnings.append(
                f"the memory outside every framework grew {outside / (1 << 20):+.1f} MiB over the "
                "calls (NVML's figure for this process less the frameworks' reserved bytes): an "
                "engine or an extension in this process allocates it and does not give it back"
            )
        if run.flusher is not None:
            run.flusher.release()
        if self.clocks is not None:
            self.clocks.stop()
        frames_after = frameworks.compiled_frames()
        if frames_after is not None:
            self.recompiles = frames_after - (self.frames_before or 0)
            if self.recompiles > 0:
                run.warnings.append(
                    "recompiles seen: torch.compile compiled "
                    f"{self.recompiles} frame(s) while measuring; "
                    "the times include compilation (warm up with every input shape)"
                )


# --------------------------------------------------------------------- the result


def _timing_method(
    plan: Optional[HostSync], on_gpu: bool, backend: str, hidden: bool, loop: Optional[LoopBatches]
) -> str:
    if plan is not None:
        how = plan.how
    elif on_gpu:
        how = (
            f"CUDA events ({backend}) on the current stream around each call"
            + (", launch latency hidden behind a gate" if hidden else "")
            + "; each call waited for"
        )
    else:
        return "host clock around each call (CPU work)"
    if loop is not None:
        how += (
            f"; loop time: batches of {loop.calls} back-to-back call(s), each batch timed "
            "from a synchronized start to the end of its work"
        )
    return how


def _headline(
    opts: _Options, on_gpu: bool, samples: _Samples, warnings: List[str]
) -> Tuple[str, List[float]]:
    """(the measure the headline is of, its samples)."""
    loop = samples.loop
    if opts.measure == "device":
        if on_gpu:
            return "device", samples.gpu
        if loop is not None:  # GPU work on the host clock: no device time to give
            warnings.append(
                "measure='device': this work has no device time (it runs where gpukeeper "
                "puts no events); the headline is each call's host time up to its wait"
            )
        return "device", samples.host
    if loop is not None and loop.per_call:
        return "loop", loop.per_call
    return "loop", samples.host


def _result(run: _Run, opts: _Options, samples: _Samples, watch: _Watch) -> BenchmarkResult:
    """The ``BenchmarkResult``, flagged noisy above ``max_noise`` (else 10 %)."""
    timer, plan, memory, loop = run.timer, run.plan, watch.memory, samples.loop
    on_gpu = timer is not None
    hidden = timer is not None and timer.hides_launch_latency
    work = "gpu" if (on_gpu or plan is not None) else "cpu"
    measure, headline = _headline(opts, on_gpu, samples, run.warnings)
    loop_times = loop.per_call if loop is not None else (samples.host if work == "cpu" else None)
    device_times = samples.gpu if on_gpu else (samples.host if work == "cpu" else None)
    bound, busy = bound_verdict(
        stats.median(loop_times) if loop_times else None,
        stats.median(device_times) if device_times else None,
        stats.median(loop.issue) if loop is not None and loop.issue else None,
        run.waits_inside,
        work == "gpu",
        DEVICE_BOUND_SHARE,
    )
    result = BenchmarkResult(
        name=opts.name,
        times_ms=headline,
        host_times_ms=samples.host,
        gpu_times_ms=samples.gpu if on_gpu else None,
        timing="gpu" if on_gpu else "host",
        device=str(run.spec),
        backend=plan.name if plan is not None else run.backend.name,
        warmup=opts.warmup,
        l2_flush=run.flusher is not None and run.flusher.nbytes > 0,
        launch_latency=("hidden" if hidden else "included") if on_gpu else "n/a",
        gpu_floor_ms=timer.floor_ms if timer is not None and hidden else None,
        stop_reason=samples.stop_reason,
        total_time_s=samples.total_s + (loop.total_s if loop is not None else 0.0),
        memory_before_bytes=memory.before,
        memory_after_bytes=memory.after,
        memory_peak_bytes=memory.peak,
        memory_source=memory.source,
        memory_outside_bytes=memory.outside,
        throttled=watch.clocks.throttled if watch.clocks is not None else None,
        recompiles=watch.recompiles,
        warnings=run.warnings,
        clocks=watch.clocks.clocks if watch.clocks is not None else {},
        work=work,
        timing_method=(
            _timing_method(plan, on_gpu, run.backend.name, hidden, loop) + _in_step_text(run.ranks)
        ),
        synchronized=plan.synchronized if plan is not None else True,
        measure=measure,
        loop_times_ms=list(loop_times) if loop_times is not None else None,
        loop_calls=loop.calls if loop is not None else 1,
        loop_issue_ms=list(loop.issue) if loop is not None else None,
        bound=bound,
        device_busy=busy,
    )
    limit = opts.max_noise if opts.max_noise is not None else NOISY_THRESHOLD
    noise = result.relative_noise
    if not math.isnan(noise) and noise > limit:
        result.noisy = True
        result.warnings.append(
            f"noisy: relative std {noise * 100:.1f} % > {limit * 100:.1f} % "
            f"(IQR/median {result.relative_iqr * 100:.1f} %)"
        )
    return result

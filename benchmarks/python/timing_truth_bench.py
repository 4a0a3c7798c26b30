#!/usr/bin/env python3
"""Timing truth: gpukeeper, triton's do_bench and torch.utils.benchmark side by side, each
against truths that gpukeeper takes no part in.

What is timed (each a "case"; ``--cases`` picks some):

  cpu              torch.mm of two 128x128 matrices on the CPU (runs everywhere)
  spin_10us        one calibration kernel spinning 10 us by the GPU's %globaltimer
  spin_100us       the same, 100 us
  spin_1ms         the same, 1 ms
  matmul_region    three 4096x4096 bf16 matmuls with elementwise ops between (device-bound)
  launch_bound     24 elementwise kernels on a 1024-element tensor (launch-bound)
  cuda_graph       the launch-bound region captured in a torch.cuda.CUDAGraph, g.replay
  eager_vs_graph   compare_implementations(eager, cuda graph): the speedup
  torch_compile    a small MLP through torch.compile (default mode), inference
  cupy             a CuPy matmul + elementwise (when CuPy imports)
  jax              a jitted JAX matmul + elementwise (when JAX has a GPU)
  md_schnet        benchmark_md_trajectory on torch-geometric's SchNet (energy and forces)
  md_openmm        benchmark_md_trajectory on an OpenMM Lennard-Jones fluid, step(1) a call

The truths:

  loop truth       N back-to-back calls timed by one synchronized wall clock, / N; N so
                   that one repetition lasts >= 20 ms and holds >= 50 calls
  span truth       one event pair (torch.cuda.Event, cupy.cuda.Event) around the same N
                   calls, / N (n/a for JAX, whose streams are its own, and the CPU)
  %globaltimer     for the calibration kernels: the kernel's own first and last reading of
                   the GPU's nanosecond clock (gpukeeper's spin_kernel writes both), the
                   median over the calls of the gpukeeper run it is compared with
  wall ns/day      (MD) the same steps in a plain loop, wall clock synchronized at the end;
                   for OpenMM also its own measure, simulated time (State.getTime()) over
                   wall time, as its StateDataReporter computes speed

Pairing. The host and the device change speed while the program runs: a launch-bound
Python loop on an H100 host was seen alternating between ~0.32 and ~0.45 ms a call in
phases of about a second, and a power-capped GPU spread one matmul region's truth
repetitions over 32 %. A method timed in one phase and a truth timed in another differ
by the phase, not by the method. So every method run is paired with the truth taken
right next to it: per case, ``--pairs`` alternations (default 5, --quick 2) of

    truth, gpukeeper, truth, do_bench, truth, torch.utils.benchmark, truth,
           torch.utils.benchmark, truth, do_bench, truth, gpukeeper, truth, ...

(one slot of ``--reps`` loop-truth repetitions, default 1, between every two method
runs; the methods' order reversed every other alternation, ABBA). A method run's
*paired error* is its value / the mean of the two truth slots around it - 1: truths of
equal length on both sides cancel a drift that is linear over the pair, and the ABBA
order puts every method as often early as late in an alternation. Each method's figure
is the median of its paired errors over the alternations, with their spread (max - min)
beside it; the targets are judged on that median. Each run is short (gpukeeper's
n_calls 100, ~0.1-0.3 s) so that a pair fits in one phase when it can; a pair that
straddles a phase boundary is one outlier among the alternations, which the median
ignores. The unpaired figures (the median of a method's runs against the median of all
the truth repetitions) stay in the JSON and the methods table. The eager-vs-graph
speedup is paired the same way (eager and graph truth repetitions in each slot). The MD
runs alternate in ABBA order too (wall, gpukeeper / gpukeeper, wall; with OpenMM's own
speed: wall, gpukeeper, openmm / openmm, gpukeeper, wall), ``--md-pairs`` rounds
(default 8, --quick 4) of runs sized to ~0.4 s each (--quick ~0.2 s) from a timed probe
of the plain loop; the ratio of each round is reported with their median and
interquartile range.

Throttling: each gpukeeper run reads NVML's clocks and clock-event reasons before and
after its calls (its result's ``throttled``, ``clocks`` and a "throttled: ..." warning);
the case row keeps them per run and its notes say in how many runs the device was
throttled and why (e.g. "sw power cap"), so that a reader knows the device changed
speed during the case. For the MD cases, whose gpukeeper result carries no clocks, this
program samples NVML itself before the first run and after each round.

The methods, per case: gpukeeper's headline (``benchmark_function(...).median_ms``: the
time per call of calls run back to back), gpukeeper's device time (``device_median_ms``:
the call's GPU work with the launch hidden), ``triton.testing.do_bench(fn,
return_mode="median")`` and ``torch.utils.benchmark.Timer(...).blocked_autorange().median``;
each as a value in ms (the median of its runs) and its error against the loop and span
truths (in % ; in us against %globaltimer). gpukeeper's ``bound`` and ``device_busy``
are printed per case.

Targets (printed as met/missed with the margin; a miss does not change the exit status),
on the paired median errors:

  - gpukeeper's headline within 2 % of the loop truth for every callable, within 1 % where
    gpukeeper finds the call device-bound (``bound == "device"``);
  - the calibration kernels' device time within 0.1 us of %globaltimer (each gpukeeper
    run against the kernels' own clock in that run; the median over the runs);
  - the eager-vs-graph speedup within 5 % of the loop truths' speedup;
  - MD: gpukeeper's ns/day within 2 % of the wall clock's (median of the rounds' ratios).

Without CUDA the GPU cases are skipped (said so, exit status 0); the cpu case still runs.
Exit status 1 only when the program itself fails, never for a case's error (it goes
into that case's row) or a missed target.

    python timing_truth_bench.py [--quick] [--json PATH] [--cases a,b,...] [--pairs K]
                                 [--md-pairs K] [--reps R]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib.metadata
import inspect
import json
import math
import os
import statistics
import sys
import time
import timeit
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import environment, try_import  # noqa: E402

SCHEMA = "gpukeeper-timing-truth/1"

HEADLINE_LIMIT_PCT = 2.0
HEADLINE_DEVICE_BOUND_LIMIT_PCT = 1.0
KERNEL_LIMIT_US = 0.1
SPEEDUP_LIMIT_PCT = 5.0
MD_LIMIT_PCT = 2.0

MIN_REP_S = 0.020  # one repetition of a loop truth lasts at least this long ...
MIN_REP_CALLS = 50  # ... and holds at least this many calls
MAX_REP_CALLS = 1_000_000

MD_MIN_STEPS = 20  # an MD run has at least this many steps, however slow a step is


class Skip(Exception):
    """A case that cannot run here (a missing package or device); the message says why."""


@dataclass(frozen=True)
class Settings:
    quick: bool
    reps: int  # loop-truth repetitions in each slot between two method runs
    pairs: int  # alternations of truth slots and method runs per timing case
    gk_calls: int  # benchmark_function's n_calls
    gk_warmup: int
    timer_min_run_s: float  # torch.utils.benchmark's min_run_time
    md_pairs: int  # MD rounds (ABBA order)
    md_run_s: float  # one MD run lasts about this long (steps sized from a probe)
    schnet_steps: int  # at most this many steps in one SchNet run
    openmm_steps: int  # at most this many steps in one OpenMM run

    @staticmethod
    def make(quick: bool, reps: Optional[int] = None, pairs: Optional[int] = None,
             md_pairs: Optional[int] = None) -> "Settings":
        if quick:
            s = Settings(True, 1, 2, 20, 5, 0.05, 4, 0.2, 100, 4000)
        else:
            s = Settings(False, 1, 5, 100, 10, 0.2, 8, 0.4, 1000, 20000)
        return dataclasses.replace(
            s,
            reps=s.reps if reps is None else max(1, reps),
            pairs=s.pairs if pairs is None else max(1, pairs),
            md_pairs=s.md_pairs if md_pairs is None else max(1, md_pairs),
        )


# --------------------------------------------------------------------- what is timed


class TorchSpan:
    """An event pair on PyTorch's current stream."""

    def __init__(self, torch: Any) -> None:
        self.s = torch.cuda.Event(enable_timing=True)
        self.e = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self.s.record()

    def stop(self) -> None:
        self.e.record()

    def elapsed_ms(self) -> float:
        self.e.synchronize()
        return float(self.s.elapsed_time(self.e))


class CupySpan:
    """An event pair on CuPy's current stream."""

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy
        self.s = cupy.cuda.Event()
        self.e = cupy.cuda.Event()

    def start(self) -> None:
        self.s.record()

    def stop(self) -> None:
        self.e.record()

    def elapsed_ms(self) -> float:
        self.e.synchronize()
        return float(self.cupy.cuda.get_elapsed_time(self.s, self.e))


@dataclass
class Workload:
    """One callable and how to wait for its work.

    ``sync(last)`` returns once all work queued so far is done; ``last`` is the most
    recent call's result (JAX can only be waited for through its results)."""

    name: str
    fn: Callable[[], Any]
    framework: str  # "torch", "cupy", "jax" or "cpu"
    description: str
    sync: Callable[[Any], None]
    make_span: Optional[Callable[[], Any]] = None
    kernel_truth: Any = None  # a Truth ring for the calibration kernels
    notes: List[str] = field(default_factory=list)
    keep: List[Any] = field(default_factory=list)  # objects the callable needs alive
    restore: Optional[Callable[[], None]] = None  # undoes what the builder changed


class LoopTruth:
    """The loop truth (and the span truth beside it) of one workload, repetition by
    repetition: sync; clock; [start event]; N calls; [stop event]; sync; clock."""

    def __init__(self, w: Workload) -> None:
        self.w = w
        self.n = 0
        self.loop_ms: List[float] = []
        self.span_ms: List[float] = []
        self.last: Any = None
        self.span = w.make_span() if w.make_span is not None else None
        # One value per slot (the mean of its repetitions): slot i is the truth taken
        # right before the i-th method run of the case, slot i + 1 right after it.
        self.slot_loop_ms: List[float] = []
        self.slot_span_ms: List[Optional[float]] = []
        self.reps_per_slot = 0

    def _wall_s(self, k: int) -> float:
        fn, sync = self.w.fn, self.w.sync
        sync(self.last)
        last = None
        t0 = time.perf_counter()
        for _ in range(k):
            last = fn()
        sync(last)
        t1 = time.perf_counter()
        self.last = last
        return t1 - t0

    def calibrate(self, min_rep_s: float = MIN_REP_S) -> int:
        """N: calls for one repetition to last ``min_rep_s`` (and >= MIN_REP_CALLS)."""
        k = 1
        while True:
            dt = self._wall_s(k)
            # A quarter of a repetition is enough for the estimate; growing by the
            # estimate itself (at most 8x) keeps slow calls from overshooting.
            if dt >= min_rep_s / 4 or k >= MAX_REP_CALLS:
                break
            grow = 8 if dt <= 0 else min(8.0, max(2.0, 1.2 * (min_rep_s / 4) / dt))
            k = math.ceil(k * grow)
        # The faster of two: one pass slowed by a neighbour on the machine would size the
        # repetitions too short.
        per_call = min(dt, self._wall_s(k)) / k
        self.n = int(min(MAX_REP_CALLS, max(MIN_REP_CALLS, math.ceil(min_rep_s / max(per_call, 1e-9)))))
        return self.n

    def run(self, reps: int) -> None:
        fn, sync, span = self.w.fn, self.w.sync, self.span
        n = self.n or self.calibrate()
        for _ in range(reps):
            sync(self.last)
            last = None
            t0 = time.perf_counter()
            if span is not None:
                span.start()
            for _ in range(n):
                last = fn()
            if span is not None:
                span.stop()
            sync(last)
            t1 = time.perf_counter()
            self.last = last
            self.loop_ms.append((t1 - t0) * 1e3 / n)
            if span is not None:
                self.span_ms.append(span.elapsed_ms() / n)

    def slot(self, reps: int) -> None:
        """One truth slot between two method runs: ``reps`` repetitions, kept as their mean."""
        i, j = len(self.loop_ms), len(self.span_ms)
        self.run(reps)
        self.reps_per_slot = reps
        self.slot_loop_ms.append(_mean(self.loop_ms[i:]))
        self.slot_span_ms.append(_mean(self.span_ms[j:]) if len(self.span_ms) > j else None)

    def around(self, slot: int) -> Tuple[Optional[float], Optional[float]]:
        """(loop, span) truth of the method run between slots ``slot`` and ``slot + 1``:
        the mean of the two (None where either is missing)."""
        loop = self.slot_loop_ms[slot:slot + 2]
        span = self.slot_span_ms[slot:slot + 2]
        return (_mean(loop) if len(loop) == 2 else None, _mean(span) if len(span) == 2 else None)

    def summary(self) -> Dict[str, Any]:
        loop = statistics.median(self.loop_ms) if self.loop_ms else None
        return {
            "loop_ms": loop,
            "loop_reps_ms": list(self.loop_ms),
            "loop_spread_pct": _spread_pct(self.loop_ms),
            "calls_per_rep": self.n,
            "reps": len(self.loop_ms),
            "span_ms": statistics.median(self.span_ms) if self.span_ms else None,
            "span_reps_ms": list(self.span_ms),
            "slots": len(self.slot_loop_ms),
            "reps_per_slot": self.reps_per_slot,
            "slot_loop_ms": list(self.slot_loop_ms),
            "slot_span_ms": list(self.slot_span_ms),
        }


def _mean(values: List[Optional[float]]) -> Optional[float]:
    """The mean, or None when any value is missing (a pair needs both of its sides)."""
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None
    return sum(values) / len(values)  # type: ignore[arg-type]


def _quartiles(values: List[float]) -> Tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def _paired_stats(errors: List[Optional[float]]) -> Dict[str, Any]:
    """Median, spread (max - min) and interquartile range of paired errors (None ignored)."""
    vals = [e for e in errors if e is not None and math.isfinite(e)]
    if not vals:
        return {"median": None, "spread": None, "iqr": None, "n": 0}
    q1, q3 = _quartiles(vals)
    return {"median": statistics.median(vals), "spread": max(vals) - min(vals), "iqr": q3 - q1, "n": len(vals)}


def _spread_pct(values: List[float]) -> Optional[float]:
    """(max - min) / median of the repetitions, in %."""
    if len(values) < 2:
        return None
    med = statistics.median(values)
    return (max(values) - min(values)) / med * 100 if med > 0 else None


def _pct(value: Optional[float], ref: Optional[float]) -> Optional[float]:
    if value is None or ref is None or ref <= 0 or not math.isfinite(value):
        return None
    return (value / ref - 1.0) * 100.0


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()[:500]


# --------------------------------------------------------------------- the run's context


class Context:
    """The modules found, what this gpukeeper's API offers, and the settings."""

    def __init__(self, settings: Settings) -> None:
        import gpukeeper

        self.s = settings
        self.gk = gpukeeper
        self.torch, self.torch_why = try_import("torch")
        self.cuda = bool(self.torch is not None and self.torch.cuda.is_available())
        self.cuda_why = None if self.cuda else (
            f"torch not importable ({self.torch_why})" if self.torch is None else "torch sees no CUDA device")
        params = inspect.signature(gpukeeper.benchmark_function).parameters
        # Passed only where it exists: benchmark_function hands unknown keywords on to
        # the timed function, which would then fail.
        self.has_measure = "measure" in params
        self._triton: Any = None
        self.triton_why: Optional[str] = None
        self._triton_tried = False
        self.cupy: Any = None
        self.jax: Any = None

    @property
    def triton_testing(self) -> Any:
        if not self._triton_tried:
            self._triton_tried = True
            try:
                import triton.testing as tt

                self._triton = tt
            except Exception as exc:  # optional peer: its rows say why
                self.triton_why = _err(exc)
        return self._triton

    def gk_kwargs(self, w: Optional[Workload] = None) -> Dict[str, Any]:
        kw: Dict[str, Any] = {"n_calls": self.s.gk_calls, "warmup": self.s.gk_warmup}
        if self.has_measure:
            kw["measure"] = "loop"
        if w is not None and w.framework == "cpu":
            kw["device"] = "cpu"
        return kw

    def api(self) -> Dict[str, Any]:
        return {"measure_parameter": self.has_measure,
                "note": None if self.has_measure else (
                    "this gpukeeper's benchmark_function has no measure=: its headline is the "
                    "per-call device time, and loop fields are missing")}


def _torch_sync(torch: Any) -> Callable[[Any], None]:
    return lambda _last=None: torch.cuda.synchronize()


# --------------------------------------------------------------------- the cases' workloads


def build_cpu(ctx: Context) -> Workload:
    torch = ctx.torch
    if torch is None:
        return Workload("cpu", lambda: sum(range(2000)), "cpu", "sum(range(2000)) in Python (no torch)",
                        lambda _l=None: None)
    torch.manual_seed(0)
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    # One intra-op thread: with several, a call waits for its slowest thread, and one
    # thread descheduled by a neighbour on a busy machine makes that call 50x slower,
    # which no median of short calls survives.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return Workload("cpu", lambda: torch.mm(a, b), "cpu",
                    "torch.mm of two 128x128 float32 matrices on the CPU (1 thread)",
                    lambda _l=None: None, restore=lambda: torch.set_num_threads(threads))


def _need_cuda(ctx: Context) -> Any:
    if not ctx.cuda:
        raise Skip(f"no CUDA ({ctx.cuda_why})")
    return ctx.torch


def build_spin(ctx: Context, ns: int) -> Workload:
    torch = _need_cuda(ctx)
    from gpukeeper import _core

    if not _core.calibration_kernels_available():
        raise Skip("this gpukeeper was built without nvcc: no calibration kernels")
    from timing_accuracy_bench import Truth

    truth = Truth(torch)
    stream = torch.cuda.current_stream()
    spin = _core.spin_kernel
    label = f"{ns // 1000} us" if ns < 1_000_000 else f"{ns // 1_000_000} ms"
    return Workload(f"spin_{label.replace(' ', '')}", lambda: spin(ns, stream, truth.slot()), "torch",
                    f"gpukeeper's calibration kernel spinning {label} by %globaltimer",
                    _torch_sync(torch), lambda: TorchSpan(torch), kernel_truth=truth)


def build_matmul(ctx: Context) -> Workload:
    torch = _need_cuda(ctx)
    torch.manual_seed(0)
    n = 4096
    a, b, c = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def region() -> Any:
        x = torch.relu(a @ b)
        x = (x @ c) * 0.5 + 1.0
        return x @ a

    return Workload("matmul_region", region, "torch",
                    f"3 bf16 matmuls {n}x{n} with relu, mul, add between (6 kernels, device-bound)",
                    _torch_sync(torch), lambda: TorchSpan(torch), keep=[a, b, c])


SMALL_OPS = 24


def _small_region(torch: Any) -> Tuple[Callable[[], Any], Any]:
    x = torch.randn(1024, device="cuda")

    def region() -> Any:
        y = x
        for _ in range(SMALL_OPS // 4):
            y = torch.relu(torch.sin(y * 1.0001 + 0.001))
        return y

    return region, x


def _capture(torch: Any, region: Callable[[], Any]) -> Tuple[Any, Any]:
    # Warmed up on a side stream first, as PyTorch asks before a capture (lazy
    # initialisation and allocations must not happen inside it).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            region()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = region()
    torch.cuda.synchronize()
    return graph, out


def build_launch_bound(ctx: Context) -> Workload:
    torch = _need_cuda(ctx)
    region, x = _small_region(torch)
    return Workload("launch_bound", region, "torch",
                    f"{SMALL_OPS} elementwise kernels (mul, add, sin, relu) on 1024 floats",
                    _torch_sync(torch), lambda: TorchSpan(torch), keep=[x])


def build_cuda_graph(ctx: Context) -> Workload:
    torch = _need_cuda(ctx)
    region, x = _small_region(torch)
    graph, out = _capture(torch, region)
    return Workload("cuda_graph", graph.replay, "torch",
                    f"the launch-bound region ({SMALL_OPS} kernels) as a CUDA graph: g.replay()",
                    _torch_sync(torch), lambda: TorchSpan(torch), keep=[graph, out, x])


def build_torch_compile(ctx: Context) -> Workload:
    torch = _need_cuda(ctx)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024), torch.nn.GELU(),
        torch.nn.Linear(1024, 512),
    ).cuda()
    for p in mlp.parameters():
        p.requires_grad_(False)  # inference: no autograd graph, one compiled frame
    x = torch.randn(256, 512, device="cuda")
    compiled = torch.compile(mlp)
    t0 = time.perf_counter()
    for _ in range(3):  # the first call compiles; the next ones must not recompile
        compiled(x)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    return Workload("torch_compile", lambda: compiled(x), "torch",
                    "MLP 512-1024-1024-512 (GELU), batch 256, torch.compile default mode",
                    _torch_sync(torch), lambda: TorchSpan(torch),
                    notes=[f"compiled in {compile_s:.1f} s"], keep=[mlp, x])


def build_cupy(ctx: Context) -> Workload:
    _need_cuda(ctx)
    cp, why = try_import("cupy")
    if cp is None:
        raise Skip(f"CuPy not importable ({why})")
    ctx.cupy = cp
    cp.random.seed(0)
    n = 2048
    a = cp.random.rand(n, n, dtype=cp.float32)
    b = cp.random.rand(n, n, dtype=cp.float32)

    def fn() -> Any:
        return cp.tanh(a @ b) * 2.0 + 1.0

    device = cp.cuda.Device()
    return Workload("cupy", fn, "cupy", f"CuPy: float32 matmul {n}x{n}, tanh, mul, add",
                    lambda _l=None: device.synchronize(), lambda: CupySpan(cp), keep=[a, b])


def build_jax(ctx: Context) -> Workload:
    _need_cuda(ctx)
    jax, why = try_import("jax")
    if jax is None:
        raise Skip(f"JAX not importable ({why})")
    try:
        gpus = jax.devices("gpu")
    except Exception as exc:
        raise Skip(f"JAX has no GPU backend ({_err(exc)})") from None
    if not gpus:
        raise Skip("JAX has no GPU backend")
    ctx.jax = jax
    import jax.numpy as jnp

    n = 2048
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    x = jax.device_put(jax.random.normal(k1, (n, n), dtype=jnp.float32), gpus[0])
    w = jax.device_put(jax.random.normal(k2, (n, n), dtype=jnp.float32), gpus[0])
    f = jax.jit(lambda x, w: jnp.tanh(x @ w) * 2.0 + 1.0)
    jax.block_until_ready(f(x, w))  # compiled before any clock runs

    def sync(last: Any = None) -> None:
        # All of one device's work runs on its compute stream in order: the last
        # result ready means every earlier call is done.
        if last is not None:
            jax.block_until_ready(last)

    return Workload("jax", lambda: f(x, w), "jax", f"jax.jit: float32 matmul {n}x{n}, tanh, mul, add",
                    sync, None, notes=[f"JAX {jax.__version__} on {gpus[0]}"], keep=[x, w])


# --------------------------------------------------------------------- the methods


def _method(name: str, value: Optional[float] = None, note: str = "", error: Optional[str] = None) -> Dict[str, Any]:
    return {"method": name, "value_ms": value, "note": note, "error": error}


def gk_fields(ctx: Context, res: Any) -> Dict[str, Any]:
    """What this gpukeeper's result says, with the new fields read where they exist."""
    device = getattr(res, "device_median_ms", None)
    device_source = "device_median_ms" if device is not None else None
    if device is None and not ctx.has_measure:
        gpu = getattr(res, "gpu_times_ms", None)
        if gpu and getattr(res, "launch_latency", None) == "hidden":
            device = statistics.median(gpu)
            device_source = "median of gpu_times_ms (no device_median_ms in this gpukeeper)"
    busy = getattr(res, "device_busy", None)
    return {
        "headline_ms": res.median_ms,
        "loop_median_ms": getattr(res, "loop_median_ms", None),
        "device_median_ms": device,
        "device_source": device_source,
        "bound": getattr(res, "bound", None),
        "device_busy": None if busy is None else float(busy),
        "loop_calls": getattr(res, "loop_calls", None),
        "n_calls": getattr(res, "n_calls", None),
        "launch_latency": getattr(res, "launch_latency", None),
        "timing_method": getattr(res, "timing_method", None),
        "backend": getattr(res, "backend", None),
        "work": getattr(res, "work", None),
        "noisy": getattr(res, "noisy", None),
        "recompiles": getattr(res, "recompiles", None),
        "warnings": list(getattr(res, "warnings", []) or []),
        "throttled": getattr(res, "throttled", None),
        "clocks": dict(getattr(res, "clocks", None) or {}),
    }


def run_gpukeeper(ctx: Context, w: Workload) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    try:
        res = ctx.gk.benchmark_function(w.fn, name=w.name, **ctx.gk_kwargs(w))
    except Exception as exc:
        e = _err(exc)
        return {"error": e}, [_method("gpukeeper headline", error=e), _method("gpukeeper device", error=e)]
    info = gk_fields(ctx, res)
    measure = "measure=loop" if ctx.has_measure else "no measure= (device time headline)"
    methods = [_method("gpukeeper headline", info["headline_ms"], measure)]
    if w.framework == "cpu":
        methods.append(_method("gpukeeper device", info["device_median_ms"], "CPU work: each call's host time"))
    elif w.framework == "jax":
        methods.append(_method("gpukeeper device", info["device_median_ms"],
                               "n/a: no events on JAX's streams" if info["device_median_ms"] is None else ""))
    else:
        methods.append(_method("gpukeeper device", info["device_median_ms"],
                               "" if info["device_median_ms"] is not None else "not reported"))
    return info, methods


def do_bench_unusable(ctx: Context, w: Workload) -> Optional[str]:
    """Why do_bench cannot time this workload, or None."""
    if w.framework == "cpu":
        return "n/a on the CPU"
    if w.framework == "jax":
        return "n/a: its events are on PyTorch's stream, JAX runs on its own"
    if ctx.triton_testing is None:
        return f"triton not usable: {ctx.triton_why}"
    return None


def run_do_bench(ctx: Context, w: Workload) -> Dict[str, Any]:
    name = "triton do_bench"
    why = do_bench_unusable(ctx, w)
    if why is not None:
        return _method(name, note=why)
    tt = ctx.triton_testing
    try:
        value = float(tt.do_bench(w.fn, return_mode="median"))
    except Exception as exc:
        return _method(name, error=_err(exc))
    return _method(name, value, "per-call events, L2 flushed before each call")


def torch_timer_unusable(ctx: Context, w: Workload) -> Optional[str]:
    """Why torch.utils.benchmark cannot time this workload, or None."""
    return f"torch not importable ({ctx.torch_why})" if ctx.torch is None else None


def run_torch_timer(ctx: Context, w: Workload) -> Dict[str, Any]:
    name = "torch.utils.benchmark"
    torch = ctx.torch
    why = torch_timer_unusable(ctx, w)
    if why is not None:
        return _method(name, note=why)
    try:
        from torch.utils.benchmark import Timer

        kw: Dict[str, Any] = {"num_threads": torch.get_num_threads()}
        if w.framework == "jax":
            # Its default timer synchronizes PyTorch's device; JAX's queue is waited for
            # through the block's last result instead.
            holder: List[Any] = [None]

            def jax_timer() -> float:
                if holder[0] is not None:
                    ctx.jax.block_until_ready(holder[0])
                return timeit.default_timer()

            timer = Timer("holder[0] = fn()", globals={"fn": w.fn, "holder": holder}, timer=jax_timer, **kw)
        elif w.framework == "cpu":
            timer = Timer("fn()", globals={"fn": w.fn}, timer=timeit.default_timer, **kw)
        else:
            timer = Timer("fn()", globals={"fn": w.fn}, **kw)
        m = timer.blocked_autorange(min_run_time=ctx.s.timer_min_run_s)
    except Exception as exc:
        return _method(name, error=_err(exc))
    return _method(name, float(m.median) * 1e3,
                   f"blocked_autorange: {len(m.times)} blocks of {m.number_per_run} calls")


# --------------------------------------------------------------------- one timing case


def _abba(names: List[str], rounds: int) -> List[str]:
    """``names`` ``rounds`` times, every other round reversed: A B C, C B A, A B C, ..."""
    out: List[str] = []
    for i in range(rounds):
        out += names if i % 2 == 0 else names[::-1]
    return out


def _aggregate(name: str, runs: List[Dict[str, Any]], truth: "LoopTruth", loop_ms: Optional[float],
               span_ms: Optional[float], kernel_ms: Optional[float]) -> Dict[str, Any]:
    """One method's row from its runs (each a ``_method`` dict with ``_slot``, the truth
    slot before it, and for gpukeeper's ``_kernel_ms``, its run's %globaltimer median):
    the median value with its unpaired errors, and the paired errors run by run."""
    values = [r["value_ms"] for r in runs]
    good = [v for v in values if v is not None]
    errors = [r["error"] for r in runs if r.get("error")]
    notes = [r["note"] for r in runs if r.get("note")]
    value = statistics.median(good) if good else None
    note, error = (notes[-1] if notes else ""), None
    if errors and not good:
        error = errors[0]
    elif errors:
        note = (note + "; " if note else "") + f"{len(errors)} of {len(runs)} runs failed: {errors[0]}"
    m = _method(name, value, note, error)
    m["runs"] = len(runs)
    m["values_ms"] = values
    # Unpaired: the median of the runs against the median of all truth repetitions.
    m["vs_loop_pct"] = _pct(value, loop_ms)
    m["vs_span_pct"] = _pct(value, span_ms)
    # Paired: each run against the mean of the two truth slots around it.
    around = [truth.around(r["_slot"]) for r in runs]
    loop_errs = [_pct(v, t[0]) for v, t in zip(values, around)]
    span_errs = [_pct(v, t[1]) for v, t in zip(values, around)]
    lo, sp = _paired_stats(loop_errs), _paired_stats(span_errs)
    m["paired"] = {
        "vs_loop_pct": lo["median"], "vs_loop_spread_pct": lo["spread"], "vs_loop_iqr_pct": lo["iqr"],
        "vs_loop_runs_pct": loop_errs, "vs_span_pct": sp["median"], "vs_span_spread_pct": sp["spread"],
        "vs_span_runs_pct": span_errs, "truth_loop_ms": [t[0] for t in around],
        "truth_span_ms": [t[1] for t in around], "pairs": lo["n"],
    }
    # %globaltimer: a gpukeeper run against its own calls' kernel clock, others against
    # the median over all gpukeeper runs' kernels.
    own = [(r["value_ms"] - r["_kernel_ms"]) * 1e3 for r in runs
           if r.get("_kernel_ms") is not None and r["value_ms"] is not None]
    if own:
        m["vs_kernel_us"] = statistics.median(own)
        m["vs_kernel_runs_us"] = own
    else:
        m["vs_kernel_us"] = None if kernel_ms is None or value is None else (value - kernel_ms) * 1e3
    return m


def _not_run(name: str, note: str) -> Dict[str, Any]:
    m = _method(name, note=note)
    m.update(runs=0, values_ms=[], vs_loop_pct=None, vs_span_pct=None, vs_kernel_us=None, paired=None)
    return m


def _gk_summary(infos: List[Dict[str, Any]]) -> Dict[str, Any]:
    """gpukeeper's fields over its runs: the last run's, with the medians of the figures,
    the most frequent ``bound``, every run's warnings once, and each run in ``per_run``."""
    ok = [i for i in infos if not i.get("error")]
    if not ok:
        return dict(infos[0]) if infos else {"error": "not run"}
    out = dict(ok[-1])
    for key in ("headline_ms", "loop_median_ms", "device_median_ms", "device_busy"):
        vals = [i[key] for i in ok if i.get(key) is not None]
        out[key] = statistics.median(vals) if vals else None
    out["bound"] = Counter(i.get("bound") for i in ok).most_common(1)[0][0]
    warnings: List[str] = []
    for i in ok:
        warnings += [x for x in i.get("warnings") or [] if x not in warnings]
    out["warnings"] = warnings
    out["runs"] = len(infos)
    out["runs_failed"] = len(infos) - len(ok)
    out["per_run"] = [{k: i.get(k) for k in ("headline_ms", "loop_median_ms", "device_median_ms", "bound",
                                             "device_busy", "throttled", "warnings", "clocks", "error")}
                      for i in infos]
    return out


def _throttle_reasons(warning: str) -> List[str]:
    """"throttled: before: sw power cap, sync boost; after: ..." -> its reasons."""
    out = []
    for part in warning[len("throttled:"):].split(";"):
        part = part.strip()
        for when in ("before:", "after:"):
            if part.startswith(when):
                out += [x.strip() for x in part[len(when):].split(",") if x.strip()]
                break
        else:
            if part:
                out.append(part)
    return out


def _throttle_from_runs(infos: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Whether NVML saw the device throttled in gpukeeper's runs of a case (their
    ``throttled``, "throttled: ..." warnings and clock samples)."""
    flags = [i.get("throttled") for i in infos if not i.get("error")]
    reasons: List[str] = []
    clocks: List[int] = []
    status: Optional[str] = None
    for i in infos:
        for text in i.get("warnings") or []:
            if text.startswith("throttled:"):
                for r in _throttle_reasons(text):
                    if r not in reasons:
                        reasons.append(r)
        c = i.get("clocks") or {}
        if c.get("nvml") and (status is None or status == "ok"):
            status = str(c["nvml"])
        for when in ("before", "after"):
            sample = c.get(when)
            if isinstance(sample, dict) and sample.get("sm_clock_mhz"):
                clocks.append(int(sample["sm_clock_mhz"]))
    throttled = True if any(f is True for f in flags) else (False if flags and all(f is False for f in flags)
                                                             else None)
    return {"source": "gpukeeper's NVML samples before and after each of its runs", "unit": "gpukeeper runs",
            "checked": len(flags), "throttled_in": sum(f is True for f in flags), "throttled": throttled,
            "reasons": reasons, "sm_clock_mhz": [min(clocks), max(clocks)] if clocks else None, "nvml": status}


def _throttle_note(t: Optional[Dict[str, Any]]) -> Optional[str]:
    """The table's note on a case's throttling; None where nothing was read (CPU work)."""
    if not t or (t.get("throttled") is None and not t.get("nvml")):
        return None
    clk = t.get("sm_clock_mhz")
    clocks = f", SM clock {clk[0]}-{clk[1]} MHz" if clk else ""
    if t["throttled"]:
        why = ", ".join(t.get("reasons") or []) or "reason not given"
        return (f"NVML: THROTTLED in {t['throttled_in']} of {t['checked']} {t['unit']} ({why}){clocks}: "
                "the device changed speed")
    if t["throttled"] is False:
        return f"NVML: not throttled in {t['checked']} {t['unit']}{clocks}"
    return f"NVML: throttling not known ({t.get('nvml')})"


METHOD_ORDER = ("gpukeeper headline", "gpukeeper device", "triton do_bench", "torch.utils.benchmark")


def run_timing_case(ctx: Context, w: Workload) -> Dict[str, Any]:
    s = ctx.s
    row: Dict[str, Any] = {"case": w.name, "kind": "timing", "framework": w.framework,
                           "description": w.description, "status": "ok", "error": None, "notes": list(w.notes)}
    for _ in range(10):  # caches, allocator and lazy modules settled before any clock
        last = w.fn()
    w.sync(last)
    truth = LoopTruth(w)
    truth.calibrate()

    gk_infos: List[Dict[str, Any]] = []
    kernels: List[float] = []

    def gpukeeper_run() -> List[Dict[str, Any]]:
        if w.kernel_truth is not None:
            w.kernel_truth.reset()
        info, methods = run_gpukeeper(ctx, w)
        gk_infos.append(info)
        if w.kernel_truth is not None:
            durations = w.kernel_truth.durations_us()
            kernels.extend(durations)
            own = statistics.median(durations) / 1e3 if durations else None
            for m in methods:
                m["_kernel_ms"] = own
        return methods

    runners: Dict[str, Callable[[], List[Dict[str, Any]]]] = {"gpukeeper": gpukeeper_run}
    static: Dict[str, Dict[str, Any]] = {}
    for name, unusable, runner in (("triton do_bench", do_bench_unusable, run_do_bench),
                                   ("torch.utils.benchmark", torch_timer_unusable, run_torch_timer)):
        why = unusable(ctx, w)
        if why is None:
            runners[name] = (lambda r=runner: [r(ctx, w)])
        else:
            static[name] = _not_run(name, why)

    # truth, A, truth, B, truth, C, truth, C, truth, B, truth, A, truth, ...
    runs: Dict[str, List[Dict[str, Any]]] = {}
    failed: set = set()  # a method that failed is not run again
    truth.slot(s.reps)
    for name in _abba(list(runners), s.pairs):
        if name in failed:
            continue
        before = len(truth.slot_loop_ms) - 1
        got = runners[name]()
        for m in got:
            m["_slot"] = before
            runs.setdefault(m["method"], []).append(m)
        if all(m.get("error") for m in got):
            failed.add(name)
        truth.slot(s.reps)

    t = truth.summary()
    t["globaltimer_ms"] = statistics.median(kernels) / 1e3 if kernels else None
    if kernels:
        row["kernel_samples"] = len(kernels)
    methods = []
    for name in METHOD_ORDER:
        if name in runs:
            methods.append(_aggregate(name, runs[name], truth, t["loop_ms"], t["span_ms"], t["globaltimer_ms"]))
        elif name in static:
            methods.append(static[name])
    info = _gk_summary(gk_infos)
    row.update(truth=t, gpukeeper=info, methods=methods, pairs=s.pairs, throttle=_throttle_from_runs(gk_infos))
    if info.get("error"):
        row["status"], row["error"] = "error", f"gpukeeper: {info['error']}"
    elif info.get("runs_failed"):
        row["notes"].append(f"gpukeeper failed in {info['runs_failed']} of {info['runs']} runs")
    return row


# --------------------------------------------------------------------- eager vs graph


def run_eager_vs_graph(ctx: Context) -> Dict[str, Any]:
    torch = _need_cuda(ctx)
    s = ctx.s
    region, x = _small_region(torch)
    graph, out = _capture(torch, region)
    impls = {"eager": region, "cuda graph": graph.replay}
    sync = _torch_sync(torch)
    truths = {}
    for key, fn in impls.items():
        w = Workload(key, fn, "torch", key, sync, lambda: TorchSpan(torch))
        for _ in range(10):
            fn()
        sync(None)
        truths[key] = LoopTruth(w)
        truths[key].calibrate()

    keys = list(impls)

    def slot(i: int) -> None:
        # Eager and graph repetitions side by side, their order reversed every other
        # slot, so both see the same device state.
        for key in (keys if i % 2 == 0 else keys[::-1]):
            truths[key].slot(s.reps)

    row: Dict[str, Any] = {"case": "eager_vs_graph", "kind": "compare", "framework": "torch",
                           "description": f"compare_implementations(eager, cuda graph) of the {SMALL_OPS}-kernel "
                                          "region; speedup = eager / graph",
                           "status": "ok", "error": None, "notes": []}
    # truth slot, compare_implementations, truth slot, ...: each comparison paired with
    # the truths right before and after it.
    slot(0)
    results = []
    for i in range(s.pairs):
        results.append(ctx.gk.compare_implementations(impls, **ctx.gk_kwargs()))
        slot(i + 1)
    summaries = {k: t.summary() for k, t in truths.items()}
    truth_speedup = summaries["eager"]["loop_ms"] / summaries["cuda graph"]["loop_ms"]
    gk_speedups = [float(r["cuda graph"].speedup) for r in results]
    gk_speedup = statistics.median(gk_speedups)
    paired_truth = []
    for i in range(len(results)):
        e = _mean(truths["eager"].slot_loop_ms[i:i + 2])
        g = _mean(truths["cuda graph"].slot_loop_ms[i:i + 2])
        paired_truth.append(None if e is None or g is None or g <= 0 else e / g)
    paired_errors = [_pct(v, t) for v, t in zip(gk_speedups, paired_truth)]
    stats = _paired_stats(paired_errors)
    methods = []
    all_infos: List[Dict[str, Any]] = []
    for key in impls:
        infos = [gk_fields(ctx, r[key]) for r in results]
        all_infos += infos
        runs = [dict(_method(key, i["headline_ms"]), _slot=n) for n, i in enumerate(infos)]
        info = _gk_summary(infos)
        m = _aggregate(f"gpukeeper headline ({key})", runs, truths[key], summaries[key]["loop_ms"],
                       summaries[key]["span_ms"], None)
        m["note"] = f"bound {info['bound']}, device busy {_fmt_frac(info['device_busy'])}"
        m["vs_kernel_us"] = None
        m["gpukeeper"] = info
        methods.append(m)
    row.update(
        truth=summaries,
        methods=methods,
        pairs=s.pairs,
        throttle=_throttle_from_runs(all_infos),
        speedup={"gpukeeper": gk_speedup, "loop_truth": truth_speedup,
                 "error_pct": _pct(gk_speedup, truth_speedup),  # unpaired
                 "gpukeeper_runs": gk_speedups, "paired_truth_runs": paired_truth,
                 "paired_errors_pct": paired_errors, "paired_error_pct": stats["median"],
                 "paired_spread_pct": stats["spread"], "paired_iqr_pct": stats["iqr"]},
    )
    return row


# --------------------------------------------------------------------- MD section


def _paired(runs: Dict[str, Callable[[], float]], pairs: int,
            after_round: Optional[Callable[[], None]] = None) -> Dict[str, List[float]]:
    """Each run ``pairs`` times in ABBA order: one round's order reversed in the next (A B,
    B A, A B, ...; with three, A B C, C B A, ...). A drift of the speed (host phases,
    clocks, heat) then puts each run as often before the others as after them, so the
    rounds' ratios err as often one way as the other and their median cancels it."""
    out: Dict[str, List[float]] = {n: [] for n in runs}
    names = list(runs)
    for i in range(pairs):
        for n in (names if i % 2 == 0 else names[::-1]):
            out[n].append(runs[n]())
        if after_round is not None:
            after_round()
    return out


def _md_row(case: str, description: str) -> Dict[str, Any]:
    return {"case": case, "kind": "md", "description": description, "status": "ok", "error": None, "notes": []}


def _ns_day(steps: int, dt_fs: float, seconds: float) -> float:
    return steps * dt_fs * 1e-6 * 86400.0 / seconds


def _md_steps(s: Settings, probe_s: float, probe_steps: int, cap: int) -> int:
    """Steps for one MD run to last about ``s.md_run_s``, from a timed probe."""
    per_step = max(probe_s, 1e-9) / probe_steps
    return int(min(cap, max(MD_MIN_STEPS, round(s.md_run_s / per_step))))


def _md_summary(row: Dict[str, Any], got: Dict[str, List[float]], keys: List[str]) -> None:
    gk = got["gpukeeper"]
    row["ns_per_day"] = got
    row["ratios"] = {}
    for key in keys:
        ratios = [a / b for a, b in zip(gk, got[key])]
        med = statistics.median(ratios)
        q1, q3 = _quartiles(ratios)
        row["ratios"][key] = {"pairs": ratios, "median": med, "error_pct": (med - 1) * 100,
                              "q1": q1, "q3": q3, "iqr": q3 - q1, "iqr_pct": (q3 - q1) * 100,
                              "spread": max(ratios) - min(ratios)}


class ClockLog:
    """NVML samples of the device taken by this program (for the MD cases, whose
    gpukeeper result reads no clocks): clock-event reasons and SM clock."""

    def __init__(self, ctx: Context) -> None:
        self.samples: List[Dict[str, Any]] = []
        self.why: Optional[str] = None
        self.bits: Dict[int, str] = {}
        self._sample: Optional[Callable[[int], Tuple[Optional[Dict[str, Any]], str]]] = None
        try:
            from gpukeeper.timing.throttle import THROTTLE_BITS, nvml_sample

            self.index = int(ctx.torch.cuda.current_device())
            self._sample, self.bits = nvml_sample, dict(THROTTLE_BITS)
        except Exception as exc:  # an older gpukeeper: the row says so
            self.why = f"not read: {_err(exc)}"

    def sample(self) -> None:
        if self._sample is None:
            return
        try:
            got, why = self._sample(self.index)
        except Exception as exc:
            got, why = None, _err(exc)
        if got is None:
            self.why = why
        else:
            self.samples.append(got)

    def record(self) -> Dict[str, Any]:
        reasons: List[str] = []
        hit = 0
        for smp in self.samples:
            bits = [text for bit, text in self.bits.items() if int(smp.get("reasons", 0) or 0) & bit]
            hit += bool(bits)
            reasons += [b for b in bits if b not in reasons]
        clocks = [int(x["sm_clock_mhz"]) for x in self.samples if x.get("sm_clock_mhz")]
        return {"source": "NVML sampled by this program before the first run and after each round",
                "unit": "NVML samples", "checked": len(self.samples), "throttled_in": hit,
                "throttled": (hit > 0) if self.samples else None, "reasons": reasons,
                "sm_clock_mhz": [min(clocks), max(clocks)] if clocks else None,
                "nvml": "ok" if self.samples and self.why is None else self.why}


def run_md_schnet(ctx: Context) -> Dict[str, Any]:
    torch = _need_cuda(ctx)
    try:
        from torch_geometric.nn.models import SchNet
    except Exception as exc:
        raise Skip(f"torch-geometric not importable ({_err(exc)})") from None
    s = ctx.s
    atoms, cutoff, dt_fs = 128, 5.0, 1.0
    row = _md_row("md_schnet", f"torch-geometric SchNet (64 channels, 3 interactions), {atoms} random atoms, "
                               f"graph within {cutoff} inside the model, energy + forces by autograd")

    def pairs_within_cutoff(pos: Any, batch: Any) -> Tuple[Any, Any]:
        # Every pair within the cutoff in plain torch: SchNet's default neighbour search
        # needs torch-cluster, which is often missing.
        d = torch.cdist(pos, pos)
        close = (d < cutoff) & ~torch.eye(pos.shape[0], dtype=torch.bool, device=pos.device)
        edge_index = close.nonzero().t()
        return edge_index, d[edge_index[0], edge_index[1]]

    torch.manual_seed(0)
    model = SchNet(hidden_channels=64, num_filters=64, num_interactions=3, cutoff=cutoff,
                   interaction_graph=pairs_within_cutoff).cuda()
    z = torch.randint(1, 10, (atoms,), device="cuda")
    box = float(atoms) ** (1 / 3) * 1.5
    frames = [torch.rand(atoms, 3, device="cuda") * box for _ in range(8)]
    inputs = [frames[i % len(frames)] for i in range(s.schnet_steps)]

    def step(pos: Any) -> Any:
        pos = pos.detach().requires_grad_(True)
        energy = model(z, pos).sum()
        (grad,) = torch.autograd.grad(energy, pos)
        return energy.detach(), -grad

    for x in frames * 2:
        step(x)
    torch.cuda.synchronize()

    def loop_s(xs: List[Any]) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = None
        for x in xs:
            out = step(x)  # kept until the next step, as an integrator keeps its forces
        out = None  # noqa: F841
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    # Runs of about md_run_s each: short enough for a round to fit in one of the host's
    # phases; the faster of two probes, as a neighbour may slow one.
    probe = frames * 2
    n_steps = _md_steps(s, min(loop_s(probe), loop_s(probe)), len(probe), s.schnet_steps)
    inputs = [frames[i % len(frames)] for i in range(n_steps)]

    def plain() -> float:
        return _ns_day(len(inputs), dt_fs, loop_s(inputs))

    last: Dict[str, Any] = {}

    def measured() -> float:
        res = ctx.gk.benchmark_md_trajectory(step, inputs, warmup_steps=5, timestep_fs=dt_fs, n_atoms=atoms)
        last["res"] = res
        return float(res.ns_per_day)

    clocks = ClockLog(ctx)
    clocks.sample()
    t0 = time.perf_counter()
    got = _paired({"wall": plain, "gpukeeper": measured}, s.md_pairs, clocks.sample)
    run_s = (time.perf_counter() - t0) / max(1, 2 * s.md_pairs)
    _md_summary(row, got, ["wall"])
    row["throttle"] = clocks.record()
    res = last["res"]
    row["config"] = {"atoms": atoms, "steps": len(inputs), "timestep_fs": dt_fs, "pairs": s.md_pairs,
                     "order": "ABBA", "run_s_target": s.md_run_s, "run_s_mean": run_s}
    row["gpukeeper"] = {"throughput_source": getattr(res, "throughput_source", None),
                        "timing_method": getattr(res, "timing_method", None),
                        "median_step_ms": res.median_ms, "warnings": list(res.warnings)}
    return row


def run_md_openmm(ctx: Context) -> Dict[str, Any]:
    _need_cuda(ctx)
    try:
        import openmm as mm
        from openmm import unit
    except Exception as exc:
        raise Skip(f"openmm not importable ({_err(exc)})") from None
    try:
        platform = mm.Platform.getPlatformByName("CUDA")
    except Exception as exc:
        raise Skip(f"openmm has no CUDA platform ({_err(exc)})") from None
    s = ctx.s
    side, spacing, dt_fs = 10, 0.37, 2.0
    row = _md_row("md_openmm", f"OpenMM CUDA: {side ** 3} Lennard-Jones (argon-like) particles, periodic, "
                               f"cutoff 1 nm, LangevinMiddle {dt_fs} fs, integrator.step(1) per call")
    box = side * spacing
    system = mm.System()
    system.setDefaultPeriodicBoxVectors(mm.Vec3(box, 0, 0), mm.Vec3(0, box, 0), mm.Vec3(0, 0, box))
    lj = mm.NonbondedForce()
    lj.setNonbondedMethod(mm.NonbondedForce.CutoffPeriodic)
    lj.setCutoffDistance(1.0)
    positions = []
    for i in range(side):
        for j in range(side):
            for k in range(side):
                system.addParticle(39.948)
                lj.addParticle(0.0, 0.34, 0.996)
                positions.append(mm.Vec3(i * spacing, j * spacing, k * spacing))
    system.addForce(lj)
    integrator = mm.LangevinMiddleIntegrator(120 * unit.kelvin, 1 / unit.picosecond, dt_fs * unit.femtoseconds)
    context = mm.Context(system, integrator, platform)
    context.setPositions(positions)
    mm.LocalEnergyMinimizer.minimize(context, 10.0, 100)
    context.setVelocitiesToTemperature(120 * unit.kelvin)

    def step(_: Any) -> None:
        integrator.step(1)

    def synchronize() -> None:
        context.getState()  # a download from the device: waits for the queued steps

    for _ in range(50):
        step(None)
    synchronize()

    def loop_s(n: int) -> float:
        synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            step(None)
        synchronize()
        return time.perf_counter() - t0

    # Runs of about md_run_s each (see md_schnet).
    probe = 200
    steps = _md_steps(s, min(loop_s(probe), loop_s(probe)), probe, s.openmm_steps)

    def plain() -> float:
        return _ns_day(steps, dt_fs, loop_s(steps))

    def openmm_own() -> float:
        # StateDataReporter's speed: simulated time elapsed over wall time elapsed
        # between two states.
        sim0 = context.getState().getTime()
        t0 = time.perf_counter()
        for _ in range(steps):
            step(None)
        sim1 = context.getState().getTime()
        seconds = time.perf_counter() - t0
        return (sim1 - sim0).value_in_unit(unit.nanosecond) * 86400.0 / seconds

    last: Dict[str, Any] = {}

    def measured() -> float:
        res = ctx.gk.benchmark_md_trajectory(step, list(range(steps)), warmup_steps=5, timestep_fs=dt_fs,
                                             n_atoms=side ** 3, synchronize=synchronize)
        last["res"] = res
        return float(res.ns_per_day)

    clocks = ClockLog(ctx)
    clocks.sample()
    t0 = time.perf_counter()
    # ABBA with gpukeeper in the middle: wall, gpukeeper, openmm / openmm, gpukeeper, wall.
    got = _paired({"wall": plain, "gpukeeper": measured, "openmm": openmm_own}, s.md_pairs, clocks.sample)
    run_s = (time.perf_counter() - t0) / max(1, 3 * s.md_pairs)
    _md_summary(row, got, ["wall", "openmm"])
    row["throttle"] = clocks.record()
    res = last["res"]
    row["config"] = {"particles": side ** 3, "steps": steps, "timestep_fs": dt_fs, "rounds": s.md_pairs,
                     "order": "ABBA", "run_s_target": s.md_run_s, "run_s_mean": run_s,
                     "openmm": mm.__version__}
    row["gpukeeper"] = {"throughput_source": getattr(res, "throughput_source", None),
                        "timing_method": getattr(res, "timing_method", None),
                        "synchronized": getattr(res, "synchronized", None),
                        "median_step_ms": res.median_ms, "warnings": list(res.warnings),
                        "memory_source": res.memory_source,
                        "memory_sample_every": res.memory_sample_every,
                        "memory_samples": len(res.memory_steps)}
    return row


# --------------------------------------------------------------------- the case table


@dataclass(frozen=True)
class Case:
    name: str
    gpu: bool
    run: Callable[[Context], Dict[str, Any]]


def _timing(builder: Callable[[Context], Workload]) -> Callable[[Context], Dict[str, Any]]:
    def run(ctx: Context) -> Dict[str, Any]:
        w = builder(ctx)
        try:
            return run_timing_case(ctx, w)
        finally:
            if w.restore is not None:
                w.restore()

    return run


CASES: Dict[str, Case] = {c.name: c for c in [
    Case("cpu", False, _timing(build_cpu)),
    Case("spin_10us", True, _timing(lambda ctx: build_spin(ctx, 10_000))),
    Case("spin_100us", True, _timing(lambda ctx: build_spin(ctx, 100_000))),
    Case("spin_1ms", True, _timing(lambda ctx: build_spin(ctx, 1_000_000))),
    Case("matmul_region", True, _timing(build_matmul)),
    Case("launch_bound", True, _timing(build_launch_bound)),
    Case("cuda_graph", True, _timing(build_cuda_graph)),
    Case("eager_vs_graph", True, run_eager_vs_graph),
    Case("torch_compile", True, _timing(build_torch_compile)),
    Case("cupy", True, _timing(build_cupy)),
    Case("jax", True, _timing(build_jax)),
    Case("md_schnet", True, run_md_schnet),
    Case("md_openmm", True, run_md_openmm),
]}
MD_CASES = ("md_schnet", "md_openmm")


def run_case(ctx: Context, case: Case) -> Dict[str, Any]:
    """One case, isolated: a missing package gives a skipped row, any error an error row."""
    kind = "md" if case.name in MD_CASES else ("compare" if case.name == "eager_vs_graph" else "timing")
    t0 = time.perf_counter()
    try:
        row = case.run(ctx)
    except Skip as why:
        row = {"case": case.name, "kind": kind, "status": "skipped", "error": None, "reason": str(why)}
    except Exception as exc:
        row = {"case": case.name, "kind": kind, "status": "error", "error": _err(exc),
               "traceback": traceback.format_exc(limit=8)}
    row["seconds"] = round(time.perf_counter() - t0, 2)
    _release(ctx)
    return row


def run_md_section(ctx: Context, names: List[str]) -> List[Dict[str, Any]]:
    """The MD cases (benchmark_md_trajectory against plain loops), each isolated."""
    rows = []
    for name in names:
        if name not in MD_CASES:
            continue
        if not ctx.cuda:
            rows.append({"case": name, "kind": "md", "status": "skipped", "error": None,
                         "reason": f"no CUDA ({ctx.cuda_why})"})
            continue
        print(f"-- {name}", flush=True)
        rows.append(run_case(ctx, CASES[name]))
        announce(rows[-1])
    return rows


def announce(row: Dict[str, Any]) -> None:
    """One line on how a case went, printed as the run goes."""
    if row["status"] != "ok":
        print(f"   {row['status']} in {row['seconds']:.1f} s: {row.get('error') or row.get('reason')}", flush=True)
        return
    kind, what = row.get("kind"), ""
    if kind == "timing":
        t, g = row["truth"], row.get("gpukeeper") or {}
        head = next((m for m in row["methods"] if m["method"] == "gpukeeper headline"), {})
        p = head.get("paired") or {}
        what = (f"loop truth {_fmt_ms(t['loop_ms'])} ms, gpukeeper {_fmt_ms(head.get('value_ms'))} ms "
                f"(paired {_fmt_pct(p.get('vs_loop_pct'))} %, spread {_fmt_spread(p.get('vs_loop_spread_pct'))}; "
                f"unpaired {_fmt_pct(head.get('vs_loop_pct'))} %), device {_fmt_ms(g.get('device_median_ms'))} ms, "
                f"bound {g.get('bound')}, busy {_fmt_frac(g.get('device_busy'))}")
    elif kind == "compare":
        sp = row["speedup"]
        what = (f"speedup: loop truths {_fmt_num(sp['loop_truth'], '.3f')}, gpukeeper "
                f"{_fmt_num(sp['gpukeeper'], '.3f')} (paired {_fmt_pct(sp.get('paired_error_pct'))} %, "
                f"unpaired {_fmt_pct(sp['error_pct'])} %)")
    elif kind == "md":
        what = ", ".join(f"gpukeeper/{k} median {_fmt_num(r['median'], '.4f')} (IQR {_fmt_num(r.get('iqr'), '.4f')})"
                         for k, r in row["ratios"].items())
    note = _throttle_note(row.get("throttle"))
    print(f"   ok in {row['seconds']:.1f} s: {what}" + (f"; {note}" if note else ""), flush=True)


def _release(ctx: Context) -> None:
    gc.collect()
    if ctx.cuda:
        try:
            ctx.torch.cuda.synchronize()
            ctx.torch.cuda.empty_cache()
        except Exception:  # a case that broke the device is reported in its own row
            pass


# --------------------------------------------------------------------- targets


def _target(name: str, case: str, error: Optional[float], limit: float, unit: str,
            spread: Optional[float] = None, basis: str = "", unpaired: Optional[float] = None,
            spread_kind: str = "max - min") -> Dict[str, Any]:
    """A target's verdict on ``error`` (the paired median where there is one); ``spread``
    is that of the paired errors (``spread_kind``), ``unpaired`` the unpaired error."""
    extra = {"basis": basis, "spread": spread, "spread_kind": spread_kind, "unpaired_error": unpaired}
    if error is None:
        return {"target": name, "case": case, "error": None, "limit": limit, "unit": unit, "margin": None,
                "met": None, "verdict": "not measured", **extra}
    margin = limit - abs(error)
    return {"target": name, "case": case, "error": error, "limit": limit, "unit": unit, "margin": margin,
            "met": margin >= 0, "verdict": "met" if margin >= 0 else "missed", **extra}


def _paired_loop(m: Dict[str, Any]) -> Tuple[Optional[float], Optional[float], str]:
    """(error, spread, basis) of a method against the loop truth: the paired median where
    the method was paired, else its unpaired error."""
    p = m.get("paired")
    if p is not None:
        return p.get("vs_loop_pct"), p.get("vs_loop_spread_pct"), f"paired median of {p.get('pairs')}"
    return m.get("vs_loop_pct"), None, "unpaired"


def collect_targets(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    for row in rows:
        if row["status"] == "skipped":
            continue
        case, kind = row["case"], row.get("kind")
        ok = row["status"] == "ok"
        if kind == "timing":
            methods = {m["method"]: m for m in row.get("methods", [])}
            bound = (row.get("gpukeeper") or {}).get("bound")
            head_m = methods.get("gpukeeper headline", {})
            head, spread, basis = _paired_loop(head_m) if ok else (None, None, "")
            unpaired = head_m.get("vs_loop_pct") if ok else None
            if bound == "device":
                out.append(_target("headline vs loop truth (device-bound)", case, head,
                                   HEADLINE_DEVICE_BOUND_LIMIT_PCT, "%", spread, basis, unpaired))
            else:
                out.append(_target("headline vs loop truth", case, head, HEADLINE_LIMIT_PCT, "%",
                                   spread, basis, unpaired))
            if case.startswith("spin_"):
                dev_m = methods.get("gpukeeper device", {})
                dev = dev_m.get("vs_kernel_us") if ok else None
                runs = dev_m.get("vs_kernel_runs_us") or []
                out.append(_target("device time vs %globaltimer", case, dev, KERNEL_LIMIT_US, "us",
                                   (max(runs) - min(runs)) if len(runs) > 1 else None,
                                   f"median of {len(runs)} runs, each against its own kernels" if runs else ""))
        elif kind == "compare":
            sp = row.get("speedup") or {}
            paired = "paired_error_pct" in sp
            err = (sp.get("paired_error_pct") if paired else sp.get("error_pct")) if ok else None
            out.append(_target("speedup vs loop truths' speedup", case, err, SPEEDUP_LIMIT_PCT, "%",
                               sp.get("paired_spread_pct") if ok else None,
                               f"paired median of {len(sp.get('paired_errors_pct') or [])}" if paired else "unpaired",
                               sp.get("error_pct") if ok else None))
        elif kind == "md":
            ratios = row.get("ratios") or {}
            keys = ["wall", "openmm"] if case == "md_openmm" else ["wall"]
            for key in keys:
                r = ratios.get(key, {})
                err = r.get("error_pct") if ok else None
                out.append(_target(f"ns/day vs {key} ({'OpenMM speed' if key == 'openmm' else 'plain loop'})",
                                   case, err, MD_LIMIT_PCT, "%", r.get("iqr_pct") if ok else None,
                                   f"median of {len(r.get('pairs') or [])} ABBA rounds' ratios",
                                   spread_kind="IQR"))
    return out


# --------------------------------------------------------------------- output


def _fmt_ms(v: Optional[float]) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:.5g}"


def _fmt_num(v: Optional[float], spec: str) -> str:
    return "-" if v is None or not math.isfinite(v) else format(v, spec)


def _fmt_pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:+.2f}"


def _fmt_frac(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _fmt_spread(v: Optional[float]) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.2f}"


def _tables(report: Dict[str, Any]) -> List[Tuple[str, List[str], List[List[str]]]]:
    """(title, header, rows) of each table, as text cells."""
    rows = report["rows"]
    timing = [r for r in rows if r.get("kind") == "timing"]
    cases_body, methods_body = [], []
    for r in timing:
        if r["status"] == "skipped":
            cases_body.append([r["case"], "-", "-", "-", "-", "-", "-", "-", "-", f"skipped: {r['reason']}"])
            continue
        t, g = r.get("truth") or {}, r.get("gpukeeper") or {}
        throttle = _throttle_note(r.get("throttle"))
        notes = "; ".join(([f"ERROR {r['error']}"] if r.get("error") else []) + r.get("notes", [])
                          + ([throttle] if throttle else []))
        cases_body.append([
            r["case"], _fmt_ms(t.get("loop_ms")),
            f"{t.get('calls_per_rep', '-')} x {t.get('reps', '-')}", str(r.get("pairs", "-")),
            "-" if t.get("loop_spread_pct") is None else f"{t['loop_spread_pct']:.2f}",
            _fmt_ms(t.get("span_ms")), _fmt_ms(t.get("globaltimer_ms")),
            str(g.get("bound") or "-"), _fmt_frac(g.get("device_busy")), notes])
        for m in r.get("methods", []):
            note = f"ERROR {m['error']}" if m.get("error") else m.get("note", "")
            p = m.get("paired") or {}
            methods_body.append([
                r["case"], m["method"], _fmt_ms(m.get("value_ms")), _fmt_pct(p.get("vs_loop_pct")),
                _fmt_spread(p.get("vs_loop_spread_pct")), _fmt_pct(m.get("vs_loop_pct")),
                _fmt_pct(p.get("vs_span_pct")),
                "-" if m.get("vs_kernel_us") is None else f"{m['vs_kernel_us']:+.3f}", note])
    out = [
        ("cases and their truths (ms per call; truth reps in slots between the method runs)",
         ["case", "loop truth", "calls x reps", "pairs", "spread %", "span truth", "%globaltimer", "bound", "busy",
          "notes"],
         cases_body),
        ("methods against the truths (paired: median over the runs of the error against the truth "
         "slots right before and after each run; spread: max - min of those errors)",
         ["case", "method", "ms", "vs loop % paired", "paired spread %", "vs loop % unpaired", "vs span % paired",
          "vs kernel us", "note"], methods_body),
    ]
    compare = [r for r in rows if r.get("kind") == "compare"]
    if compare:
        body = []
        for r in compare:
            if r["status"] != "ok":
                body.append([r["case"]] + ["-"] * 7 + [r.get("reason") or f"ERROR {r.get('error')}"])
                continue
            sp, t = r["speedup"], r["truth"]
            notes = [f"{m['method']} {_fmt_pct(_paired_loop(m)[0])} % vs its loop truth" for m in r["methods"]]
            throttle = _throttle_note(r.get("throttle"))
            body.append([r["case"], _fmt_num(sp["loop_truth"], ".3f"), _fmt_num(sp["gpukeeper"], ".3f"),
                         _fmt_pct(sp.get("paired_error_pct")), _fmt_spread(sp.get("paired_spread_pct")),
                         _fmt_pct(sp["error_pct"]),
                         _fmt_ms(t["eager"]["loop_ms"]), _fmt_ms(t["cuda graph"]["loop_ms"]),
                         "; ".join(notes + ([throttle] if throttle else []))])
        out.append(("eager vs CUDA graph",
                    ["case", "truth speedup", "gpukeeper speedup", "error % paired", "paired spread %",
                     "error % unpaired", "eager ms", "graph ms", "notes"], body))
    md = [r for r in rows if r.get("kind") == "md"]
    if md:
        body = []
        for r in md:
            if r["status"] != "ok":
                body.append([r["case"], "-", "-", "-", "-", "-", r.get("reason") or f"ERROR {r.get('error')}"])
                continue
            ns = r["ns_per_day"]
            throttle = _throttle_note(r.get("throttle"))
            for i, (key, ratio) in enumerate(r["ratios"].items()):
                iqr = "" if ratio.get("iqr") is None else f", IQR {ratio['iqr']:.4f}"
                body.append([r["case"], key, " ".join(f"{v:.4g}" for v in ns["gpukeeper"]),
                             " ".join(f"{v:.4g}" for v in ns[key]),
                             " ".join(f"{v:.4f}" for v in ratio["pairs"]),
                             f"median {ratio['median']:.4f} ({_fmt_pct(ratio['error_pct'])} %){iqr}",
                             (throttle or "") if i == 0 else ""])
        out.append(("MD: gpukeeper's ns/day against the plain loop (and OpenMM's speed), rounds in ABBA order",
                    ["case", "against", "gpukeeper ns/day", "reference ns/day", "ratios", "ratio", "notes"], body))
    return out


def print_tables(report: Dict[str, Any]) -> None:
    tables = _tables(report)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text where rich is not installed
        for title, header, body in tables:
            print(f"\n{title}")
            print(" | ".join(header))
            for cells in body:
                print(" | ".join(cells))
        return
    console = Console(width=None if sys.stdout.isatty() else 180)
    for title, header, body in tables:
        table = Table(title=title)
        for i, col in enumerate(header):
            left = i < 2 or col in ("notes", "note", "against")
            table.add_column(col, justify="left" if left else "right", overflow="fold")
        for cells in body:
            table.add_row(*cells)
        console.print(table)


def print_targets(targets: List[Dict[str, Any]]) -> None:
    print("\ntargets:")
    for t in targets:
        if t["verdict"] == "not measured":
            print(f"  not measured  {t['target']} [{t['case']}]")
            continue
        rel = "<=" if t["met"] else ">"
        how = [t["basis"]] if t.get("basis") else []
        if t.get("spread") is not None:
            how.append(f"{'spread' if t.get('spread_kind', 'max - min') == 'max - min' else t['spread_kind']} "
                       f"{t['spread']:.3f} {t['unit']}")
        if t.get("unpaired_error") is not None and t.get("basis", "").startswith("paired"):
            how.append(f"unpaired {t['unpaired_error']:+.3f} {t['unit']}")
        print(f"  {t['verdict']:12s}  {t['target']} [{t['case']}]: |{t['error']:+.3f}| {t['unit']} {rel} "
              f"{t['limit']:g} {t['unit']} (margin {t['margin']:+.3f} {t['unit']})"
              + (f" [{'; '.join(how)}]" if how else ""))
    missed = [t for t in targets if t["verdict"] == "missed"]
    counts = {v: sum(t["verdict"] == v for t in targets) for v in ("met", "missed", "not measured")}
    print(f"\n{counts['met']} met, {counts['missed']} missed, {counts['not measured']} not measured")
    if missed:
        print("MISSED TARGETS:")
        for t in missed:
            print(f"  {t['target']} [{t['case']}]: error {t['error']:+.3f} {t['unit']}, limit {t['limit']:g} "
                  f"{t['unit']}, missed by {-t['margin']:.3f} {t['unit']}")


def _version(*dists: str) -> Optional[str]:
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def environment_block(ctx: Context) -> Dict[str, Any]:
    env = environment(ctx.gk, ctx.torch, ctx.cupy)
    env["date"] = datetime.date.today().isoformat()
    avail = None
    try:
        avail = ctx.gk.cuda_available()
    except Exception:
        pass
    env["driver"] = getattr(avail, "driver_version", None)
    # Versions from the installed distributions: importing triton, JAX or OpenMM just to
    # read a version would initialise them on a machine where no case needed them.
    env["triton"] = getattr(sys.modules.get("triton"), "__version__", None) or _version("triton")
    env["cupy"] = env.get("cupy") or _version("cupy", "cupy-cuda13x", "cupy-cuda12x")
    env["jax"] = getattr(ctx.jax, "__version__", None) or _version("jax")
    env["jaxlib"] = _version("jaxlib")
    env["torch_geometric"] = _version("torch_geometric", "torch-geometric")
    env["openmm"] = _version("openmm")
    return env


def _json_safe(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if v is None or isinstance(v, (bool, int, str)):
        return v
    return str(v)


# --------------------------------------------------------------------- main


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short run (fewer repetitions, calls and steps)")
    ap.add_argument("--json", metavar="PATH", help="write the report here")
    ap.add_argument("--cases", help=f"comma-separated cases (default all): {','.join(CASES)}")
    ap.add_argument("--pairs", type=int, help="alternations of truth and method runs per timing case "
                    "(default 5, --quick 2)")
    ap.add_argument("--md-pairs", type=int, help="rounds of the MD runs in ABBA order (default 8, --quick 4)")
    ap.add_argument("--reps", type=int, help="loop-truth repetitions in each slot between two method runs "
                    "(default 1)")
    a = ap.parse_args(argv)
    if a.cases:
        names = [n.strip() for n in a.cases.split(",") if n.strip()]
        unknown = [n for n in names if n not in CASES]
        if unknown:
            ap.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
        a.case_names = [n for n in CASES if n in names]
    else:
        a.case_names = list(CASES)
    return a


def main(argv: Optional[List[str]] = None) -> int:
    a = parse_args(argv)
    # Before the jax case imports JAX: it would otherwise take most of the GPU's memory at
    # start, leaving little for PyTorch and CuPy in the same process.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # gpukeeper's progress bars would interleave with this program's own output.
    os.environ.setdefault("GPUKEEPER_PROGRESS", "0")
    settings = Settings.make(a.quick, a.reps, a.pairs, a.md_pairs)
    ctx = Context(settings)
    started = time.perf_counter()
    print(f"timing truth: {len(a.case_names)} case(s), {settings.pairs} pairs per case "
          f"({settings.reps} truth repetition(s) between runs), {settings.md_pairs} MD rounds"
          f"{' (quick)' if settings.quick else ''}; gpukeeper {getattr(ctx.gk, '__version__', '?')}"
          f"{'' if ctx.has_measure else ' (no measure= parameter: headline is device time)'}", flush=True)
    if not ctx.cuda:
        gpu_cases = [n for n in a.case_names if CASES[n].gpu]
        if gpu_cases:
            print(f"no CUDA: GPU cases skipped ({', '.join(gpu_cases)}): {ctx.cuda_why}", flush=True)

    rows: List[Dict[str, Any]] = []
    for name in a.case_names:
        case = CASES[name]
        if name in MD_CASES:
            continue
        if case.gpu and not ctx.cuda:
            rows.append({"case": name, "kind": "compare" if name == "eager_vs_graph" else "timing",
                         "status": "skipped", "error": None, "reason": f"no CUDA ({ctx.cuda_why})"})
            continue
        print(f"-- {name}", flush=True)
        rows.append(run_case(ctx, case))
        announce(rows[-1])
    rows += run_md_section(ctx, a.case_names)

    targets = collect_targets(rows)
    skipped = [{"case": r["case"], "reason": r["reason"]} for r in rows if r["status"] == "skipped"]
    report = {
        "schema": SCHEMA,
        "env": environment_block(ctx),
        "cuda": ctx.cuda,
        "gpu_cases_skipped": not ctx.cuda and any(CASES[n].gpu for n in a.case_names),
        "skipped": skipped,
        "config": {"quick": settings.quick, "reps": settings.reps, "min_rep_s": MIN_REP_S,
                   "min_rep_calls": MIN_REP_CALLS, "gpukeeper_n_calls": settings.gk_calls,
                   "gpukeeper_warmup": settings.gk_warmup, "timer_min_run_s": settings.timer_min_run_s,
                   "md_pairs": settings.md_pairs, "cases": a.case_names,
                   "pairs": settings.pairs, "reps_per_slot": settings.reps, "md_run_s": settings.md_run_s,
                   "md_max_steps": {"md_schnet": settings.schnet_steps, "md_openmm": settings.openmm_steps},
                   "pairing": ("per timing case: truth slot, then each method run followed by a truth slot, "
                               "the methods' order reversed every other alternation (ABBA); a run's paired "
                               "error is against the mean of the slots before and after it; MD: rounds in "
                               "ABBA order, one ratio per round")},
        "gpukeeper_api": ctx.api(),
        "rows": rows,
        "targets": targets,
        "missed": [t for t in targets if t["verdict"] == "missed"],
        "seconds": round(time.perf_counter() - started, 1),
    }
    if a.json:  # first: the measurements are kept even if printing them fails
        with open(a.json, "w") as f:
            json.dump(_json_safe(report), f, indent=2, allow_nan=False)
    print()
    print_tables(report)
    if skipped:
        print("\nskipped:")
        for s in skipped:
            print(f"  {s['case']}: {s['reason']}")
    print_targets(targets)
    if a.json:
        print(f"\nJSON: {a.json}")
    print(f"total {report['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

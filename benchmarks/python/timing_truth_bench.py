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
                   that one repetition lasts >= 20 ms and holds >= 50 calls; the median of
                   7 repetitions, half taken before the methods run and half after, so a
                   drift of the device's speed shows in the spread instead of in one side
  span truth       one event pair (torch.cuda.Event, cupy.cuda.Event) around the same N
                   calls, / N (n/a for JAX, whose streams are its own, and the CPU)
  %globaltimer     for the calibration kernels: the kernel's own first and last reading of
                   the GPU's nanosecond clock (gpukeeper's spin_kernel writes both), the
                   median over the calls gpukeeper made
  wall ns/day      (MD) the same steps in a plain loop, wall clock synchronized at the end;
                   for OpenMM also its own measure, simulated time (State.getTime()) over
                   wall time, as its StateDataReporter computes speed

The methods, per case: gpukeeper's headline (``benchmark_function(...).median_ms``: the
time per call of calls run back to back), gpukeeper's device time (``device_median_ms``:
the call's GPU work with the launch hidden), ``triton.testing.do_bench(fn,
return_mode="median")`` and ``torch.utils.benchmark.Timer(...).blocked_autorange().median``;
each as a value in ms and its error against the loop and span truths (in % ; in us
against %globaltimer). gpukeeper's ``bound`` and ``device_busy`` are printed per case.

Targets (printed as met/missed with the margin; a miss does not change the exit status):

  - gpukeeper's headline within 2 % of the loop truth for every callable, within 1 % where
    gpukeeper finds the call device-bound (``bound == "device"``);
  - the calibration kernels' device time within 0.1 us of %globaltimer;
  - the eager-vs-graph speedup within 5 % of the loop truths' speedup;
  - MD: gpukeeper's ns/day within 2 % of the wall clock's (median of paired runs, the two
    alternating).

Without CUDA the GPU cases are skipped (said so, exit status 0); the cpu case still runs.
Exit status 1 only when the program itself fails, never for a case's error (it goes
into that case's row) or a missed target.

    python timing_truth_bench.py [--quick] [--json PATH] [--cases a,b,...]
"""

from __future__ import annotations

import argparse
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


class Skip(Exception):
    """A case that cannot run here (a missing package or device); the message says why."""


@dataclass(frozen=True)
class Settings:
    quick: bool
    reps: int  # repetitions of each loop truth
    gk_calls: int  # benchmark_function's n_calls
    gk_warmup: int
    timer_min_run_s: float  # torch.utils.benchmark's min_run_time
    md_pairs: int
    schnet_steps: int
    openmm_steps: int

    @staticmethod
    def make(quick: bool, reps: Optional[int]) -> "Settings":
        if quick:
            s = Settings(True, 3, 20, 5, 0.05, 3, 30, 200)
        else:
            s = Settings(False, 7, 100, 10, 0.2, 5, 300, 2000)
        if reps is not None:
            s = Settings(s.quick, max(1, reps), s.gk_calls, s.gk_warmup, s.timer_min_run_s,
                         s.md_pairs, s.schnet_steps, s.openmm_steps)
        return s


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
        }


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


def run_do_bench(ctx: Context, w: Workload) -> Dict[str, Any]:
    name = "triton do_bench"
    if w.framework == "cpu":
        return _method(name, note="n/a on the CPU")
    if w.framework == "jax":
        return _method(name, note="n/a: its events are on PyTorch's stream, JAX runs on its own")
    tt = ctx.triton_testing
    if tt is None:
        return _method(name, note=f"triton not usable: {ctx.triton_why}")
    try:
        value = float(tt.do_bench(w.fn, return_mode="median"))
    except Exception as exc:
        return _method(name, error=_err(exc))
    return _method(name, value, "per-call events, L2 flushed before each call")


def run_torch_timer(ctx: Context, w: Workload) -> Dict[str, Any]:
    name = "torch.utils.benchmark"
    torch = ctx.torch
    if torch is None:
        return _method(name, note=f"torch not importable ({ctx.torch_why})")
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


def run_timing_case(ctx: Context, w: Workload) -> Dict[str, Any]:
    s = ctx.s
    row: Dict[str, Any] = {"case": w.name, "kind": "timing", "framework": w.framework,
                           "description": w.description, "status": "ok", "error": None, "notes": list(w.notes)}
    for _ in range(10):  # caches, allocator and lazy modules settled before any clock
        last = w.fn()
    w.sync(last)
    truth = LoopTruth(w)
    truth.calibrate()
    first = s.reps - s.reps // 2
    truth.run(first)

    if w.kernel_truth is not None:
        w.kernel_truth.reset()
    info, methods = run_gpukeeper(ctx, w)
    kernel_ms = None
    if w.kernel_truth is not None:
        durations = w.kernel_truth.durations_us()
        if durations:
            kernel_ms = statistics.median(durations) / 1e3
            row["kernel_samples"] = len(durations)
    methods.append(run_do_bench(ctx, w))
    methods.append(run_torch_timer(ctx, w))
    truth.run(s.reps // 2)

    t = truth.summary()
    t["globaltimer_ms"] = kernel_ms
    for m in methods:
        m["vs_loop_pct"] = _pct(m["value_ms"], t["loop_ms"])
        m["vs_span_pct"] = _pct(m["value_ms"], t["span_ms"])
        m["vs_kernel_us"] = (None if kernel_ms is None or m["value_ms"] is None
                             else (m["value_ms"] - kernel_ms) * 1e3)
    row.update(truth=t, gpukeeper=info, methods=methods)
    if info.get("error"):
        row["status"], row["error"] = "error", f"gpukeeper: {info['error']}"
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

    def alternate(reps: int) -> None:
        # Eager and graph repetitions interleaved, so both see the same device state.
        for _ in range(reps):
            for t in truths.values():
                t.run(1)

    alternate(s.reps - s.reps // 2)
    row: Dict[str, Any] = {"case": "eager_vs_graph", "kind": "compare", "framework": "torch",
                           "description": f"compare_implementations(eager, cuda graph) of the {SMALL_OPS}-kernel "
                                          "region; speedup = eager / graph",
                           "status": "ok", "error": None, "notes": []}
    results = ctx.gk.compare_implementations(impls, **ctx.gk_kwargs())
    alternate(s.reps // 2)
    summaries = {k: t.summary() for k, t in truths.items()}
    truth_speedup = summaries["eager"]["loop_ms"] / summaries["cuda graph"]["loop_ms"]
    gk_speedup = results["cuda graph"].speedup
    methods = []
    for key in impls:
        info = gk_fields(ctx, results[key])
        m = _method(f"gpukeeper headline ({key})", info["headline_ms"],
                    f"bound {info['bound']}, device busy {_fmt_frac(info['device_busy'])}")
        m["vs_loop_pct"] = _pct(m["value_ms"], summaries[key]["loop_ms"])
        m["vs_span_pct"] = _pct(m["value_ms"], summaries[key]["span_ms"])
        m["vs_kernel_us"] = None
        m["gpukeeper"] = info
        methods.append(m)
    row.update(
        truth=summaries,
        methods=methods,
        speedup={"gpukeeper": gk_speedup, "loop_truth": truth_speedup,
                 "error_pct": _pct(gk_speedup, truth_speedup)},
    )
    return row


# --------------------------------------------------------------------- MD section


def _paired(runs: Dict[str, Callable[[], float]], pairs: int) -> Dict[str, List[float]]:
    """Each run ``pairs`` times, the order rotating every round, so that a drift of the
    device's speed (clocks, heat) falls on every run alike."""
    names = list(runs)
    out: Dict[str, List[float]] = {n: [] for n in names}
    for i in range(pairs):
        order = names[i % len(names):] + names[:i % len(names)]
        for n in order:
            out[n].append(runs[n]())
    return out


def _md_row(case: str, description: str) -> Dict[str, Any]:
    return {"case": case, "kind": "md", "description": description, "status": "ok", "error": None, "notes": []}


def _ns_day(steps: int, dt_fs: float, seconds: float) -> float:
    return steps * dt_fs * 1e-6 * 86400.0 / seconds


def _md_summary(row: Dict[str, Any], got: Dict[str, List[float]], keys: List[str]) -> None:
    gk = got["gpukeeper"]
    row["ns_per_day"] = got
    row["ratios"] = {}
    for key in keys:
        ratios = [a / b for a, b in zip(gk, got[key])]
        row["ratios"][key] = {"pairs": ratios, "median": statistics.median(ratios),
                              "error_pct": (statistics.median(ratios) - 1) * 100}


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

    def plain() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = None
        for x in inputs:
            out = step(x)  # kept until the next step, as an integrator keeps its forces
        out = None  # noqa: F841
        torch.cuda.synchronize()
        return _ns_day(len(inputs), dt_fs, time.perf_counter() - t0)

    last: Dict[str, Any] = {}

    def measured() -> float:
        res = ctx.gk.benchmark_md_trajectory(step, inputs, warmup_steps=5, timestep_fs=dt_fs, n_atoms=atoms)
        last["res"] = res
        return float(res.ns_per_day)

    got = _paired({"wall": plain, "gpukeeper": measured}, s.md_pairs)
    _md_summary(row, got, ["wall"])
    res = last["res"]
    row["config"] = {"atoms": atoms, "steps": len(inputs), "timestep_fs": dt_fs, "pairs": s.md_pairs}
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
    steps = s.openmm_steps

    def step(_: Any) -> None:
        integrator.step(1)

    def synchronize() -> None:
        context.getState()  # a download from the device: waits for the queued steps

    for _ in range(50):
        step(None)
    synchronize()

    def plain() -> float:
        synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step(None)
        synchronize()
        return _ns_day(steps, dt_fs, time.perf_counter() - t0)

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

    got = _paired({"wall": plain, "gpukeeper": measured, "openmm": openmm_own}, s.md_pairs)
    _md_summary(row, got, ["wall", "openmm"])
    res = last["res"]
    row["config"] = {"particles": side ** 3, "steps": steps, "timestep_fs": dt_fs, "rounds": s.md_pairs,
                     "openmm": mm.__version__}
    row["gpukeeper"] = {"throughput_source": getattr(res, "throughput_source", None),
                        "timing_method": getattr(res, "timing_method", None),
                        "synchronized": getattr(res, "synchronized", None),
                        "median_step_ms": res.median_ms, "warnings": list(res.warnings)}
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
        what = (f"loop truth {_fmt_ms(t['loop_ms'])} ms, gpukeeper {_fmt_ms(head.get('value_ms'))} ms "
                f"({_fmt_pct(head.get('vs_loop_pct'))} %), device {_fmt_ms(g.get('device_median_ms'))} ms, "
                f"bound {g.get('bound')}, busy {_fmt_frac(g.get('device_busy'))}")
    elif kind == "compare":
        sp = row["speedup"]
        what = (f"speedup: loop truths {_fmt_num(sp['loop_truth'], '.3f')}, gpukeeper "
                f"{_fmt_num(sp['gpukeeper'], '.3f')} ({_fmt_pct(sp['error_pct'])} %)")
    elif kind == "md":
        what = ", ".join(f"gpukeeper/{k} median {_fmt_num(r['median'], '.4f')}" for k, r in row["ratios"].items())
    print(f"   ok in {row['seconds']:.1f} s: {what}", flush=True)


def _release(ctx: Context) -> None:
    gc.collect()
    if ctx.cuda:
        try:
            ctx.torch.cuda.synchronize()
            ctx.torch.cuda.empty_cache()
        except Exception:  # a case that broke the device is reported in its own row
            pass


# --------------------------------------------------------------------- targets


def _target(name: str, case: str, error: Optional[float], limit: float, unit: str) -> Dict[str, Any]:
    if error is None:
        return {"target": name, "case": case, "error": None, "limit": limit, "unit": unit, "margin": None,
                "met": None, "verdict": "not measured"}
    margin = limit - abs(error)
    return {"target": name, "case": case, "error": error, "limit": limit, "unit": unit, "margin": margin,
            "met": margin >= 0, "verdict": "met" if margin >= 0 else "missed"}


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
            head = methods.get("gpukeeper headline", {}).get("vs_loop_pct") if ok else None
            if bound == "device":
                out.append(_target("headline vs loop truth (device-bound)", case, head,
                                   HEADLINE_DEVICE_BOUND_LIMIT_PCT, "%"))
            else:
                out.append(_target("headline vs loop truth", case, head, HEADLINE_LIMIT_PCT, "%"))
            if case.startswith("spin_"):
                dev = methods.get("gpukeeper device", {}).get("vs_kernel_us") if ok else None
                out.append(_target("device time vs %globaltimer", case, dev, KERNEL_LIMIT_US, "us"))
        elif kind == "compare":
            err = (row.get("speedup") or {}).get("error_pct") if ok else None
            out.append(_target("speedup vs loop truths' speedup", case, err, SPEEDUP_LIMIT_PCT, "%"))
        elif kind == "md":
            ratios = row.get("ratios") or {}
            keys = ["wall", "openmm"] if case == "md_openmm" else ["wall"]
            for key in keys:
                err = ratios.get(key, {}).get("error_pct") if ok else None
                out.append(_target(f"ns/day vs {key} ({'OpenMM speed' if key == 'openmm' else 'plain loop'})",
                                   case, err, MD_LIMIT_PCT, "%"))
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


def _tables(report: Dict[str, Any]) -> List[Tuple[str, List[str], List[List[str]]]]:
    """(title, header, rows) of each table, as text cells."""
    rows = report["rows"]
    timing = [r for r in rows if r.get("kind") == "timing"]
    cases_body, methods_body = [], []
    for r in timing:
        if r["status"] == "skipped":
            cases_body.append([r["case"], "-", "-", "-", "-", "-", "-", "-", f"skipped: {r['reason']}"])
            continue
        t, g = r.get("truth") or {}, r.get("gpukeeper") or {}
        notes = "; ".join(([f"ERROR {r['error']}"] if r.get("error") else []) + r.get("notes", []))
        cases_body.append([
            r["case"], _fmt_ms(t.get("loop_ms")),
            f"{t.get('calls_per_rep', '-')} x {t.get('reps', '-')}",
            "-" if t.get("loop_spread_pct") is None else f"{t['loop_spread_pct']:.2f}",
            _fmt_ms(t.get("span_ms")), _fmt_ms(t.get("globaltimer_ms")),
            str(g.get("bound") or "-"), _fmt_frac(g.get("device_busy")), notes])
        for m in r.get("methods", []):
            note = f"ERROR {m['error']}" if m.get("error") else m.get("note", "")
            methods_body.append([
                r["case"], m["method"], _fmt_ms(m.get("value_ms")), _fmt_pct(m.get("vs_loop_pct")),
                _fmt_pct(m.get("vs_span_pct")),
                "-" if m.get("vs_kernel_us") is None else f"{m['vs_kernel_us']:+.3f}", note])
    out = [
        ("cases and their truths (ms per call)",
         ["case", "loop truth", "calls x reps", "spread %", "span truth", "%globaltimer", "bound", "busy", "notes"],
         cases_body),
        ("methods against the truths",
         ["case", "method", "ms", "vs loop %", "vs span %", "vs kernel us", "note"], methods_body),
    ]
    compare = [r for r in rows if r.get("kind") == "compare"]
    if compare:
        body = []
        for r in compare:
            if r["status"] != "ok":
                body.append([r["case"], "-", "-", "-", "-", "-", r.get("reason") or f"ERROR {r.get('error')}"])
                continue
            sp, t = r["speedup"], r["truth"]
            body.append([r["case"], _fmt_num(sp["loop_truth"], ".3f"), _fmt_num(sp["gpukeeper"], ".3f"),
                         _fmt_pct(sp["error_pct"]),
                         _fmt_ms(t["eager"]["loop_ms"]), _fmt_ms(t["cuda graph"]["loop_ms"]),
                         "; ".join(f"{m['method']} {_fmt_pct(m['vs_loop_pct'])} % vs its loop truth"
                                   for m in r["methods"])])
        out.append(("eager vs CUDA graph",
                    ["case", "truth speedup", "gpukeeper speedup", "error %", "eager ms", "graph ms", "notes"], body))
    md = [r for r in rows if r.get("kind") == "md"]
    if md:
        body = []
        for r in md:
            if r["status"] != "ok":
                body.append([r["case"], "-", "-", "-", "-", r.get("reason") or f"ERROR {r.get('error')}"])
                continue
            ns = r["ns_per_day"]
            for key, ratio in r["ratios"].items():
                body.append([r["case"], key, " ".join(f"{v:.4g}" for v in ns["gpukeeper"]),
                             " ".join(f"{v:.4g}" for v in ns[key]),
                             " ".join(f"{v:.4f}" for v in ratio["pairs"]),
                             f"median {ratio['median']:.4f} ({_fmt_pct(ratio['error_pct'])} %)"])
        out.append(("MD: gpukeeper's ns/day against the plain loop (and OpenMM's speed)",
                    ["case", "against", "gpukeeper ns/day", "reference ns/day", "ratios", "ratio"], body))
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
        print(f"  {t['verdict']:12s}  {t['target']} [{t['case']}]: |{t['error']:+.3f}| {t['unit']} {rel} "
              f"{t['limit']:g} {t['unit']} (margin {t['margin']:+.3f} {t['unit']})")
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
    ap.add_argument("--reps", type=int, help="repetitions of each loop truth (default 7, --quick 3)")
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
    settings = Settings.make(a.quick, a.reps)
    ctx = Context(settings)
    started = time.perf_counter()
    print(f"timing truth: {len(a.case_names)} case(s), {settings.reps} repetitions per loop truth"
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
                   "md_pairs": settings.md_pairs, "cases": a.case_names},
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
